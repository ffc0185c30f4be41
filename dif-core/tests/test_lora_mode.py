"""LoRA mode, merged or unmerged, as a recorded decision (`dif.lora.mode`): each rule of "auto" picks
its mode with its reason; both modes give the same output on a two-linear program (fp32, rel-L2 <=
1e-6) and differ from the base; the decision travels in the program's meta into the plan's
decisions (first), and `dif plan make` / `dif inspect` show it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dif.dtypes import DType
from dif.errors import UsageError
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.layers.basic import linear
from dif.lora import LoraSpec, Target, apply_loras, decide_lora_mode
from dif.plan.planner import plan_program
from dif.serialize.difir import load_program, save_program
from dif.serialize.diftensor import save_tensors
from dif.target import RuntimeBudget, TargetProfile
from dif.weights import bind_weights, open_safetensors

PROFILE = TargetProfile(backend="test", device="unit", arch="x", memory_bytes=1 << 34)
TABLE = {"a": (Target("a.weight"),), "b": (Target("b.weight"),)}
RULE = dict(adapters=["x@1"], kinds=["lora"], need_rank=4, slot_rank=16, merge_bytes=100, host_free_bytes=1000)


def build() -> object:
    b = ProgramBuilder("two_linears")
    x = b.input("x", (3, 8), DType.F32)
    b.output(linear(b, linear(b, x, "a", 6, bias=True), "b", 4))
    return b.build()


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    base = {
        "a.weight": rng.standard_normal((6, 8)).astype(np.float32),
        "a.bias": rng.standard_normal(6).astype(np.float32),
        "b.weight": rng.standard_normal((4, 6)).astype(np.float32),
    }
    save_tensors(tmp_path / "base.safetensors", base, dif_metadata=False)
    lora = {}
    for module, (o, i) in {"a": (6, 8), "b": (4, 6)}.items():
        lora[f"transformer.{module}.lora_A.weight"] = rng.standard_normal((2, i)).astype(np.float32)
        lora[f"transformer.{module}.lora_B.weight"] = rng.standard_normal((o, 2)).astype(np.float32)
    save_tensors(tmp_path / "lora.safetensors", lora, dif_metadata=False)
    lokr = {"lycoris_a.lokr_w1": np.eye(2, dtype=np.float32), "lycoris_a.lokr_w2": np.ones((3, 4), np.float32)}
    save_tensors(tmp_path / "lokr.safetensors", lokr, dif_metadata=False)
    return {
        "base": tmp_path / "base.safetensors",
        "lora": tmp_path / "lora.safetensors",
        "lokr": tmp_path / "lokr.safetensors",
    }


def apply(files, specs, **kw):  # type: ignore[no-untyped-def]
    return apply_loras(open_safetensors(files["base"]), specs, TABLE, family="test", model="the test model", **kw)


def run(app, x: np.ndarray) -> np.ndarray:  # type: ignore[no-untyped-def]
    prog = app.build("p", build)
    weights = bind_weights(prog, app.source)
    return app.feed("p", lambda inputs: interpret(prog, inputs, weights), DType.F32)({"x": x})[prog.outputs[0]]


@pytest.mark.parametrize(
    "change, mode, why",
    [
        ({}, "merged", "fixed for the pipeline's life"),
        ({"swappable": True}, "unmerged", "swapping asked for"),
        ({"kinds": ["lokr", "lora"]}, "merged", "lokr adapters are not low-rank factors"),
        ({"need_rank": 17}, "merged", "rank 17, more than a slot's 16"),
        ({"host_free_bytes": 99}, "unmerged", "100 B of adapted weights on the host, more than the 99 B"),
        ({"requested": "merged"}, "merged", "asked for"),
        ({"requested": "unmerged"}, "unmerged", "asked for"),
    ],
)
def test_each_rule_of_auto(change, mode, why) -> None:  # type: ignore[no-untyped-def]
    kw = {**RULE, "swappable": False, **change}
    decided = decide_lora_mode(kw.pop("requested", "auto"), **kw)
    assert decided.mode == mode and why in decided.why
    assert decided.what.startswith(f"lora: {mode}")
    assert (decided.slot_rank is not None) == (mode == "unmerged")


def test_refused_modes() -> None:
    with pytest.raises(UsageError, match="cannot swap"):
        decide_lora_mode("merged", **RULE, swappable=True)
    with pytest.raises(UsageError, match="choose auto, merged, unmerged"):
        decide_lora_mode("fused", **RULE, swappable=False)


def test_both_modes_give_the_same_output(files) -> None:  # type: ignore[no-untyped-def]
    x = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    spec = [LoraSpec(files["lora"], 0.7)]
    merged, swappable = apply(files, spec), apply(files, spec, swappable=True, rank=8)
    tight = apply(files, spec, host_free_bytes=10)  # the merged copy would not fit the host
    assert (merged.mode.mode, swappable.mode.mode, tight.mode.mode) == ("merged", "unmerged", "unmerged")
    assert merged.unmerged is None and swappable.unmerged is not None
    assert tight.mode.merge_bytes == (6 * 8 + 4 * 6) * 4
    base = run(apply(files, []), x)
    out = run(merged, x)
    assert np.linalg.norm(out - base) / np.linalg.norm(base) > 1e-2  # the adapter matters
    for other in (swappable, tight):
        assert np.linalg.norm(run(other, x) - out) / np.linalg.norm(out) <= 1e-6
    assert apply(files, []).mode is None  # nothing to decide
    lokr = apply(files, [files["lokr"]])
    assert lokr.mode.mode == "merged" and "lokr" in lokr.mode.why


def test_decision_reaches_meta_plan_and_tools(files, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    app = apply(files, [LoraSpec(files["lora"], 0.5)], swappable=True, rank=8)
    prog = app.build("p", build)
    assert json.loads(prog.meta["lora"])["mode"] == "unmerged"
    plan = plan_program(prog, PROFILE, RuntimeBudget(free_memory_bytes=1 << 30))
    first = plan.decisions[0]
    assert first.what == "lora: unmerged (auto), 1 adapter(s), side-GEMM slots of rank 8"
    assert "swapping asked for" in first.why
    assert "lora: unmerged" in plan.describe()
    path = tmp_path / "p.difir"
    save_program(prog, path)
    assert load_program(path).meta["lora"] == prog.meta["lora"]  # survives the binary form

    cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
    from click.testing import CliRunner

    made = CliRunner().invoke(cli, ["plan", "make", str(path), "--out", str(tmp_path / "p.difplan"), "--json"])
    assert made.exit_code == 0, made.output
    decisions = json.loads(made.output)["data"]["decisions"]
    assert decisions[0]["what"].startswith("lora: unmerged (auto)")
    shown = CliRunner().invoke(cli, ["plan", "show", str(tmp_path / "p.difplan")])
    assert shown.exit_code == 0 and "lora: unmerged (auto)" in shown.output
    inspected = CliRunner().invoke(cli, ["inspect", str(path), "--json"])
    assert inspected.exit_code == 0, inspected.output
    assert json.loads(json.loads(inspected.output)["data"]["meta"]["lora"])["requested"] == "auto"
