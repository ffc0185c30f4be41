"""The whole format search on the CPU backend over the embedded tiny FLUX.2 [klein] pipeline (bf16 baseline,
fp8 / int8 emulated by the references, int4-group executed): `dif opt --formats` records every format's stages
and verdict, a format the gate fails is rejected with the gate's numbers and the run falls back to the next."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from dif.plugins import isolated_plugins
from dif.telemetry import validate_document
from dif_tools.cli import build_cli

BASE = ("--backend", "cpu", "--steps", "2", "--width", "64", "--height", "64", "--seed", "3")


def opt(*args: str) -> tuple[int, dict | None, str]:
    with isolated_plugins(None):
        result = CliRunner().invoke(build_cli(), ["opt", *BASE, *args, "--json"], catch_exceptions=False)
    if result.exit_code != 0:
        return result.exit_code, None, result.output
    doc = json.loads(result.stdout)
    validate_document(doc)
    return 0, doc, result.stderr


@pytest.fixture(scope="module")
def loose() -> dict:
    """fp8 and int8 under a gate both pass (rel-L2 up to 1): their measured numbers."""
    code, doc, err = opt("--formats", "fp8-e4m3,int8", "--emulate", "--rel-l2-max", "1.0")
    assert code == 0 and doc is not None, err
    return doc["data"]


def between(loose: dict) -> float:
    """A rel-L2 bound halfway between int8's worst step and fp8's (int8 keeps 7 more mantissa bits than e4m3)."""
    fp8, int8 = (c["gate"]["worst_rel_l2"] for c in loose["candidates"])
    assert int8 < fp8
    return (fp8 + int8) / 2


@pytest.fixture(scope="module")
def searched(loose: dict) -> dict:
    code, doc, err = opt(
        "--formats", "fp8-e4m3,int8,int4-group,nvfp4", "--emulate", "--rel-l2-max", str(between(loose)),
        "--block-runs", "0",
    )  # fmt: skip
    assert code == 0 and doc is not None, err
    return doc["data"]


def test_every_requested_format_has_facts_stages_and_a_verdict(searched: dict) -> None:
    by = {c["format"]: c for c in searched["candidates"]}
    assert list(by) == ["fp8-e4m3", "int8", "int4-group", "nvfp4"]
    for c in by.values():
        assert c["verdict"] in ("accepted", "rejected", "excluded") and c["reason"]
        assert c["facts"]["usage"] and "legal" in c["facts"]
    assert by["nvfp4"]["verdict"] == "excluded" and "no format pass" in by["nvfp4"]["reason"]
    fp8, int8 = by["fp8-e4m3"], by["int8"]
    assert fp8["emulated"] and fp8["facts"]["legal"] is False  # the cpu lists no fp8 matrix units
    stages = ["capability", "verify", "execute", "gate", "memory", "time"]
    assert [s["stage"] for s in int8["stages"]] == stages  # accepted: every stage ran
    assert [s["stage"] for s in fp8["stages"]] == stages[:4]  # rejected at the gate: no further
    assert fp8["numbers"]["linears_converted"] > 0 and fp8["numbers"]["linears_left"] > 0  # inputs not from norms stay


def test_the_gate_numbers_over_the_whole_schedule(loose: dict, searched: dict) -> None:
    """With the rel-L2 bound between the two formats' measured worst steps (on the installed model, stop 23:
    fp8-e4m3 0.042, int8 0.021), the search rejects fp8 with its numbers and falls back to int8."""
    bound = between(loose)
    by = {c["format"]: c for c in searched["candidates"]}
    for name in ("fp8-e4m3", "int8"):
        gate = by[name]["gate"]
        assert len(gate["steps"]) == 2 and gate["worst_cosine"] >= 0.995
        assert gate["psnr_db"] is not None and gate["psnr_db"] > 25 and 0.9 < gate["ssim"] <= 1.0
    assert by["int8"]["gate"]["worst_rel_l2"] < by["fp8-e4m3"]["gate"]["worst_rel_l2"]  # 7 more bits than e4m3
    fp8 = by["fp8-e4m3"]
    assert not fp8["gate"]["passed"] and fp8["gate"]["worst_rel_l2"] > bound
    assert fp8["verdict"] == "rejected" and fp8["reason"].startswith("gate: failed") and "> 0.0" in fp8["reason"]
    assert by["int8"]["gate"]["passed"] and by["int8"]["gate"]["worst_rel_l2"] <= bound
    assert by["int8"]["verdict"] == "accepted" and searched["chosen"] == "int8"
    # int4 weight-only, groups of 64: the gate rejects it (its worst step cosine), saying by how much
    int4 = by["int4-group"]
    assert int4["verdict"] == "rejected" and int4["reason"].startswith("gate: failed")
    assert int4["gate"]["worst_cosine"] < 0.995
    whats = [d["what"] for d in searched["decisions"]]
    assert whats[-1] == "formats: int8" and "format int4-group: rejected" in whats


def test_a_looser_tolerance_accepts_fp8_the_first_requested(loose: dict) -> None:
    # the gate is configurable: with rel-L2 up to 1 both pass and fp8, first in the order, is chosen
    fp8, int8 = loose["candidates"]
    assert fp8["verdict"] == "accepted" and int8["verdict"] == "accepted"  # both pass: the order decides
    assert loose["chosen"] == "fp8-e4m3" and 0 < int8["gate"]["worst_rel_l2"] < fp8["gate"]["worst_rel_l2"] <= 1


def test_without_emulation_the_cpu_excludes_fp8_and_int8_saying_why() -> None:
    code, doc, err = opt("--formats", "fp8-e4m3,int8")
    assert code == 0 and doc is not None, err
    fp8, int8 = doc["data"]["candidates"]
    assert fp8["verdict"] == "excluded" and "no fp8 matrix units on this target" in fp8["reason"]
    assert int8["verdict"] == "excluded" and "no int8 matrix units" in int8["reason"]
    assert doc["data"]["chosen"] is None and doc["data"]["decisions"][-1]["what"] == "formats: baseline"


def test_a_forced_format_warns_and_an_unknown_one_fails_cleanly() -> None:
    code, doc, err = opt("--formats", "int8", "--emulate", "--no-gate")
    assert code == 0 and doc is not None
    assert "warning: format int8 forced without the numerical gate" in err
    assert doc["data"]["candidates"][0]["gate"] is None
    code, _, out = opt("--formats", "fp9")
    assert code != 0 and "unknown physical format 'fp9'" in out and "Traceback" not in out
    code, _, out = opt("--formats", "int8", "--stages", "denoiser")
    assert code != 0 and "unknown stage denoiser" in out and "encode, denoise, decode" in out
    assert "Traceback" not in out


def test_a_rejected_format_gets_a_per_block_candidate_and_its_blocks_run_held(loose: dict) -> None:
    """With the rel-L2 bound between int8's and fp8's, fp8 over every linear is rejected; the per-block candidate
    measures each block alone, holds the worst in bf16 and passes the gate, and is chosen before int8. The same
    held set in the product path (DIF_FORMAT_KEEP) leaves exactly those blocks' linears unconverted."""
    bound = between(loose)
    code, doc, err = opt("--formats", "fp8-e4m3,int8", "--emulate", "--rel-l2-max", str(bound))
    assert code == 0 and doc is not None, err
    data = doc["data"]
    whole, per_block = data["candidates"][:2]
    assert whole["verdict"] == "rejected" and whole["reason"].startswith("gate: failed")
    errors = per_block["numbers"]["block_errors"]
    assert len(errors) >= 2 and all(0 < e["rel_l2"] < whole["gate"]["worst_rel_l2"] for e in errors.values())
    held = per_block["held_blocks"]
    worst_first = sorted(errors, key=lambda b: errors[b]["rel_l2"], reverse=True)
    assert held and held == worst_first[: len(held)] and len(held) < len(errors)
    assert per_block["verdict"] == "accepted" and per_block["gate"]["worst_rel_l2"] <= bound
    assert data["chosen"] == "fp8-e4m3" and data["chosen_held_blocks"] == held
    assert data["decisions"][-1]["what"] == f"formats: fp8-e4m3 (held in the run dtype: {', '.join(held)})"

    from dif.passes import optimize
    from dif.passes.formats_search import passes_appended
    from dif_frontend_flux2 import DEFAULT_CHECKPOINT
    from dif_frontend_flux2.config import load_configs
    from dif_frontend_flux2.model import build_transformer

    program = build_transformer(load_configs(DEFAULT_CHECKPOINT).transformer, batch=1, n_img=16, n_txt=8)
    with passes_appended((), held=held):
        optimized, decisions = optimize(program, target=None, passes=("quantize_fp8",))
    blocks = {optimized.provenance[n.id].block for n in optimized.nodes if n.op == "scaled_linear"}
    assert blocks and not blocks & set(held) and blocks <= set(errors)
    kept = [d for d in decisions if "held in the run dtype (DIF_FORMAT_KEEP)" in d.reason]
    assert {d.reason.split()[1] for d in kept} == set(held)


