"""`tuning.Choices` without a GPU: which candidate a problem gets under each tune mode, what is stored,
and that a damaged or foreign stored choice is re-decided (with a warning) rather than trusted."""

from __future__ import annotations

from pathlib import Path

import pytest

from dif.errors import DifWarning
from dif_backend_cuda.tuning import Choices

DEVICE = {"device": "NVIDIA H200", "arch": "sm_90", "driver": "13000", "runtime": "13000"}
PROBLEM = ("bf16", 4096, 3072, 3072)


class Measure:
    def __init__(self, winner: int) -> None:
        self.winner, self.calls = winner, 0

    def __call__(self) -> int:
        self.calls += 1
        return self.winner


def choices(root: Path, mode: str, version: str = "cublasLt 130000") -> Choices:
    return Choices("cublasLt", version, DEVICE, mode, root)


def test_cached_mode_never_times_and_takes_the_first(tmp_path: Path) -> None:
    measure = Measure(3)
    assert choices(tmp_path, "cached").choose(PROBLEM, 8, measure) == (0, "heuristic")
    assert measure.calls == 0 and not list(tmp_path.rglob("*.json"))


def test_on_times_once_stores_and_a_later_process_reuses(tmp_path: Path) -> None:
    measure = Measure(5)
    first = choices(tmp_path, "on")
    assert first.choose(PROBLEM, 8, measure) == (5, "tuned")
    assert first.choose(PROBLEM, 8, measure) == (5, "tuned")  # same process: remembered
    assert measure.calls == 1 and len(list(tmp_path.rglob("*.json"))) == 1
    later = Measure(1)
    assert choices(tmp_path, "cached").choose(PROBLEM, 8, later) == (5, "cached")
    assert choices(tmp_path, "on").choose(PROBLEM, 8, later) == (5, "cached")
    assert later.calls == 0
    assert choices(tmp_path, "off").choose(PROBLEM, 8, later) == (0, "heuristic")


def test_another_library_version_device_or_candidate_count_is_a_miss(tmp_path: Path) -> None:
    choices(tmp_path, "on").choose(PROBLEM, 8, Measure(5))
    assert choices(tmp_path, "cached", version="cublasLt 130100").choose(PROBLEM, 8, Measure(2)) == (0, "heuristic")
    assert choices(tmp_path, "cached").choose(PROBLEM, 7, Measure(2)) == (0, "heuristic")
    assert choices(tmp_path, "cached").choose((*PROBLEM[:3], 1024), 8, Measure(2)) == (0, "heuristic")
    other = Choices("cublasLt", "cublasLt 130000", {**DEVICE, "device": "NVIDIA H100"}, "cached", tmp_path)
    assert other.choose(PROBLEM, 8, Measure(2)) == (0, "heuristic")


def test_a_damaged_entry_is_rebuilt_with_a_warning(tmp_path: Path) -> None:
    choices(tmp_path, "on").choose(PROBLEM, 8, Measure(5))
    (entry,) = tmp_path.rglob("*.json")
    entry.write_bytes(entry.read_bytes().replace(b'"choice": 5', b'"choice": 6'))  # hand-edited
    measure = Measure(2)
    with pytest.warns(DifWarning, match="checksum"):
        assert choices(tmp_path, "on").choose(PROBLEM, 8, measure) == (2, "tuned")
    assert measure.calls == 1
    assert choices(tmp_path, "cached").choose(PROBLEM, 8, Measure(0)) == (2, "cached")


def test_single_candidate_and_bad_mode(tmp_path: Path) -> None:
    measure = Measure(0)
    assert choices(tmp_path, "on").choose(PROBLEM, 1, measure) == (0, "heuristic")
    assert measure.calls == 0
    with pytest.raises(ValueError, match="tune mode"):
        choices(tmp_path, "always")


def test_choose_form_builds_only_the_chosen_form(tmp_path: Path) -> None:
    """A stored choice picks its form without timing, and only that form's step is ever built."""
    from dif_backend_cuda.tuning import choose_form

    choices = Choices("cudnn", "9", DEVICE, "on", tmp_path)
    choices.choose(PROBLEM, 3, Measure(2))  # stored: form 2
    built: list[int] = []

    def maker(i: int):  # type: ignore[no-untyped-def]
        return lambda: built.append(i) or f"step {i}"

    cached = Choices("cudnn", "9", DEVICE, "cached", tmp_path)
    assert choose_form(cached, PROBLEM, [maker(i) for i in range(3)], stream=None) == (2, "step 2")
    assert built == [2]
