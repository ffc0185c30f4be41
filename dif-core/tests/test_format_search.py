"""The format search's stages and record (dif.passes.formats_search) over synthetic runs whose errors are known,
and the numerical gate's numbers (dif.quality.format_gate) against hand computations. The whole search over a
real pipeline is tests/test_format_search_flux2.py."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from dif.errors import DifWarning, UsageError
from dif.passes.formats_search import ACCEPTED, EXCLUDED, REJECTED, CandidateRun, search_formats
from dif.plan.plan import Decision
from dif.quality.format_gate import GateConfig, RunRecord, cosine, judge, rel_l2
from dif.target import TargetProfile

FORMATS_ALL = ("format:fp8-e4m3", "format:int8", "format:int4-group")
GPU = TargetProfile(
    backend="fakegpu",
    device="unit",
    dtypes=("f32", "bf16", "f8e4m3", "i8", "u8"),
    tensor_core_formats=("bf16", "fp8-e4m3", "int8"),
    capabilities=FORMATS_ALL,
)
AMPERE = TargetProfile(
    backend="fakegpu", device="unit", dtypes=GPU.dtypes, tensor_core_formats=("bf16", "int8"), capabilities=FORMATS_ALL
)
PASS_OF = {"quantize_fp8": "fp8-e4m3", "quantize_int8": "int8", "quantize_int4": "int4-group"}


def fake_run(errors: dict[str, float], seconds: dict[str, float], nbytes: dict[str, int], converted: int = 3):  # type: ignore[no-untyped-def]
    """A RunCandidate whose format adds relative noise `errors[fmt]` to each step output and the image."""
    rng = np.random.default_rng(0)
    outputs = [rng.standard_normal((1, 16, 8)) for _ in range(3)]
    image = rng.integers(0, 256, (16, 16, 3)).astype(np.uint8)
    calls: list[tuple[str, ...]] = []

    def run(extra: tuple[str, ...], teacher: RunRecord | None, held: tuple[str, ...]) -> CandidateRun:
        calls.append(extra)
        fmt = PASS_OF[extra[0]] if extra else "baseline"
        e = errors.get(fmt, 0.0)
        noisy = [o + e * np.linalg.norm(o) / np.sqrt(o.size) * rng.standard_normal(o.shape) for o in outputs]
        img = np.clip(image.astype(np.int16) + (rng.integers(-3, 4, image.shape) if e else 0), 0, 255).astype(np.uint8)
        record = RunRecord(step_outputs=noisy, image=img, forward_seconds=[seconds.get(fmt, 1.0)] * 3)
        if teacher is not None:
            record.forced_outputs = noisy
        what = f"{extra[0]}: applied {converted} at %1" if extra else "passes: default"
        programs = {"denoiser": (None, (Decision(what, "x"),))}
        return CandidateRun(record, programs, nbytes.get(fmt, 100))

    run.calls = calls  # type: ignore[attr-defined]
    return run


def test_judge_computes_cosine_and_rel_l2_by_hand() -> None:
    r = [np.array([3.0, 4.0]), np.array([1.0, 0.0])]
    c = [np.array([3.0, 4.0]), np.array([1.0, 1.0])]
    report = judge(r, c, GateConfig(cosine_min=0.9, rel_l2_max=0.5))
    assert report.steps[0].cosine == pytest.approx(1.0) and report.steps[0].rel_l2 == 0.0
    assert report.steps[1].cosine == pytest.approx(1 / np.sqrt(2)) and report.steps[1].rel_l2 == pytest.approx(1.0)
    assert not report.passed and "step 2: cosine 0.70711 < 0.9" in report.reason and "rel-L2 1 > 0.5" in report.reason
    assert cosine(np.zeros(3), np.zeros(3)) == 1.0 and rel_l2(np.ones(4), np.ones(4)) == 0.0


def test_judge_gates_the_image_only_when_asked() -> None:
    a = np.full((16, 16, 3), 100, np.uint8)
    b = a.copy()
    b[0, 0, 0] = 110
    steps = [np.ones(4)]
    report = judge(steps, steps, GateConfig(), reference_image=a, candidate_image=b)
    want_psnr = 10 * np.log10(255**2 / (100 / a.size))
    assert report.passed and report.psnr == pytest.approx(want_psnr)
    assert report.ssim is not None and report.ssim < 1.0
    strict = judge(steps, steps, GateConfig(psnr_min=80.0), reference_image=a, candidate_image=b)
    assert not strict.passed and "image PSNR" in strict.reason


def test_stages_in_order_and_the_first_accepted_is_chosen() -> None:
    run = fake_run(
        {"fp8-e4m3": 0.01, "int8": 0.005, "int4-group": 0.3}, {"fp8-e4m3": 0.6, "int8": 0.8}, {"fp8-e4m3": 60}
    )
    result = search_formats(["int4-group", "fp8-e4m3", "int8", "nvfp4"], profile=GPU, run=run)
    by = {c.format: c for c in result.candidates}
    assert by["int4-group"].verdict == REJECTED and by["int4-group"].reason.startswith("gate: failed")
    assert [s for s, _, _ in by["int4-group"].stages] == ["capability", "verify", "execute", "gate"]
    assert by["fp8-e4m3"].verdict == ACCEPTED and [s for s, _, _ in by["fp8-e4m3"].stages] == [
        "capability", "verify", "execute", "gate", "memory", "time"]  # fmt: skip
    assert by["int8"].verdict == ACCEPTED
    assert by["nvfp4"].verdict == EXCLUDED and "no format pass" in by["nvfp4"].reason
    assert result.chosen == "fp8-e4m3"  # int4 first in the order, rejected: falls back to the next
    whats = [d.what for d in result.decisions()]
    assert whats == ["format int4-group: rejected", "format fp8-e4m3: accepted", "format int8: accepted",
                     "format nvfp4: excluded", "formats: fp8-e4m3"]  # fmt: skip
    assert by["fp8-e4m3"].gate is not None and by["fp8-e4m3"].gate.worst_cosine > 0.999
    assert run.calls[0] == ()  # the baseline ran first


def test_no_fp8_units_excludes_fp8_saying_why_unless_emulated() -> None:
    run = fake_run({"fp8-e4m3": 0.01}, {"fp8-e4m3": 5.0}, {})
    result = search_formats(["fp8-e4m3", "int8"], profile=AMPERE, run=run)
    fp8 = result.candidates[0]
    assert fp8.verdict == EXCLUDED and "no fp8 matrix units on this target" in fp8.reason
    assert fp8.facts["target_tensor_core_formats"] == ["bf16", "int8"] and fp8.facts["legal"] is False
    assert len(run.calls) == 2  # baseline + int8: an excluded format never runs
    emulated = search_formats(["fp8-e4m3"], profile=AMPERE, run=run, emulate=True).candidates[0]
    assert emulated.emulated and emulated.verdict == ACCEPTED  # slower, but time is not judged when emulated
    assert emulated.stages[-1][:2] == ("time", "not judged")


def test_a_backend_without_the_implementation_excludes_the_format() -> None:
    bare = TargetProfile(backend="bare", device="unit", dtypes=GPU.dtypes, tensor_core_formats=GPU.tensor_core_formats)
    c = search_formats(["int8"], profile=bare, run=fake_run({}, {}, {})).candidates[0]
    assert c.verdict == EXCLUDED and "does not implement it" in c.reason and "'format:int8'" in c.reason


def test_a_tight_gate_rejects_and_the_run_falls_back() -> None:
    run = fake_run({"fp8-e4m3": 0.04, "int8": 0.005}, {"fp8-e4m3": 0.5, "int8": 0.7}, {})
    result = search_formats(["fp8-e4m3", "int8"], profile=GPU, run=run, gate=GateConfig(rel_l2_max=0.02))
    assert result.candidates[0].verdict == REJECTED and "rel-L2" in result.candidates[0].reason
    assert result.chosen == "int8"


def test_memory_then_time() -> None:
    run = fake_run({}, {"fp8-e4m3": 2.0, "int4-group": 3.0}, {"baseline": 500, "fp8-e4m3": 300, "int4-group": 150})
    slow = search_formats(["fp8-e4m3"], profile=GPU, run=run).candidates[0]
    assert slow.verdict == REJECTED and slow.reason.startswith("time:")
    small = search_formats(["fp8-e4m3", "int4-group"], profile=GPU, run=run, budget_bytes=200)
    fp8, int4 = small.candidates
    assert fp8.verdict == REJECTED and fp8.reason.startswith("memory:")
    assert int4.verdict == ACCEPTED and int4.stages[-1][:2] == ("time", "not judged")  # memory is what pays
    assert small.chosen == "int4-group"


def test_nothing_converted_is_rejected_at_verify() -> None:
    c = search_formats(["int8"], profile=GPU, run=fake_run({}, {}, {}, converted=0)).candidates[0]
    assert c.verdict == REJECTED and c.reason.startswith("verify:")


def test_no_gate_warns_and_skips_the_gate() -> None:
    run = fake_run({"fp8-e4m3": 0.5}, {"fp8-e4m3": 0.5}, {})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = search_formats(["fp8-e4m3"], profile=GPU, run=run, no_gate=True)
    assert any(issubclass(w.category, DifWarning) and "without the numerical gate" in str(w.message) for w in caught)
    assert result.chosen == "fp8-e4m3" and result.candidates[0].stages[3][:2] == ("gate", "not judged")


def test_unknown_or_no_format_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown physical format 'fp9'"):
        search_formats(["fp9"], profile=GPU, run=fake_run({}, {}, {}))
    with pytest.raises(UsageError, match="at least one format"):
        search_formats([], profile=GPU, run=fake_run({}, {}, {}))


BLOCK_ERRORS = {"blocks.0": 0.010, "blocks.1": 0.030, "blocks.2": 0.005, "blocks.3": 0.025}
"""A model whose blocks add independent errors: a run's rel-L2 is their quadrature sum over the blocks not held."""


