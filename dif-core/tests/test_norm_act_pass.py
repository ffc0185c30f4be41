"""fuse_group_norm_silu: group_norm -> silu becomes group_norm_silu where the norm's only user is the
silu, is skipped (with the reason) otherwise or when the target lacks the op, and leaves the results
bit-identical under the reference interpreter (f32 and the half dtypes: the fused reference rounds the
norm as the unfused program stores it). The op itself is checked against silu(group_norm) in fp64."""

from __future__ import annotations

import numpy as np
import pytest

from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.ops.registry import OPS
from dif.passes import APPLIED, SKIPPED, optimize
from dif.target import TargetProfile
from dif.testing.rewrites import assert_bit_identical

ALL = TargetProfile(backend="ref", device="unit", capabilities=("op:*",))
NONE = TargetProfile(backend="bare", device="unit")


def resnet_like(dtype: str = "f32", *, second_user: bool = False) -> Program:
    """x [2, 8, 6, 5] -> GN -> silu -> conv 3x3 (+ the norm also added to the output when `second_user`)."""
    b = ProgramBuilder("gn_silu")
    x = b.input("x", (2, 8, 6, 5), dtype)
    w, bias = b.param("norm.weight", (8,), dtype), b.param("norm.bias", (8,), dtype)
    k = b.param("conv.weight", (8, 8, 3, 3), dtype)
    with b.scope(module="m", block="res0", section="norm1", tensors=("norm.weight", "norm.bias")):
        n = b.emit("group_norm", x, w, bias, groups=4, eps=1e-5)
    h = b.emit("silu", n)
    y = b.emit("conv2d", h, k, None, padding=(1, 1, 1, 1))
    b.output(b.emit("add", y, n) if second_user else y)
    return b.build()


@pytest.mark.parametrize("dtype", ["f32", "f16", "bf16"])
def test_applies_and_is_exact(dtype: str) -> None:
    program = resnet_like(dtype)
    out, decisions = optimize(program, target=ALL, passes=["fuse_group_norm_silu"])
    assert out.op_histogram() == {"group_norm_silu": 1, "conv2d": 1}
    assert out.nodes[0].attrs == {"groups": 4, "eps": 1e-5} and out.nodes[0].results == program.nodes[1].results
    assert [d.verdict for d in decisions] == [APPLIED]
    assert out.provenance[0].transforms == ("fuse_group_norm_silu",)
    assert_bit_identical(program, out)


def test_skipped_with_second_user_or_without_the_op() -> None:
    out, decisions = optimize(resnet_like(second_user=True), target=ALL, passes=["fuse_group_norm_silu"])
    assert "group_norm_silu" not in out.op_histogram() and [d.verdict for d in decisions] == [SKIPPED]
    out, decisions = optimize(resnet_like(), target=NONE, passes=["fuse_group_norm_silu"])
    assert "group_norm_silu" not in out.op_histogram()
    assert "op:group_norm_silu" in decisions[0].reason


def test_default_pipeline_includes_it() -> None:
    out, _ = optimize(resnet_like(), target=ALL)
    assert out.op_histogram()["group_norm_silu"] == 1


def test_reference_is_silu_of_group_norm() -> None:
    rng = np.random.default_rng(1)
    x, w, b = rng.standard_normal((2, 12, 5, 3)), rng.standard_normal(12), rng.standard_normal(12)
    g = x.reshape(2, 3, -1)
    n = ((g - g.mean(-1, keepdims=True)) / np.sqrt(g.var(-1, keepdims=True) + 1e-6)).reshape(x.shape)
    n = n * w[None, :, None, None] + b[None, :, None, None]
    want = n / (1 + np.exp(-n))
    got = OPS.get("group_norm_silu").run_reference(
        [a.astype(np.float32) for a in (x, w, b)], {"groups": 3, "eps": 1e-6}
    )
    np.testing.assert_allclose(np.asarray(got[0] if isinstance(got, tuple) else got), want, rtol=2e-5, atol=2e-6)
