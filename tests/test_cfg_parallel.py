"""CFG-parallel end to end on the CPU (issue 22): the tiny FLUX.2 klein made a base checkpoint (its embedded
folder with `is_distilled: false`, so CFG runs), split over two ranks, equals one process exactly in fp32;
`dif flux2 generate --gpus 2 --backend cpu` (two rank processes over loopback TCP) writes the image
`--gpus 1` writes; the refusals (`--gpus 0`, too many ranks, CFG off, a distilled checkpoint) write nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dif.media import read_png_metadata
from dif.parallel.cfg import CfgParallel
from dif.parallel.host import HostCommunicator
from dif.parallel.launch import RankEnv, free_port

flux2 = pytest.importorskip("dif_frontend_flux2", reason="checked on the tiny FLUX.2 klein")
cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli

from dif_frontend_flux2 import DEFAULT_CHECKPOINT  # noqa: E402
from dif_frontend_flux2.pipeline import GenerationRequest  # noqa: E402
from dif_frontend_flux2.plugin import INFO  # noqa: E402

RUN = ("-p", "a red fox", "-n", "blurry", "-W", "32", "-H", "32", "--steps", "2", "--guidance", "4", "--seed", "5")


@pytest.fixture(scope="module")
def base_klein(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded tiny klein as a base (CFG) checkpoint: its files linked, model_index.json rewritten."""
    root = tmp_path_factory.mktemp("klein-base") / "klein-base"
    root.mkdir()
    for part in DEFAULT_CHECKPOINT.iterdir():
        if part.name != "model_index.json":
            (root / part.name).symlink_to(part)
    index = json.loads((DEFAULT_CHECKPOINT / "model_index.json").read_text())
    (root / "model_index.json").write_text(json.dumps({**index, "is_distilled": False}))
    return root


def split_equals_one_device(pipeline: Any, req: Any) -> None:
    """`req` on two ranks (threads, one pipeline each as per process, over loopback TCP) equals one device."""
    want = pipeline().generate(req)
    assert want.settings["cfg"] is True and "parallel" not in want.settings
    port, runs, errors = free_port(), [None, None], []

    def rank(r: int) -> None:
        try:
            pipe = pipeline()
            with HostCommunicator.connect(RankEnv(r, 2, r, "127.0.0.1", port), timeout_s=60) as comm:
                pipe.cfg_parallel = CfgParallel(r, comm)
                runs[r] = pipe.generate(req)
        except Exception as exc:
            errors.append(exc)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    for got in runs:
        assert got is not None
        assert np.array_equal(got.latents, want.latents) and np.array_equal(got.pixels, want.pixels)
        assert got.settings == {**want.settings, "parallel": CfgParallel(0, None).record()}


def test_cfg_parallel_klein_base_equals_one_device_exactly(base_klein: Path) -> None:
    req = GenerationRequest("a red fox", negative_prompt="blurry", steps=2, guidance=4.0, seed=5, width=32, height=32)
    split_equals_one_device(lambda: INFO.pipeline(base_klein, backend="cpu", dtype="f32"), req)


def test_cfg_parallel_krea2_equals_one_device_exactly() -> None:
    """Krea 2's combine rule is the other one (v_c + g (v_c - v_u)); the embedded Turbo runs CFG at guidance > 0."""
    krea2 = pytest.importorskip("dif_frontend_krea2.plugin", reason="checked on the tiny Krea 2 as well")
    from dif_frontend_krea2.pipeline import GenerationRequest as Krea2Request

    req = Krea2Request("a red fox", negative_prompt="ugly", steps=2, guidance=3.0, seed=2, width=32, height=32)
    info = krea2.INFO
    split_equals_one_device(lambda: info.pipeline(info.default_checkpoint, backend="cpu", dtype="f32"), req)


def dif(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The real `dif` command in a new process (so `--gpus 2` can start this command again as its ranks)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    return subprocess.run(
        [sys.executable, "-m", "dif_tools", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=240
    )


def test_generate_gpus_2_on_cpu_writes_the_one_gpu_image(base_klein: Path, tmp_path: Path) -> None:
    one, two = tmp_path / "one.png", tmp_path / "two.png"
    common = ("flux2", "generate", "-m", str(base_klein), *RUN, "--backend", "cpu")
    first = dif(*common, "--gpus", "1", "-o", str(one), cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    split = dif(*common, "--gpus", "2", "--json", "-o", str(two), cwd=tmp_path)
    assert split.returncode == 0, split.stderr
    doc = json.loads(split.stdout)  # one document: rank 1 prints nothing
    assert doc["data"]["output"] == str(two)
    assert doc["data"]["settings"]["parallel"] == {"mode": "cfg", "degree": 2, "branches": {"0": "cond", "1": "uncond"}}
    from PIL import Image

    with Image.open(one) as a, Image.open(two) as b:
        assert np.array_equal(np.asarray(a), np.asarray(b))
    meta_one, meta_two = read_png_metadata(one), read_png_metadata(two)
    assert meta_one["parameters"] == meta_two["parameters"]
    assert {k: v for k, v in meta_two["dif"].items() if k != "parallel"} == meta_one["dif"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["one.png", "two.png"]  # rank 1 wrote nothing


def test_generate_under_torchrun_equals_one_process(base_klein: Path, tmp_path: Path) -> None:
    """torchrun's ranks (its agent's store on MASTER_PORT: dif meets on the next port) write the same image.
    torchrun sets OMP_NUM_THREADS=1, and a BLAS rounds differently on another thread count: the one-process
    run here uses one thread too."""
    pytest.importorskip("torch.distributed.run", reason="torchrun comes with torch")
    one, two = tmp_path / "one.png", tmp_path / "two.png"
    args = ("flux2", "generate", "-m", str(base_klein), *RUN, "--backend", "cpu")
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["OMP_NUM_THREADS"] = "1"
    command = [sys.executable, "-m", "dif_tools", *args, "-o", str(one)]
    base = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, timeout=240)
    assert base.returncode == 0, base.stderr
    torchrun = ("-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "dif_tools")
    split = subprocess.run(
        [sys.executable, *torchrun, *args, "--gpus", "2", "-o", str(two)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240,
    )  # fmt: skip
    assert split.returncode == 0, split.stderr
    assert split.stdout.count("wrote ") == 1 and "on 2 ranks" in split.stdout
    from PIL import Image

    with Image.open(one) as a, Image.open(two) as b:
        assert np.array_equal(np.asarray(a), np.asarray(b))


def run(*args: str) -> Any:
    return CliRunner().invoke(cli, ["flux2", "generate", *args])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--gpus", "0"), "0 is not in the range x>=1"),
        (("--gpus", "3"), "--gpus 3: generate splits a run over 2 ranks"),
        (("--gpus", "2", "--guidance", "1"), "CFG is off for this run (guidance 1"),
    ],
)
def test_generate_gpus_refusals_write_nothing(base_klein: Path, tmp_path: Path, args: Any, message: str) -> None:
    out = tmp_path / "x.png"
    result = run("-m", str(base_klein), *RUN, "--backend", "cpu", *args, "-o", str(out))  # the last --guidance wins
    assert result.exit_code != 0 and message in result.output, result.output
    assert list(tmp_path.iterdir()) == []


def test_generate_gpus_2_on_a_distilled_checkpoint_is_refused(tmp_path: Path) -> None:
    out = tmp_path / "x.png"
    result = run(*RUN, "--backend", "cpu", "--gpus", "2", "-o", str(out))  # the embedded klein: step-distilled
    assert result.exit_code != 0 and "CFG is off for this run" in result.output, result.output
    assert list(tmp_path.iterdir()) == []
