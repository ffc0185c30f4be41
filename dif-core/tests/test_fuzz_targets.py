"""The fuzz registry's short run (CI's version of perf/fuzz.py): every dif-core reader gets 300 mutated
inputs and may raise nothing but `DifError`; plus the mutator's and runner's own contracts."""

from __future__ import annotations

import json
import random

import pytest

from dif.errors import DifError, FormatError
from dif.testing.fuzz_mutate import Mutator
from dif.testing.fuzz_run import FuzzTarget, case_input, check_seeds, run_fuzz
from dif.testing.fuzz_targets import NOT_APPLICABLE, core_targets

TARGETS = core_targets()
CI_CASES = 300


def test_every_reader_of_the_issue_has_a_target_or_is_marked_not_applicable() -> None:
    names = {t.name for t in TARGETS}
    for wanted in (".difir", ".difplan", ".diftensor", "safetensors header", "safetensors index JSON",
                   "scheduler_config.json", "tokenizer.json", "tokenizer_config.json", "bench recipe"):  # fmt: skip
        assert wanted in names
    assert "GGUF" in names and "LoRA file" in names and not NOT_APPLICABLE
    assert len(names) == len(TARGETS)  # names are the table's rows: no duplicates


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_seeds_load(target: FuzzTarget) -> None:
    check_seeds(target)  # a seed the reader rejects would make its mutations test nothing


@pytest.mark.parametrize("target", TARGETS, ids=[t.name for t in TARGETS])
def test_mutated_inputs_raise_only_dif_errors(target: FuzzTarget) -> None:
    result = run_fuzz(target, CI_CASES, seed=14)
    assert result.cases == CI_CASES
    assert result.failures == (), f"{target.name}: {result.failures[:3]}"


def test_cases_replay_from_their_index() -> None:
    target = next(t for t in TARGETS if t.name == "scheduler_config.json")
    mutator, again = Mutator(target.seeds(), target.kind), Mutator(target.seeds(), target.kind)
    inputs = [case_input(target, mutator, 7, i) for i in range(50)]
    assert inputs == [case_input(target, again, 7, i) for i in reversed(range(50))][::-1]
    assert len(set(inputs)) > 40  # and they differ from each other


def test_json_mutations_reach_structure() -> None:
    """JSON targets get structural edits: most cases still parse, some carry deep nesting or non-finite numbers."""
    seed = json.dumps({"a": 1, "b": [1.5, "x"], "c": {"d": True}}).encode()
    mutator = Mutator([seed], "json")
    cases = [mutator.case(random.Random(i)) for i in range(400)]
    parsed = 0
    for data in cases:
        try:
            json.loads(data)
            parsed += 1
        except (ValueError, RecursionError):
            pass
    assert parsed > 150
    assert any(b"[[[[[[[[[[" in c for c in cases)
    assert any(b"NaN" in c or b"Infinity" in c for c in cases)
    assert sum(c != seed for c in cases) > 390


def _loader(data: bytes) -> None:
    if data[:1] == b"{":
        raise FormatError("expected")  # a DifError: fine
    raise ValueError("a bug")


def test_runner_keeps_only_non_dif_errors() -> None:
    target = FuzzTarget("probe", _loader, lambda: [b"{}", b"xx"], "binary", "test")
    result = run_fuzz(target, 200, seed=1)
    assert 0 < len(result.failures) < 200  # some inputs start with '{', most do not
    failure = result.failures[0]
    assert failure.type == "ValueError" and failure.message == "a bug" and len(failure.sha256) == 64
    assert "test_fuzz_targets.py" in failure.where
    with pytest.raises(DifError):
        _loader(b"{")


def test_runner_times_out_a_hanging_case() -> None:
    def hang(data: bytes) -> None:
        while True:
            pass

    result = run_fuzz(FuzzTarget("hang", hang, lambda: [b"x"], "binary", "test"), 1, case_timeout_s=0.2)
    assert [f.type for f in result.failures] == ["CaseTimeout"]
