"""What image commands share: stage timers and peak memory (dif.runstats), the progress bar
(dif.progress), checkpoint facts (dif.checkpoint), initial noise (dif.noise) and the run report
(dif.report)."""

from __future__ import annotations

import io
import json
import time
from pathlib import Path
from types import SimpleNamespace

import ml_dtypes
import numpy as np
import pytest

from dif.checkpoint import component_line, native_size, source_summary, storage_dtype
from dif.dtypes import DType
from dif.errors import UsageError
from dif.media import read_png_metadata
from dif.noise import gaussian_noise, initial_latents, load_noise_file
from dif.progress import ProgressBar
from dif.report import generation_summary, image_settings, png_parameters, save_image_run, summary_lines
from dif.runstats import StageTimer, peak_rss_bytes, stage_events
from dif.serialize.diftensor import load_tensors, save_tensors
from dif.weights import ArraySource, read_header

BF16 = np.dtype(ml_dtypes.bfloat16)


def test_stage_timer_records_finished_stages_only() -> None:
    heard: list[str] = []
    timer = StageTimer(lambda name, seconds: heard.append(name))
    with timer.stage("load"):
        pass
    with pytest.raises(RuntimeError), timer.stage("encode"):
        raise RuntimeError("boom")
    assert list(timer.timings) == ["load"] and heard == ["load"] and timer.timings["load"] >= 0
    events = stage_events({"load": 0.0015, "denoise": 2.0})
    assert events == [{"name": "stage.load", "ms": 1.5}, {"name": "stage.denoise", "ms": 2000.0}]
    assert peak_rss_bytes() > 1 << 20  # a Python process with numpy holds more than a MiB


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_progress_bar_is_silent_without_a_tty_or_in_json_mode() -> None:
    quiet, plain = io.StringIO(), _Tty()
    for stream, q in ((quiet, False), (plain, True)):
        with ProgressBar(quiet=q, stream=stream) as bar:
            bar.step(1, 2)
    assert quiet.getvalue() == "" and plain.getvalue() == ""
    shown = _Tty()
    with ProgressBar("denoise", stream=shown) as bar:
        bar.step(1, 2)
        bar.step(2, 2)
    assert "2/2" in shown.getvalue()


def _source(dtypes: list[np.dtype]) -> ArraySource:
    return ArraySource({f"t{i}": np.zeros(2, d) for i, d in enumerate(dtypes)}, "model.safetensors")


def test_storage_dtype_majority_and_first() -> None:
    mixed = _source([np.dtype(np.float32), BF16, BF16, np.dtype(np.int64)])
    assert storage_dtype(mixed) is DType.BF16  # fp32 norm gains next to bf16 matrices
    assert storage_dtype(mixed, by="first") is DType.F32
    assert storage_dtype(_source([np.dtype(np.int64)])) is DType.F32
    summary = source_summary(mixed)
    assert summary == {"tensors": 4, "bytes": 8 + 4 + 4 + 16, "dtypes": ["BF16", "F32", "I64"], "from": mixed.label}
    line = component_line("vae", {"z_dim": 16, **summary})
    assert line == "  vae: z_dim 16; 4 tensors, 0.0 MB BF16/F32/I64"


def test_native_size(tmp_path: Path) -> None:
    assert native_size(tmp_path) == 1024  # no vae/config.json
    (tmp_path / "vae").mkdir()
    for value, want in ((512, 512), (500, 1024), ("512", 1024), (-16, 1024)):
        (tmp_path / "vae" / "config.json").write_text(json.dumps({"sample_size": value}))
        assert native_size(tmp_path) == want, value
    (tmp_path / "vae" / "config.json").write_text("[]")
    assert native_size(tmp_path) == 1024


def _pack(x: np.ndarray) -> np.ndarray:
    b, c, h, w = x.shape
    return np.ascontiguousarray(x.reshape(b, c, h * w).transpose(0, 2, 1))


def test_initial_latents_from_seed_file_or_packed(tmp_path: Path) -> None:
    kw = {"unpacked": (1, 4, 2, 3), "packed": (1, 6, 4), "pack": _pack, "dtype": DType.BF16, "what": "48x32"}
    seeded = initial_latents(None, 7, **kw)  # type: ignore[arg-type]
    assert seeded.dtype == BF16 and seeded.shape == (1, 6, 4)
    np.testing.assert_array_equal(seeded, _pack(gaussian_noise((1, 4, 2, 3), 7)).astype(BF16))
    noise = gaussian_noise((4, 2, 3), 1)
    np.testing.assert_array_equal(initial_latents(noise, 0, **kw), _pack(noise[None]).astype(BF16))  # type: ignore[arg-type]
    packed = _pack(noise[None])
    np.testing.assert_array_equal(initial_latents(packed, 0, **kw), packed.astype(BF16))  # type: ignore[arg-type]
    with pytest.raises(UsageError, match=r"shape \[1, 4, 3, 3\]; for 48x32 it must be \[1, 4, 2, 3\]"):
        initial_latents(np.zeros((1, 4, 3, 3), np.float32), 0, **kw)  # type: ignore[arg-type]
    path = tmp_path / "n.safetensors"
    save_tensors(path, {"latents": packed, "other": packed}, dif_metadata=False)
    np.testing.assert_array_equal(load_noise_file(path), packed)
    save_tensors(path, {"a": packed, "b": packed}, dif_metadata=False)
    with pytest.raises(UsageError, match="holds 2 tensors"):
        load_noise_file(path)


