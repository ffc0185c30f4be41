"""The residual fusion (`fuse_linear_residual`, dif.passes.fusions): add(r, linear(x, w, bias?)) in either order
becomes linear_add(x, w, r, bias?) where the linear's result has no other use and r is exactly its shape and
dtype, and only for a target declaring `op:linear_add`; the fused program is bit-identical to the unfused one
under the interpreter and on the CPU backend. The format passes split a linear_add to quantize its linear and
fuse back the ones they leave."""

from __future__ import annotations

import numpy as np
import pytest

from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.passes import APPLIED, DEFAULT_PASSES, SKIPPED, fuse_linear_residual, optimize
from dif.target import TargetProfile

ALL = TargetProfile(backend="ref", device="unit", capabilities=("op:*",))
NONE = TargetProfile(backend="bare", device="unit")


def residual_linear(
    dtype: str = "f32", *, swap: bool = False, bias: bool = True, x_shape: tuple[int, ...] = (2, 5, 16),
    r_shape: tuple[int, ...] | None = None,
) -> Program:  # fmt: skip
    """h = r + linear(x, w, bias) (or linear(..) + r), x [.., 16] -> [.., 8], as a transformer layer's residual."""
    b = ProgramBuilder("res")
    x = b.input("x", x_shape, dtype)
    r = b.input("r", r_shape or (*x_shape[:-1], 8), dtype)
    w = b.param("w", (8, 16), dtype)
    bb = b.param("b", (8,), dtype) if bias else None
    with b.scope(block="layer.0", section="mlp", tensors=("fc2.weight",)):
        y = b.emit("linear", x, w, bb)
    with b.scope(block="layer.0", section="residual"):
        b.output(b.emit("add", y, r) if swap else b.emit("add", r, y))
    return b.build()


