"""Issue 14 through `dif flux2 generate` on the embedded checkpoint: every failure is named, before the
work where it can be, and leaves no file behind (NaN weights and noise, absurd sizes, an absurd config,
an unwritable output, a long prompt, Ctrl-C)."""

from __future__ import annotations

import json
import os
import shutil
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.serialize.diftensor import save_tensors
from dif.weights import open_safetensors
from dif_frontend_flux2 import DEFAULT_CHECKPOINT

cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
SMALL = ["-W", "32", "-H", "32", "--steps", "2", "--seed", "1"]


def run(*args: str) -> object:
    return CliRunner().invoke(cli, ["flux2", "generate", *args])


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "ckpt"
    shutil.copytree(DEFAULT_CHECKPOINT, root)
    return root


def _poison(root: Path, component: str, tensor: str | None = None) -> str:
    """Set three values of one tensor of `component` to NaN; returns its name."""
    (path,) = (root / component).glob("*.safetensors")
    source = open_safetensors(path)
    arrays = {n: np.array(source[n]) for n in source.names()}
    name = tensor or sorted(n for n in arrays if arrays[n].dtype.kind == "f")[0]
    arrays[name].reshape(-1)[:3] = np.nan
    del source
    path.unlink()
    save_tensors(path, arrays, dif_metadata=False)
    return name