SETTINGS = image_settings(
    prompt="a fox",
    negative_prompt="blurry",
    steps=4,
    guidance=1.0,
    cfg=False,
    seed=3,
    init_noise=False,
    width=64,
    height=48,
    dtype="bf16",
    mu=2.29117,
    model="tiny",
    backend="cpu",
    variant="turbo",
)


def test_image_settings_record_what_the_run_used() -> None:
    assert SETTINGS["negative_prompt"] == "" and SETTINGS["seed"] == 3 and SETTINGS["variant"] == "turbo"
    from_file = image_settings(**{**SETTINGS, "negative_prompt": "blurry", "cfg": True, "init_noise": True})
    assert from_file["seed"] is None and from_file["negative_prompt"] == "blurry"
    assert SETTINGS["sampler"] == "euler" and SETTINGS["scheduler"] == "simple" and SETTINGS["rng"] == "numpy"
    assert from_file["rng"] is None  # no generator drew the noise


def test_png_parameters_and_summary() -> None:
    text = png_parameters(SETTINGS, version="dif 0.1.0")
    assert text.splitlines()[0] == "a fox"
    # A1111 parsers split on ", ": no value may hold a comma (or be quoted for one)
    assert "Steps: 4, Sampler: Euler, Schedule type: Simple, Shift mu: 2.2912, CFG scale: 1.0" in text
    assert "Seed: 3, Size: 64x48, Model: tiny, RNG: NumPy PCG64, Version" in text and '"' not in text
    static = png_parameters({**SETTINGS, "mu": None}, version="v")
    assert "Schedule type: Simple, CFG scale" in static and "Shift mu" not in static
    other = png_parameters({**SETTINGS, "sampler": "dpm++2m", "scheduler": "karras", "rng": "torch-cpu"}, version="v")
    assert "Sampler: DPM++ 2M, Schedule type: Karras," in other and "RNG: CPU, Version" in other
    timings = {"load": 1.0, "encode": 0.5, "denoise": 2.0, "decode": 0.25, "save": 0.125}
    summary = generation_summary(
        output=Path("o.png"),
        latents=None,
        settings=SETTINGS,
        warnings=("w",),
        timings=timings,
        total_s=4.0,
        peak_rss_bytes=3 << 20,
        plan_peak_bytes=1 << 19,
    )
    assert summary["steps_per_s"] == 2.0 and summary["warnings"] == ["w"] and summary["latents"] is None
    lines = summary_lines(summary, model="tiny (turbo)")
    assert lines[0] == "wrote o.png  (64x48, 4 steps, no CFG, seed 3)"
    other = {**summary, "settings": {**SETTINGS, "sampler": "heun", "scheduler": "karras", "rng": "torch-cpu"}}
    assert (
        summary_lines(other, model="tiny")[0] == "wrote o.png  (64x48, 4 steps heun karras, no CFG, seed 3 (torch-cpu))"
    )
    assert lines[1] == (
        "  load 1.00 s | encode 0.50 s | denoise 2.00 s (2.00 it/s) | decode 0.25 s | save 0.12 s | total 4.00 s"
    )
    assert lines[2] == "  model tiny (turbo), bf16 on cpu; peak memory: process 3 MiB, largest plan 0.5 MiB"
    assert len(lines) == 3


def test_save_image_run_writes_png_latents_and_times_the_save(tmp_path: Path) -> None:
    latents = np.arange(6, dtype=np.float32).reshape(1, 3, 2)
    run = SimpleNamespace(
        pixels=np.zeros((48, 64, 3), np.uint8),
        latents=latents,
        noise=latents + 1,
        settings=SETTINGS,
        timings={"load": 0.1, "denoise": 0.5},
        warnings=(),
        peak_rss_bytes=1,
        plan_peak_bytes=2,
    )
    out, lat = tmp_path / "o.png", tmp_path / "l.safetensors"
    summary, timings = save_image_run(run, out, latents=lat, frontend="toy", version="9.9", started=time.perf_counter())
    assert list(timings) == ["load", "denoise", "save"] and summary["timings_s"]["save"] >= 0
    meta = read_png_metadata(out)
    assert meta["dif"]["generator"] == "dif-frontend-toy 9.9" and meta["dif"]["frontend"] == "toy"
    assert "Version: dif 9.9" in meta["parameters"] and meta["size"] == (64, 48)
    tensors, _ = load_tensors(lat)
    np.testing.assert_array_equal(tensors["latents"], latents)
    np.testing.assert_array_equal(tensors["noise"], latents + 1)
    assert read_header(lat)[1] == {"format": "pt"}  # a plain safetensors file: no dif keys
    assert summary["latents"] == str(lat) and summary["output"] == str(out)