def bindings(program: Program, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    make = lambda v: rng.standard_normal(v.type.shape).astype(v.type.dtype.np)  # noqa: E731
    return {v.name: make(v) for v in program.inputs}, {v.name: make(v) for v in program.params}


def assert_bit_identical(got: dict[str, np.ndarray], want: dict[str, np.ndarray]) -> None:
    assert list(got) == list(want)
    for name in want:
        assert got[name].dtype == want[name].dtype
        np.testing.assert_array_equal(got[name].view(np.uint8), want[name].view(np.uint8), err_msg=name)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16"])
@pytest.mark.parametrize("swap", [False, True])
@pytest.mark.parametrize("bias", [True, False])
def test_applies_in_either_order_and_is_exact(dtype: str, swap: bool, bias: bool) -> None:
    program = residual_linear(dtype, swap=swap, bias=bias)
    out, decisions = optimize(program, target=ALL, passes=[fuse_linear_residual])
    (node,) = out.nodes
    assert node.op == "linear_add" and node.operands == ("x", "w", "r", *(("b",) if bias else ()))
    assert node.results == program.nodes[1].results  # the add's result, name and type
    assert [(d.verdict, d.reason, d.value) for d in decisions] == [(APPLIED, "add + linear -> linear_add", "%1")]
    prov = out.provenance[0]
    assert prov.transforms == ("fuse_linear_residual",) and prov.section == "residual"
    assert prov.tensors == ("fc2.weight",)  # the absorbed linear's checkpoint tensors stay
    inputs, weights = bindings(program)
    assert_bit_identical(interpret(out, inputs, weights), interpret(program, inputs, weights))


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_fused_program_is_bit_identical_on_the_cpu_backend(dtype: str) -> None:
    cpu = pytest.importorskip("dif_backend_cpu", reason="needs dif-backend-cpu")
    from dif.runtime import prepare

    b = ProgramBuilder("layers")
    h = b.input("h", (1, 7, 16), dtype)
    for i in range(2):  # two pre-norm layers: h = h + o(norm(h)); h = h + fc2(gelu(fc1(norm(h))))
        n = b.emit("layer_norm", h, b.param(f"ln{i}.w", (16,), dtype), b.param(f"ln{i}.b", (16,), dtype))
        h = b.emit("add", h, b.emit("linear", n, b.param(f"o{i}", (16, 16), dtype), b.param(f"o{i}.b", (16,), dtype)))
        up = b.emit("gelu", b.emit("linear", h, b.param(f"fc1.{i}", (32, 16), dtype)))
        h = b.emit("add", b.emit("linear", up, b.param(f"fc2.{i}", (16, 32), dtype)), h)
    b.output(h)
    program = b.build()
    backend = cpu.CpuBackend()
    inputs, weights = bindings(program, seed=4)
    fused, plan = prepare(program, weights, backend, passes=["fuse_linear_residual"])
    plain, _ = prepare(program, weights, backend, passes=())
    assert len(plan.schedule) == len(program.nodes) - 4
    assert any(d.what.startswith("fuse_linear_residual: applied 4") for d in plan.decisions)
    want = plain.run(inputs)
    assert_bit_identical(fused.run(inputs), want)
    assert_bit_identical(want, interpret(program, inputs, weights))


def test_a_linear_with_another_use_or_as_output_is_not_fused() -> None:
    b = ProgramBuilder("shared")
    x, r = b.input("x", (4, 16), "f32"), b.input("r", (4, 8), "f32")
    y = b.emit("linear", x, b.param("w", (8, 16), "f32"))
    b.output(b.emit("add", r, y), b.emit("exp", y))
    out, decisions = optimize(b.build(), target=ALL, passes=[fuse_linear_residual])
    assert "linear_add" not in out.op_histogram()
    assert [(d.verdict, d.reason) for d in decisions] == [(SKIPPED, "%0 has 2 users")]

    b = ProgramBuilder("output")
    x, r = b.input("x", (4, 16), "f32"), b.input("r", (4, 8), "f32")
    y = b.emit("linear", x, b.param("w", (8, 16), "f32"))
    b.output(b.emit("add", r, y), y)
    out, decisions = optimize(b.build(), target=ALL, passes=[fuse_linear_residual])
    assert out.op_histogram() == {"add": 1, "linear": 1} and decisions[0].reason == "%0 is a program output"


def test_a_broadcast_residual_is_not_fused() -> None:
    program = residual_linear(r_shape=(8,))  # r [8] broadcasts over the rows: the add is not the GEMM's C
    out, decisions = optimize(program, target=ALL, passes=[fuse_linear_residual])
    assert out is program
    assert decisions[0].verdict == SKIPPED and "does not type-check" in decisions[0].reason
    assert "residual must be exactly" in decisions[0].reason
    program = residual_linear(x_shape=(5, 16), r_shape=(2, 5, 8))  # the sum is larger than the product
    out, decisions = optimize(program, target=ALL, passes=[fuse_linear_residual])
    assert out is program and decisions[0].verdict == SKIPPED


def test_of_two_linears_the_second_single_use_one_is_absorbed() -> None:
    b = ProgramBuilder("two")
    x = b.input("x", (4, 16), "f32")
    shared = b.emit("linear", x, b.param("w1", (8, 16), "f32"))
    own = b.emit("linear", x, b.param("w2", (8, 16), "f32"))
    b.output(b.emit("add", own, shared), shared)  # the second operand is an output: absorb the first
    program = b.build()
    out, decisions = optimize(program, target=ALL, passes=[fuse_linear_residual])
    assert out.op_histogram() == {"linear": 1, "linear_add": 1}
    assert out.nodes[1].operands == ("x", "w2", "%0")
    assert [d.verdict for d in decisions] == [APPLIED]
    inputs, weights = bindings(program)
    assert_bit_identical(interpret(out, inputs, weights), interpret(program, inputs, weights))


def test_skipped_where_the_target_does_not_declare_the_op() -> None:
    program = residual_linear()
    out, decisions = optimize(program, target=NONE, passes=[fuse_linear_residual])
    assert out is program and decisions[0].reason == "target 'bare' does not declare op:linear_add"
    only = TargetProfile(backend="some", device="unit", capabilities=("op:linear_add",))
    assert optimize(program, target=only, passes=[fuse_linear_residual])[0].op_histogram() == {"linear_add": 1}


def test_backends_declare_it_where_it_is_lowered() -> None:
    """CUDA (cuBLASLt's C = r, beta 1) and OpenCL (the GEMM's residual epilogue) lower linear_add, so they
    declare the op; a target that does not declare it keeps the linear and the add, and says why."""
    for backend in ("dif_backend_cuda", "dif_backend_opencl"):
        lower = pytest.importorskip(f"{backend}.lower", reason=f"needs {backend}")
        assert "op:linear_add" in lower.LOWERINGS.op_capabilities()
    program = residual_linear()
    undeclared = TargetProfile(backend="other", device="unit", capabilities=("op:norm_modulate",))
    out, decisions = optimize(program, target=undeclared)
    assert "linear_add" not in out.op_histogram()
    assert decisions[-1].reason == "target 'other' does not declare op:linear_add"


def test_in_the_default_pipeline_after_the_other_fusions() -> None:
    assert [p for p in DEFAULT_PASSES if p.startswith("fuse_")][-1] == "fuse_linear_residual"
    out, _ = optimize(residual_linear(), target=ALL)
    assert out.op_histogram() == {"linear_add": 1}
    b = ProgramBuilder("gated")  # r + gate * linear(..): the gated residual keeps it, no linear_add
    x, r, g = b.input("x", (4, 16), "f32"), b.input("r", (4, 8), "f32"), b.input("g", (4, 8), "f32")
    b.output(b.emit("add", r, b.emit("mul", g, b.emit("linear", x, b.param("w", (8, 16), "f32")))))
    out, _ = optimize(b.build(), target=ALL)
    assert out.op_histogram() == {"gated_residual": 1, "linear": 1}


def test_format_passes_quantize_the_linear_of_a_linear_add_and_fuse_back_the_rest() -> None:
    """The linear of each linear_add is a candidate of the format pass like any other: a weight that is a
    parameter becomes int4_linear + add; a weight given as an input stays a linear and is fused again."""
    target = TargetProfile(
        backend="ref", device="unit", dtypes=("f32", "f16", "u8"), capabilities=("op:*", "format:int4-group")
    )
    b = ProgramBuilder("two-layers")
    h = b.input("h", (16, 64), "f32")
    h = b.emit("add", h, b.emit("linear", h, b.input("wi", (64, 64), "f32")))
    up = b.emit("gelu", b.emit("linear", h, b.param("up", (128, 64), "f32")))
    b.output(b.emit("add", h, b.emit("linear", up, b.param("down", (64, 128), "f32"))))
    program = b.build()
    fused, _ = optimize(program, target=target)
    assert fused.op_histogram() == {"gelu": 1, "linear": 1, "linear_add": 2}
    out, decisions = optimize(fused, target=target, passes=["quantize_int4"])
    assert out.op_histogram() == {"add": 1, "gelu": 1, "int4_linear": 2, "linear_add": 1}
    (kept,) = [n for n in out.nodes if n.op == "linear_add"]
    assert kept.operands == ("h", "wi", "h") and kept.results == fused.nodes[0].results
    assert [d.verdict for d in decisions] == [SKIPPED, APPLIED, APPLIED]
    assert decisions[0].reason == "the weight is not a 2-D parameter"
    again, _ = optimize(program, target=target, passes=[*DEFAULT_PASSES, "quantize_int4"])
    assert again.op_histogram() == out.op_histogram()


def test_the_w8a8_pass_quantizes_a_glu_feeding_a_linear_add() -> None:
    """h + down(glu(up(h))): the GLU's only reader is the down projection's linear once the linear_add is split,
    so fp8 makes glu_quant + scaled_linear and keeps the residual add."""
    target = TargetProfile(
        backend="ref", device="unit", dtypes=("f32", "bf16", "f8e4m3"), capabilities=("op:*", "format:fp8-e4m3")
    )
    b = ProgramBuilder("mlp")
    h = b.input("h", (16, 64), "bf16")
    g = b.emit("glu", b.emit("linear", h, b.param("up", (256, 64), "bf16")), act="silu")
    b.output(b.emit("add", h, b.emit("linear", g, b.param("down", (64, 128), "bf16"))))
    fused, _ = optimize(b.build(), target=target)
    assert fused.op_histogram() == {"glu": 1, "linear": 1, "linear_add": 1}
    out, decisions = optimize(fused, target=target, passes=["quantize_fp8"])
    assert out.op_histogram() == {"add": 1, "glu_quant": 1, "linear": 1, "scaled_linear": 1}
    applied, skipped = ([d for d in decisions if d.verdict == v] for v in (APPLIED, SKIPPED))
    assert [d.reason for d in applied] == ["glu + linear -> glu_quant + scaled_linear (fp8-e4m3)"]
    assert len(skipped) == 1  # the up projection: 256 outputs do not pay for quantizing the input h