def test_nan_weights_are_refused_naming_the_tensor_and_nothing_is_written(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    name = _poison(root, "transformer")
    out = tmp_path / "out.png"
    result = run("-m", str(root), "-p", "x", *SMALL, "-o", str(out))
    assert result.exit_code == 1, result.output
    assert f"'{name}' in {root / 'transformer'}" in result.output and "3 of" in result.output
    assert "--allow-nonfinite-weights" in result.output and "Traceback" not in result.output
    assert not out.exists()


def test_allowed_nan_weights_warn_then_the_finite_check_stops_the_run(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _poison(root, "transformer", "x_embedder.weight")  # the first layer of the denoiser: NaN at step 1
    out = tmp_path / "out.png"
    result = run("-m", str(root), "-p", "x", *SMALL, "-o", str(out), "--allow-nonfinite-weights")
    assert result.exit_code == 1, result.output
    assert "warning: program 'flux2_transformer': 1 weight tensor(s) hold NaN" in result.stderr
    assert "denoiser output at step 1 of 2 has non-finite values" in result.stderr
    assert not out.exists()
    # --no-check-finite: the old behaviour, on purpose (a garbage image, exit 0)
    result = run("-m", str(root), "-p", "x", *SMALL, "-o", str(out), "--allow-nonfinite-weights", "--no-check-finite")
    assert result.exit_code == 0, result.output
    assert out.is_file()


def test_nan_text_encoder_weights_stop_at_the_text_features(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _poison(root, "text_encoder", "model.layers.0.input_layernorm.weight")  # every token passes it
    out = tmp_path / "out.png"
    result = run("-m", str(root), "-p", "x", *SMALL, "-o", str(out), "--allow-nonfinite-weights")
    assert result.exit_code == 1 and "text features has non-finite values" in result.stderr, result.output
    assert not out.exists()


def test_a_nan_noise_file_is_refused_naming_the_file(tmp_path: Path) -> None:
    noise_path, out = tmp_path / "noise.safetensors", tmp_path / "out.png"
    save_tensors(noise_path, {"noise": np.full((1, 128, 2, 2), np.nan, np.float32)}, dif_metadata=False)
    result = run("-p", "x", *SMALL, "--init-noise", str(noise_path), "-o", str(out))
    assert result.exit_code == 1, result.output
    assert f"{noise_path}: tensor 'noise' has 512 NaN / infinite values of 512" in result.stderr
    assert not out.exists()


@pytest.mark.parametrize("side", ["65536", "16384"])
def test_absurd_sizes_are_refused_before_any_work(tmp_path: Path, side: str) -> None:
    out = tmp_path / "out.png"
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)  # the schedule used to warn "invalid value in divide"
        result = run("-p", "x", "-W", side, "-H", side, "-o", str(out))
    assert time.perf_counter() - start < 20  # no 8 GiB noise, no programs built
    assert result.exit_code != 0 and "Traceback" not in result.output, result.output
    assert (
        f"image size {side}x{side}" in result.stderr and "beyond this checkpoint's sampling schedule" in result.stderr
    )
    assert "above 521451 tokens at 4 steps" in result.stderr and "at most about" in result.stderr
    assert not out.exists()


def test_an_absurd_head_count_names_the_config_key(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    config = root / "transformer" / "config.json"
    config.write_text(json.dumps({**json.loads(config.read_text()), "num_attention_heads": 16_000_000_000}))
    result = run("-m", str(root), "-p", "x", *SMALL, "-o", str(tmp_path / "out.png"))
    assert result.exit_code == 1, result.output
    assert f"{config}: Flux2 transformer config: num_attention_heads=16000000000 is more than" in result.stderr
    assert "param" not in result.stderr  # not a parameter shape


def test_a_huge_head_product_names_both_keys(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    config = root / "transformer" / "config.json"
    data = json.loads(config.read_text())
    config.write_text(json.dumps({**data, "num_attention_heads": 1 << 20, "attention_head_dim": 1 << 20}))
    result = run("-m", str(root), "-p", "x", *SMALL, "-o", str(tmp_path / "out.png"))
    assert result.exit_code == 1, result.output
    assert "num_attention_heads=1048576 x attention_head_dim=1048576 = 1099511627776 is more than" in result.stderr


def test_an_unwritable_output_is_refused_before_loading(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dif_frontend_flux2.weights as weights

    def no_loading(*args: object, **kwargs: object) -> None:
        raise AssertionError("the checkpoint was opened before the output was checked")

    monkeypatch.setattr(weights, "open_checkpoint", no_loading)
    locked = tmp_path / "locked"
    locked.mkdir()
    real_access = os.access
    # root may write anywhere: make the folder read-only and answer access() as a user would
    locked.chmod(0o555)
    monkeypatch.setattr(os, "access", lambda p, mode, **kw: Path(p) != locked and real_access(p, mode, **kw))
    try:
        for flag, target in (("-o", locked / "out.png"), ("--save-latents", locked / "lat.safetensors")):
            args = ["-p", "x", *SMALL, "-o", str(tmp_path / "ok.png")]
            result = run(*args, flag, str(target))
            assert result.exit_code == 2, result.output
            assert f"folder {locked} is not writable" in result.output and str(target) in result.output
    finally:
        locked.chmod(0o755)


def _embedded_text_rows() -> int:
    """The embedded checkpoint's text rows: its model_index.json's max_sequence_length (else klein's 512)."""
    import json

    from dif_frontend_flux2 import DEFAULT_CHECKPOINT

    index = json.loads((Path(DEFAULT_CHECKPOINT) / "model_index.json").read_text())
    return int(index.get("max_sequence_length", 512))


def test_a_long_prompt_is_cut_with_a_warning_giving_the_counts(tmp_path: Path) -> None:
    out = tmp_path / "out.png"
    result = run("-p", "fox " * 2000, *SMALL, "-o", str(out))
    assert result.exit_code == 0, result.output
    (line,) = [ln for ln in result.stderr.splitlines() if "tokens" in ln]
    rows = _embedded_text_rows()
    assert line.startswith("warning: prompt is ") and f"the text encoder takes {rows}: the last" in line
    count = int(line.split()[3])
    assert count > 2000 and f"the last {count - rows} are ignored" in line
    assert "prompt is" not in run("-p", "fox", *SMALL, "-o", str(out)).stderr  # a short one: no warning


def test_ctrl_c_mid_denoise_names_the_step_and_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dif.kit.sampling as sampling

    real = sampling.euler_step
    calls: list[int] = []

    def euler_step(*args: object) -> object:
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(sampling, "euler_step", euler_step)
    out = tmp_path / "out.png"
    result = run("-p", "x", *SMALL[:-4], "--steps", "3", "--seed", "1", "-o", str(out))
    assert result.exit_code == 130, result.output
    assert "dif flux2: interrupted in the denoise stage after step 1 of 3" in result.stderr
    assert list(tmp_path.iterdir()) == []


def test_ctrl_c_in_a_stage_exits_130_and_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dif_frontend_flux2.pipeline import Flux2Pipeline

    def interrupted(self: object, *args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(Flux2Pipeline, "decode", interrupted)  # after the whole denoising loop
    out, lat = tmp_path / "out.png", tmp_path / "lat.safetensors"
    result = run("-p", "x", *SMALL, "-o", str(out), "--save-latents", str(lat))
    assert result.exit_code == 130, result.output
    assert "dif flux2: interrupted in the decode stage" in result.stderr and "Traceback" not in result.output
    assert list(tmp_path.iterdir()) == []  # no PNG, no latents, no temp file
