"""Shared fixtures for dif-core tests: a small program that touches every printer/serializer path."""

from __future__ import annotations

import pytest

from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program


def build_sample(
    name: str = "sample", *, x: str = "x", w: str = "blocks.0.attn.qkv.weight", eps: float = 1e-6
) -> Program:
    """A tiny attention-like program: optional/variadic operands, multi-result split, every attr kind,
    a name that needs quoting, provenance scopes and meta. Value names are parameters so tests can
    build renamed twins."""
    b = ProgramBuilder(name, frontend_revision="test-rev")
    xv = b.input(x, (2, 8, 16), "f32")
    wv = b.param(w, (48, 16), "f32")
    nw = b.param("norm weight", (16,), "f32")
    with b.scope(module="transformer", block="blocks.0", section="attn", tensors=[w]):
        h = b.emit("rms_norm", xv, nw, eps=eps)
        q, k, v = b.emit_multi("split", b.emit("linear", h, wv), axis=-1, sizes=[16, 16, 16])
        q4, k4, v4 = (b.emit("reshape", t, shape=[2, 8, 2, 8]) for t in (q, k, v))
        a = b.emit("reshape", b.emit("sdpa", q4, k4, v4, causal=True), shape=[2, 8, 16])
    with b.scope(section="mlp"):
        g = b.emit("gelu", a, approximate="tanh")
        floor = b.emit("full", shape=[2, 8, 16], value=float("-inf"), dtype="f32")
        z = b.emit("concat", b.emit("maximum", g, floor), xv, axis=-1)
        out = b.emit("cast", b.emit("scalar_affine", z, scale=0.5, bias=-1.0), dtype="bf16")
    b.output(out, k)
    b.meta["model"] = 'tiny "quoted"\n'
    b.meta["steps"] = "4"
    return b.build()


@pytest.fixture
def program() -> Program:
    return build_sample()


@pytest.fixture
def make_program():  # type: ignore[no-untyped-def]
    """`build_sample` itself, for tests that need variants (renamed twins, changed attrs)."""
    return build_sample
