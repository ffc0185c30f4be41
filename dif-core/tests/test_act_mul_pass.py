"""fuse_act_mul: mul(act(g), u), act a silu or sigmoid used only by the mul, becomes act_mul(g, u) in either
operand order; it is skipped (with the reason) when the activation has another user, when the mul broadcasts, or
when the target lacks the op; the results stay bit-identical under the reference interpreter (f32 and the half
dtypes: the fused reference rounds the activation as the unfused program stores it); and the W8A8 pass turns an
act_mul feeding a wide linear into act_mul_quant, as it does the unfused pair."""

from __future__ import annotations

import pytest

from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.passes import APPLIED, DEFAULT_PASSES, SKIPPED, optimize
from dif.target import TargetProfile
from dif.testing.rewrites import assert_bit_identical

ALL = TargetProfile(backend="ref", device="unit", dtypes=("f32", "bf16", "f16", "f8e4m3"),
                    capabilities=("op:*", "format:fp8-e4m3"))  # fmt: skip
NONE = TargetProfile(backend="bare", device="unit")


def swiglu(dtype: str = "f32", *, act: str = "silu", gate_first: bool = True, act_read_elsewhere: bool = False,
           broadcast: bool = False, out: int = 16) -> Program:  # fmt: skip
    """Krea 2's SwiGLU from two GEMMs (or its sigmoid-gated attention output): x -> (gate, up) linears ->
    act(gate) * up -> down linear."""
    b = ProgramBuilder("swiglu")
    x = b.input("x", (2, 8, 16), dtype)
    gate = b.emit("linear", x, b.param("gate.weight", (32, 16), dtype))
    up = b.emit("linear", x, b.param("up.weight", (1 if broadcast else 32, 16), dtype))
    a = b.emit(act, gate)
    y = b.emit("mul", a, up) if gate_first else b.emit("mul", up, a)
    b.output(b.emit("reshape", b.emit("linear", y, b.param("down.weight", (out, 32), dtype)), shape=(16, out)))
    if act_read_elsewhere:
        b.output(a)
    return b.build()


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
@pytest.mark.parametrize(("act", "gate_first"), [("silu", True), ("sigmoid", False)])
def test_applies_in_either_order_and_is_exact(dtype: str, act: str, gate_first: bool) -> None:
    program = swiglu(dtype, act=act, gate_first=gate_first)
    out, decisions = optimize(program, target=ALL, passes=["fuse_act_mul"])
    assert out.op_histogram() == {"linear": 3, "act_mul": 1, "reshape": 1}
    fused = next(n for n in out.nodes if n.op == "act_mul")
    gate = next(n for n in program.nodes if n.op == act).operands[0]
    assert fused.attrs == {"act": act} and fused.operands[0] == gate  # the gate first, whatever the mul's order
    assert [(d.verdict, d.reason) for d in decisions] == [(APPLIED, f"mul + {act} -> act_mul")]
    assert_bit_identical(program, out)


@pytest.mark.parametrize(("kwargs", "why"), [
    ({"act_read_elsewhere": True}, "is a program output"),
    ({"broadcast": True}, "act_mul does not type-check here"),
])  # fmt: skip
def test_skipped_saying_why(kwargs: dict, why: str) -> None:
    out, decisions = optimize(swiglu(**kwargs), target=ALL, passes=["fuse_act_mul"])
    assert "act_mul" not in out.op_histogram() and [d.verdict for d in decisions] == [SKIPPED]
    assert why in decisions[0].reason, decisions[0].reason
    out, decisions = optimize(swiglu(), target=NONE, passes=["fuse_act_mul"])
    assert "act_mul" not in out.op_histogram() and "does not declare op:act_mul" in decisions[0].reason


def test_the_fused_pair_feeds_w8a8_as_act_mul_quant() -> None:
    """The default pipeline fuses the pair first; the fp8 pass then makes the act_mul the quantizing producer of
    the down projection's input, with the same decision as for the unfused pair."""
    program = swiglu(out=1024)
    out, decisions = optimize(program, target=ALL, passes=(*DEFAULT_PASSES, "quantize_fp8"))
    ops = out.op_histogram()
    assert ops.get("act_mul_quant") == 1 and "act_mul" not in ops and "silu" not in ops and "mul" not in ops
    down = [d for d in decisions if d.pass_name == "quantize_fp8" and d.verdict == APPLIED]
    assert [d.reason for d in down] == ["silu + mul + linear -> act_mul_quant + scaled_linear (fp8-e4m3)"]
