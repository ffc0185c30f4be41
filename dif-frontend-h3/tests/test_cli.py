"""`dif h3 generate` / `dif h3 info` through the real `dif` command (this frontend and the CPU backend
registered in-process) on the embedded tiny checkpoint: latents out, refusals before any work with
nothing written, the info document."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dif.plugins import isolated_plugins, register_plugin
from dif.telemetry import validate_document
from dif.weights import open_safetensors
from dif_frontend_h3 import DEFAULT_CHECKPOINT, plugin


@pytest.fixture
def dif_cli() -> Iterator[Callable[..., Any]]:
    cpu = pytest.importorskip("dif_backend_cpu.plugin", reason="needs dif-backend-cpu")
    dif_tools = pytest.importorskip("dif_tools.cli", reason="needs dif-tools")
    with isolated_plugins(""):
        register_plugin(cpu, "cpu")
        register_plugin(plugin, "h3")
        runner = CliRunner()

        def invoke(*args: str, ok: bool = True) -> Any:
            result = runner.invoke(dif_tools.build_cli(), list(args))
            if ok:
                assert result.exit_code == 0, result.output
            return result

        yield invoke


def test_latents_only_run(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    lat = tmp_path / "lat.safetensors"
    args = ("h3", "generate", "-p", "waves on a beach", "--frames", "22", "-W", "96", "-H", "64", "--steps", "3",
            "--seed", "4", "--backend", "cpu", "--latents-only", "--save-latents", str(lat), "--json")  # fmt: skip
    res = dif_cli(*args)
    doc = json.loads(res.stdout)
    validate_document(doc)
    assert doc["kind"] == "h3.generate" and doc["data"]["seed"] == 4 and doc["data"]["frames"] == 22
    src = open_safetensors(lat)
    video, audio = src["video_latents"], src["audio_latents"]
    assert video.shape == (1, 24, 7, 4, 6)  # 22 frames -> 7 latent frames, 64x96 -> 4x6
    assert audio.shape == (2, 32, round(22 / 24 * 40))
    assert np.isfinite(video).all() and not np.allclose(video, src["video_noise"])
    again = tmp_path / "again.safetensors"
    dif_cli(*[a if a != str(lat) else str(again) for a in args])
    np.testing.assert_array_equal(open_safetensors(again)["video_latents"], video)  # the seed reproduces the run


@pytest.mark.oracle
def test_rng_torch_cpu_draws_torchs_video_then_audio_noise(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    """`--rng torch-cpu --seed 4`: the saved noise is torch.Generator().manual_seed(4)'s video draw, then its
    audio draw (the modular pipeline's order), and the JSON report names the generator."""
    torch = pytest.importorskip("torch")
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("dif's torch-cpu stream models torch's AVX2 kernels (this torch runs another build)")
    lat = tmp_path / "lat.safetensors"
    res = dif_cli("h3", "generate", "-p", "waves", "--frames", "22", "-W", "96", "-H", "64", "--steps", "2",
                  "--seed", "4", "--rng", "torch-cpu", "--backend", "cpu", "--latents-only", "--save-latents",
                  str(lat), "--json")  # fmt: skip
    assert json.loads(res.stdout)["data"]["rng"] == "torch-cpu"
    src = open_safetensors(lat)
    gen = torch.Generator().manual_seed(4)
    video = torch.randn(src["video_noise"].shape, generator=gen).numpy()
    audio = torch.randn(src["audio_noise"].shape, generator=gen).numpy()
    np.testing.assert_array_equal(src["video_noise"], video)
    np.testing.assert_array_equal(src["audio_noise"], audio)


@pytest.mark.parametrize(
    "args, message",
    [
        (("--frames", "23"), "17n + 5 frames"),
        (("--frames", "4"), "17n + 5 frames"),
        (("-W", "100"), "multiples of 32"),
        (("-H", "48"), "multiples of 32"),
        (("--fps", "30"), "24 fps only"),
        (("-p", ""), "prompt is empty"),
    ],
)
def test_bad_requests_refused_nothing_written(dif_cli: Callable[..., Any], tmp_path: Path, args: tuple[str, ...],
                                              message: str) -> None:  # fmt: skip
    out = tmp_path / "v.mp4"
    base = ["h3", "generate", "-p", "a cat", "--frames", "22", "-W", "96", "-H", "64", "--steps", "2", "-o", str(out)]
    res = dif_cli(*base, *args, ok=False)
    assert res.exit_code != 0 and message in res.output
    assert "Traceback" not in res.output
    assert list(tmp_path.iterdir()) == []


def test_missing_audio_vae_refused_nothing_written(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    model = tmp_path / "model"
    shutil.copytree(DEFAULT_CHECKPOINT, model)
    shutil.rmtree(model / "audio_vae", ignore_errors=True)
    out = tmp_path / "out"
    out.mkdir()
    res = dif_cli("h3", "generate", "-p", "a cat", "-m", str(model), "--steps", "2", "-o", str(out / "v.mp4"), ok=False)
    assert res.exit_code != 0 and "no audio_vae/ folder" in res.output and "Traceback" not in res.output
    assert list(out.iterdir()) == []


def test_info_default_and_published(dif_cli: Callable[..., Any]) -> None:
    doc = json.loads(dif_cli("h3", "info", "--json").stdout)
    validate_document(doc)
    assert doc["data"]["defaults"]["frames"] == 22 and doc["data"]["text_encoder"]["tap"] == 3
    text = dif_cli("h3", "info", "--variant", "h3").stdout
    assert "blocks 50" in text and "tap 50" in text and "124 frames 1344x768 @ 24 fps" in text
