"""Issue 14 through `dif krea2 generate` on the embedded checkpoint: absurd sizes refused before the noise
is drawn, NaN weights named, an absurd config named by its key, a long prompt's cut warned, Ctrl-C."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.serialize.diftensor import save_tensors
from dif.weights import open_safetensors
from dif_frontend_krea2 import DEFAULT_CHECKPOINT

cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
SMALL = ["-W", "32", "-H", "32", "--steps", "2", "--seed", "1"]


def run(*args: str) -> object:
    return CliRunner().invoke(cli, ["krea2", "generate", *args])


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(DEFAULT_CHECKPOINT, root)
    return root


def test_65536_squared_is_refused_before_drawing_noise(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dif.host
    import dif_frontend_krea2.pipeline as pipeline

    monkeypatch.setattr(dif.host, "available_memory_bytes", lambda: 16 << 30)  # the same answer on every host

    def no_noise(*args: object, **kwargs: object) -> None:
        raise AssertionError("noise was drawn before the size was admitted")

    monkeypatch.setattr(pipeline, "initial_latents", no_noise)
    out = tmp_path / "out.png"
    start = time.perf_counter()
    result = run("-p", "x", "-W", "65536", "-H", "65536", "-o", str(out))
    assert time.perf_counter() - start < 20
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert "image size 65536x65536 needs at least 74.00 GiB of host memory" in result.stderr
    assert "(16777216 latent tokens x 64 channels, 4294967296 pixels), but 16.00 GiB is available" in result.stderr
    assert not out.exists()


def test_on_a_host_with_room_for_the_noise_the_plan_refuses_it_first(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A host that could hold the 74 GiB of arrays passes the host check; the programs' plans then refuse the
    size (the denoiser's activations alone are far beyond any budget), still before any noise is drawn."""
    import dif.host
    import dif_frontend_krea2.pipeline as pipeline

    monkeypatch.setattr(dif.host, "available_memory_bytes", lambda: 1 << 50)  # a petabyte: admits the arrays

    def no_noise(*args: object, **kwargs: object) -> None:
        raise AssertionError("noise was drawn before the plans admitted the size")

    monkeypatch.setattr(pipeline, "initial_latents", no_noise)
    out = tmp_path / "out.png"
    result = run("-p", "x", "-W", "65536", "-H", "65536", "--backend", "cpu", "--vram-budget", "8GiB", "-o", str(out))
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert "within the memory budget of 8589934592 B" in result.stderr and "does not fit" in result.stderr
    assert not out.exists()


def test_nan_vae_weights_are_refused_naming_the_tensor(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    (path,) = (root / "vae").glob("*.safetensors")
    source = open_safetensors(path)
    arrays = {n: np.array(source[n]) for n in source.names()}
    name = "decoder.conv_out.weight"
    arrays[name][...] = np.inf  # all of it: the decoder reads one temporal tap of the 3D kernel
    del source
    path.unlink()
    save_tensors(path, arrays, dif_metadata=False)
    out = tmp_path / "out.png"
    result = run("-m", str(root), "-p", "x", *SMALL, "-o", str(out))
    assert result.exit_code == 1, result.output
    assert f"'{name}' in {path}" in result.stderr and "NaN / infinite" in result.stderr
    assert not out.exists()


def test_an_absurd_head_count_names_the_config_key(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    config = root / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "num_attention_heads": 16_000_000_000}))
    result = run("-m", str(root), "-p", "x", *SMALL, "-o", str(tmp_path / "out.png"))
    assert result.exit_code == 1, result.output
    assert "transformer/config.json" in result.stderr
    assert "num_attention_heads=16000000000 is more than 16777216" in result.stderr


def test_a_long_prompt_is_cut_with_a_warning_giving_the_counts(tmp_path: Path) -> None:
    out = tmp_path / "out.png"
    result = run("-p", "fox " * 1000, *SMALL, "-o", str(out))
    assert result.exit_code == 0, result.output
    (line,) = [ln for ln in result.stderr.splitlines() if "tokens" in ln]
    assert line.startswith("warning: prompt is ") and "the text encoder takes 507: the last" in line
    count = int(line.split()[3])
    assert count >= 1000 and f"the last {count - 507} are ignored" in line


def test_ctrl_c_in_a_stage_exits_130_and_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dif_frontend_krea2.pipeline import Krea2Pipeline

    def interrupted(self: object, *args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Krea2Pipeline, "denoise", interrupted)
    out = tmp_path / "out.png"
    result = run("-p", "x", *SMALL, "-o", str(out))
    assert result.exit_code == 130 and "dif krea2: interrupted in the denoise stage" in result.stderr, result.output
    assert list(tmp_path.iterdir()) == []
