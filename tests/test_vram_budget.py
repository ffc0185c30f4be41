"""`--vram-budget` on the image commands, end to end on the CPU backend with the embedded tiny checkpoints.
The budget covers the whole pipeline (text encoder + denoiser + VAE together, `dif.plan.pipeline`): programs
that fit together stay resident; otherwise the text encoder is released before the denoiser, then one stage
at a time, and a program that still does not fit streams weights. Every way, the image is the unbudgeted one
(the CPU executor reads weights from the host either way)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dif.cli_support import parse_byte_size
from dif.errors import UsageError
from dif.plugins import isolated_plugins
from dif.telemetry import validate_document
from dif_tools.cli import build_cli


def _invoke(*args: str) -> Any:
    with isolated_plugins(None):
        return CliRunner().invoke(build_cli(), list(args), catch_exceptions=False)


def _generate(frontend: str, out: Path, *extra: str, size: int = 256) -> dict[str, Any]:
    # 256x256: the VAE decoder's arena makes it the largest program, larger than the text encoder (whose
    # one big embedding table cannot be streamed usefully), so capping just below it streams VAE weights
    args = ["-p", "a fox", "-W", str(size), "-H", str(size), "--steps", "2", "--seed", "4", "--dtype", "f32"]
    result = _invoke(frontend, "generate", *args, "--backend", "cpu", "-o", str(out), "--json", *extra)
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    validate_document(doc)
    return doc


def _pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im)


@pytest.mark.parametrize("frontend", ["flux2", "krea2"])
def test_a_budget_below_the_largest_program_streams_and_keeps_the_image(frontend: str, tmp_path: Path) -> None:
    free = _generate(frontend, tmp_path / "free.png")["data"]["memory"]
    assert free["vram_budget_bytes"] is None and free["streamed_params"] == 0 and free["params"] > 0
    programs = free["programs"]
    largest = max(programs, key=lambda name: programs[name]["min_memory_bytes"])
    cap = programs[largest]["min_memory_bytes"] - 1
    assert all(p["min_memory_bytes"] <= cap for name, p in programs.items() if name != largest)

    doc = _generate(frontend, tmp_path / "capped.png", "--vram-budget", str(cap))
    capped = doc["data"]["memory"]
    # per pipeline, the programs cannot all be resident under this cap: one stage at a time, the largest streamed
    assert capped["pipeline"]["cpu"]["strategy"] == "one-stage-at-a-time"
    assert capped["vram_budget_bytes"] == cap and capped["free_memory_bytes"] <= cap
    assert doc["runtime_budget"]["cpu"]["free_memory_bytes"] <= cap
    streamed = {name: p["streamed_params"] for name, p in capped["programs"].items()}
    assert streamed[largest] > 0 and capped["streamed_params"] == streamed[largest]
    assert capped["programs"][largest]["min_memory_bytes"] <= cap
    assert capped["streamed_bytes"] > 0 and capped["params"] == free["params"]
    np.testing.assert_array_equal(_pixels(tmp_path / "free.png"), _pixels(tmp_path / "capped.png"))


def test_the_text_summary_names_the_budget_and_what_streamed(tmp_path: Path) -> None:
    args = ["flux2", "generate", "-p", "x", "-W", "256", "-H", "256", "--steps", "1", "--seed", "1", "--dtype", "f32"]
    plain = _invoke(*args, "--backend", "cpu", "-o", str(tmp_path / "a.png"))
    assert plain.exit_code == 0, plain.output
    assert "memory budget" not in plain.stdout  # no budget, nothing streamed: no line
    roomy = _invoke(*args, "--backend", "cpu", "-o", str(tmp_path / "b.png"), "--vram-budget", "12GB")
    assert roomy.exit_code == 0, roomy.output
    # one budget for the pipeline (it said "per program" before the budget covered the programs together)
    assert re.search(r"memory budget 11\.18 GiB for the pipeline: all \d+ parameters resident", roomy.stdout)


def test_a_malformed_budget_is_a_usage_error(tmp_path: Path) -> None:
    for frontend in ("flux2", "krea2"):
        result = _invoke(frontend, "generate", "-p", "x", "-o", str(tmp_path / "a.png"), "--vram-budget", "12XB")
        assert result.exit_code == 2
        assert "Invalid value for '--vram-budget': '12XB' is not a memory size" in result.output


def test_a_budget_too_small_for_any_plan_says_so(tmp_path: Path) -> None:
    args = ["-p", "x", "-W", "48", "-H", "32", "--steps", "1", "--backend", "cpu", "-o", str(tmp_path / "a.png")]
    result = _invoke("flux2", "generate", *args, "--vram-budget", "4KiB")
    assert result.exit_code == 1
    assert "within the memory budget of 4096 B: program 'qwen3_text_encoder' does not fit" in result.output
    assert "raise --vram-budget" in result.output


@pytest.mark.parametrize(
    "text, nbytes",
    [("12GB", 12 * 10**9), ("12GiB", 12 * 2**30), ("12000MB", 12 * 10**9), ("4096", 4096), ("1.5 gib", 3 * 2**29),
     ("1.1GB", 1_100_000_000), (".5KiB", 512), ("7b", 7)],
)  # fmt: skip
def test_parse_byte_size(text: str, nbytes: int) -> None:
    assert parse_byte_size(text) == nbytes


@pytest.mark.parametrize("text", ["12XB", "GB", "", "-1GB", "1e9", "0", "0.1"])
def test_parse_byte_size_refuses(text: str) -> None:
    with pytest.raises(UsageError):
        parse_byte_size(text)


def _all_resident_sizes(frontend: str, tmp_path: Path, size: int = 256) -> tuple[dict[str, Any], np.ndarray]:
    """Each program's bytes with every weight resident (stage, all_resident_bytes), and the unbudgeted image."""
    free = _generate(frontend, tmp_path / "free.png", size=size)["data"]["memory"]
    assert free["pipeline"]["cpu"]["strategy"] == "all-resident" and free["releases"] == []
    return free["programs"], _pixels(tmp_path / "free.png")


