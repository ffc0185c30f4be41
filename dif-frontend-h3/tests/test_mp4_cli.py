"""`dif h3 generate` on the embedded tiny checkpoint writes an MP4 that decodes with both streams: the frame
count asked for, duration frames / 24 (within one frame), round(frames * 32000 / 24) audio samples per
channel, stereo at 32 kHz, the prompt and settings in the container; run twice with one seed, the same
frames."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dif.plugins import isolated_plugins, register_plugin
from dif_frontend_h3 import plugin

pytest.importorskip("av", reason="MP4 needs PyAV")

from dif.media.mp4 import read_mp4  # noqa: E402


@pytest.fixture
def dif_cli() -> Iterator[Callable[..., Any]]:
    cpu = pytest.importorskip("dif_backend_cpu.plugin", reason="needs dif-backend-cpu")
    dif_tools = pytest.importorskip("dif_tools.cli", reason="needs dif-tools")
    with isolated_plugins(""):
        register_plugin(cpu, "cpu")
        register_plugin(plugin, "h3")
        runner = CliRunner()

        def invoke(*args: str) -> Any:
            result = runner.invoke(dif_tools.build_cli(), list(args))
            assert result.exit_code == 0, result.output
            return result

        yield invoke


def test_mp4_has_both_streams(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    frames = 39  # 12 latent frames: two temporal chunks of the video VAE, cross-faded
    out = tmp_path / "clip.mp4"
    prompt = "rain on a tin roof, a dog barks"
    dif_cli("h3", "generate", "-p", prompt, "--frames", str(frames), "--seed", "12", "--backend", "cpu", "-o", str(out))
    got = read_mp4(out)
    assert got["frames"].shape == (frames, 96, 128, 3)  # the embedded checkpoint's canvas
    assert got["fps"] == 24 and abs(got["duration"] - frames / 24) <= 1 / 24 + 1e-9
    assert got["sample_rate"] == 32000
    assert got["audio"].shape == (2, round(frames * 32000 / 24))
    assert got["dif"]["dif"]["prompt"] == prompt and got["dif"]["dif"]["seed"] == 12
    assert prompt in got["parameters"] and "Seed: 12" in got["parameters"]
    assert got["frames"].std() > 1.0  # decoded content, not a constant frame
    assert [p.name for p in tmp_path.iterdir()] == ["clip.mp4"]


def test_same_seed_same_video(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    runs = []
    for name in ("a.mp4", "b.mp4"):
        dif_cli("h3", "generate", "-p", "a bell rings", "--seed", "3", "--backend", "cpu", "-o", str(tmp_path / name))
        runs.append(read_mp4(tmp_path / name))
    np.testing.assert_array_equal(runs[0]["frames"], runs[1]["frames"])
    np.testing.assert_array_equal(runs[0]["audio"], runs[1]["audio"])
    assert runs[0]["frames"].shape[0] == 22  # the embedded checkpoint's default