def test_fp8_attention_is_a_candidate_of_its_own(loose: dict) -> None:
    """`fp8-e4m3+attention`: the fp8 linears and every attention on fp8 (emulated here), judged apart from the
    linears alone; the suffix goes with fp8 only."""
    code, doc, err = opt("--formats", "fp8-e4m3+attention,fp8-e4m3", "--emulate", "--rel-l2-max", "1.0")
    assert code == 0 and doc is not None, err
    both, linears = doc["data"]["candidates"]
    assert both["label"] == "fp8-e4m3+attention" and both["attention"] and not linears["attention"]
    assert both["numbers"]["attentions_converted"] == 4 and both["numbers"]["attentions_left"] == 0  # 2 + 2 blocks
    assert both["numbers"]["linears_converted"] == linears["numbers"]["linears_converted"]
    assert "4 attentions converted" in next(s["detail"] for s in both["stages"] if s["stage"] == "verify")
    assert both["gate"]["worst_rel_l2"] != linears["gate"]["worst_rel_l2"]  # the attention's own rounding
    assert doc["data"]["chosen"] == "fp8-e4m3+attention"
    code, _, out = opt("--formats", "int8+attention", "--emulate")
    assert code != 0 and "+attention goes with fp8-e4m3 only" in out and "Traceback" not in out