@pytest.fixture
def releases(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The programs whose CPU executable `release()` was called, in order."""
    from dif_backend_cpu.executor import ArenaExecutable

    called: list[str] = []
    original = ArenaExecutable.release

    def spy(self: ArenaExecutable) -> None:
        called.append(self.program.name)
        original(self)

    monkeypatch.setattr(ArenaExecutable, "release", spy)
    return called


@pytest.mark.parametrize("frontend", ["flux2", "krea2"])
def test_a_budget_the_programs_fit_together_keeps_them_all_resident(
    frontend: str, tmp_path: Path, releases: list[str]
) -> None:
    programs, free_pixels = _all_resident_sizes(frontend, tmp_path)
    total = sum(p["all_resident_bytes"] for p in programs.values())
    doc = _generate(frontend, tmp_path / "exact.png", "--vram-budget", str(total))
    memory = doc["data"]["memory"]
    decision = memory["pipeline"]["cpu"]
    assert decision["strategy"] == "all-resident" and decision["available_bytes"] == total
    assert f"= {total} B <= available {total} B" in decision["arithmetic"]
    assert memory["releases"] == [] and releases == [] and memory["streamed_params"] == 0
    assert all(p["prepared"] == 1 for p in memory["programs"].values())
    assert "load.encode" not in doc["data"]["timings_s"]  # all prepared up front, in "load"
    np.testing.assert_array_equal(free_pixels, _pixels(tmp_path / "exact.png"))


def test_one_program_at_a_time_releases_the_text_encoder_before_the_denoiser(
    tmp_path: Path, releases: list[str]
) -> None:
    # 192x192: no program outweighs two others together (at 256² the VAE's arena alone does, at 128² the
    # transformer's weights outweigh the text encoder and the VAE together; the precondition is asserted)
    programs, free_pixels = _all_resident_sizes("flux2", tmp_path, size=192)
    sizes = {name: p["all_resident_bytes"] for name, p in programs.items()}
    cap = max(sizes.values())  # each program fits alone, no two together
    assert all(a + b > cap for a in sizes.values() for b in sizes.values() if a is not b)
    doc = _generate("flux2", tmp_path / "one.png", "--vram-budget", str(cap), size=192)
    memory = doc["data"]["memory"]
    decision = memory["pipeline"]["cpu"]
    assert decision["strategy"] == "one-stage-at-a-time"
    assert decision["phases"] == {
        "encode": ["qwen3_text_encoder"],
        "denoise": ["flux2_transformer"],
        "decode": ["flux2_vae_decoder"],
    }
    assert f"> available {cap} B" in decision["arithmetic"]
    assert releases == ["qwen3_text_encoder", "flux2_transformer"]
    assert memory["releases"] == ["qwen3_text_encoder before denoise", "flux2_transformer before decode"]
    assert memory["streamed_params"] == 0  # each fits alone
    timings = doc["data"]["timings_s"]
    assert {"load.encode", "load.denoise", "load.decode"} <= set(timings)  # each stage prepared its own
    np.testing.assert_array_equal(free_pixels, _pixels(tmp_path / "one.png"))


def test_the_text_encoder_alone_then_denoiser_and_vae_together(tmp_path: Path, releases: list[str]) -> None:
    programs, free_pixels = _all_resident_sizes("flux2", tmp_path)
    sizes = {name: p["all_resident_bytes"] for name, p in programs.items()}
    later = sizes["flux2_transformer"] + sizes["flux2_vae_decoder"]
    cap = max(sizes["qwen3_text_encoder"], later)
    assert cap < sum(sizes.values())
    doc = _generate("flux2", tmp_path / "two.png", "--vram-budget", str(cap))
    memory = doc["data"]["memory"]
    assert memory["pipeline"]["cpu"]["strategy"] == "release-text-encoder"
    assert releases == ["qwen3_text_encoder"] and memory["releases"] == ["qwen3_text_encoder before denoise"]
    np.testing.assert_array_equal(free_pixels, _pixels(tmp_path / "two.png"))


def test_a_long_lived_pipeline_prepares_a_released_text_encoder_again(tmp_path: Path, releases: list[str]) -> None:
    import dif

    programs, free_pixels = _all_resident_sizes("flux2", tmp_path)
    cap = max(p["all_resident_bytes"] for p in programs.values())
    settings = {"width": 256, "height": 256, "steps": 2, "seed": 4}
    with isolated_plugins(None):
        pipe = dif.load(family="flux2", backend="cpu", dtype="f32", vram_budget=cap)
        first = pipe("a fox", **settings)
        second = pipe("a fox", **settings)
    memory = pipe.pipeline.memory_report()
    text = memory["programs"]["qwen3_text_encoder"]
    assert text["prepared"] == 2 and text["released"] == 2  # released before each call's denoiser
    assert memory["releases"][:3] == [
        "qwen3_text_encoder before denoise",
        "flux2_transformer before decode",
        "flux2_vae_decoder before encode",  # the second call makes room for the text encoder again
    ]
    assert releases.count("qwen3_text_encoder") == 2
    np.testing.assert_array_equal(first.run.pixels, second.run.pixels)
    np.testing.assert_array_equal(first.run.pixels, free_pixels)


def test_a_budget_too_small_fails_before_any_weight_is_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dif.weights.bind import BoundWeights

    read: list[str] = []
    original = BoundWeights.__getitem__

    def spy(self: BoundWeights, name: str) -> np.ndarray:
        read.append(name)
        return original(self, name)

    monkeypatch.setattr(BoundWeights, "__getitem__", spy)
    args = ["-p", "x", "-W", "256", "-H", "256", "--steps", "1", "--backend", "cpu", "-o", str(tmp_path / "a.png")]
    result = _invoke("flux2", "generate", *args, "--dtype", "f32", "--vram-budget", "1MB")
    assert result.exit_code == 1
    message = result.output
    assert "within the memory budget of 1000000 B: program 'qwen3_text_encoder' does not fit" in message
    assert re.search(r"needs .* = \d+ B, but only available 1000000 B", message)
    assert read == [] and not (tmp_path / "a.png").exists()