def block_run(errors: dict[str, float], interaction: float = 0.0):  # type: ignore[no-untyped-def]
    """A RunCandidate whose format converts one linear per block of `errors`, each adding its error (noise of
    exactly that relative norm) unless held, plus `interaction` when two or more are converted; the programs
    carry the blocks in their provenance."""
    from types import SimpleNamespace

    rng = np.random.default_rng(1)
    outputs = [rng.standard_normal((1, 64, 8)) for _ in range(2)]
    blocks = list(errors)
    calls: list[tuple[str, ...]] = []

    def run(extra: tuple[str, ...], teacher: RunRecord | None, held: tuple[str, ...]) -> CandidateRun:
        calls.append(held)
        left = [b for b in blocks if b not in held] if extra else []
        e = float(np.sqrt(sum(errors[b] ** 2 for b in left))) + (interaction if len(left) > 1 else 0.0)
        noisy = []
        for o in outputs:
            noise = rng.standard_normal(o.shape)
            noisy.append(o + e * np.linalg.norm(o) / np.linalg.norm(noise) * noise)
        record = RunRecord(step_outputs=outputs, forced_outputs=noisy, forward_seconds=[0.5 if extra else 1.0])
        nodes = [SimpleNamespace(id=i, op="scaled_linear") for i in range(len(left))]
        program = SimpleNamespace(nodes=nodes, provenance={i: SimpleNamespace(block=b) for i, b in enumerate(left)})
        what = f"{extra[0]}: applied {len(left)} at %1" if left else "passes: default"
        return CandidateRun(record, {"denoiser": (program, (Decision(what, "x"),))}, 100)

    run.calls = calls  # type: ignore[attr-defined]
    return run


