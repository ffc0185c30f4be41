"""`--vram-budget` on the image commands, end to end on the CPU backend with the embedded tiny checkpoints:
a budget one byte short of the largest program makes it stream weights, the run reports that, and
the image is the unbudgeted one (the CPU executor reads weights from the host either way)."""

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


def _generate(frontend: str, out: Path, *extra: str) -> dict[str, Any]:
    # 256x256: the VAE decoder's arena makes it the largest program, larger than the text encoder (whose
    # one big embedding table cannot be streamed usefully), so capping just below it streams VAE weights
    args = ["-p", "a fox", "-W", "256", "-H", "256", "--steps", "2", "--seed", "4", "--dtype", "f32"]
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
    assert re.search(r"memory budget 11\.18 GiB per program: all \d+ parameters resident", roomy.stdout)


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