def test_a_format_the_gate_rejects_gets_a_per_block_candidate_holding_its_worst_blocks() -> None:
    """Whole: rel-L2 0.0418 > 0.035. Alone, the blocks measure their own errors; holding the worst (blocks.1,
    0.030) leaves sqrt(0.010² + 0.005² + 0.025²) = 0.0274, within the gate: one trial, accepted."""
    run = block_run(BLOCK_ERRORS)
    result = search_formats(["fp8-e4m3"], profile=GPU, run=run, gate=GateConfig(rel_l2_max=0.035), block_runs=8)
    whole, per_block = result.candidates
    assert whole.verdict == REJECTED and whole.reason.startswith("gate: failed") and not whole.held
    measured = per_block.numbers["block_errors"]
    assert list(measured) == list(BLOCK_ERRORS)
    for b, e in BLOCK_ERRORS.items():
        assert measured[b]["rel_l2"] == pytest.approx(e, rel=1e-6)
    assert per_block.held == ("blocks.1",) and per_block.verdict == ACCEPTED
    assert per_block.gate is not None and per_block.gate.worst_rel_l2 == pytest.approx(0.0274, abs=1e-4)
    assert per_block.label == "fp8-e4m3 with 1 block held in the run dtype"
    assert result.chosen == "fp8-e4m3" and result.chosen_held == ("blocks.1",)
    assert result.decisions()[-1].what == "formats: fp8-e4m3 (held in the run dtype: blocks.1)"
    # the baseline, the whole format, four blocks alone (the other three held), one trial
    assert len(run.calls) == 7 and run.calls[2] == ("blocks.1", "blocks.2", "blocks.3")
    assert run.calls[-1] == ("blocks.1",)


def test_the_per_block_search_holds_one_more_block_while_the_gate_fails() -> None:
    """Errors that interact (+0.004 when two or more blocks are converted): the quadrature estimate says two
    held (blocks.0 and .2 left: 0.0112) but that run measures 0.0152 > 0.0151; three held pass."""
    run = block_run(BLOCK_ERRORS, interaction=0.004)
    gate = GateConfig(rel_l2_max=0.0151)
    per_block = search_formats(["fp8-e4m3"], profile=GPU, run=run, gate=gate, block_runs=8).candidates[1]
    assert per_block.verdict == ACCEPTED and per_block.held == ("blocks.1", "blocks.3", "blocks.0")
    trials = per_block.numbers["block_trials"]
    assert [t.split(":")[0] for t in trials] == ["2 held", "3 held"] and "gate: failed" in trials[0]


def test_the_per_block_search_stays_within_its_runs_and_says_so() -> None:
    run = block_run(BLOCK_ERRORS)
    few = search_formats(["fp8-e4m3"], profile=GPU, run=run, gate=GateConfig(rel_l2_max=0.035), block_runs=4)
    per_block = few.candidates[1]
    assert per_block.verdict == REJECTED and per_block.reason.startswith("blocks:")
    assert "takes 5 runs, more than 4" in per_block.reason and few.chosen is None
    assert len(run.calls) == 2  # the baseline and the whole format only
    # no per-block candidate unless asked, and none for a format the gate passes
    assert len(search_formats(["fp8-e4m3"], profile=GPU, run=run, gate=GateConfig(rel_l2_max=0.035)).candidates) == 1
    assert len(search_formats(["fp8-e4m3"], profile=GPU, run=run, block_runs=8).candidates) == 1
