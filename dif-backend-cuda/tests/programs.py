"""Programs the CUDA tests share (no GPU needed to build them)."""

from __future__ import annotations

from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program


def single_block(
    dtype: str = "bf16", *, batch: int = 2, tokens: int = 16, heads: int = 4, hd: int = 128, f: int = 384,
    mode: str = "pairs",
) -> Program:  # fmt: skip
    """A parallel single-stream transformer block's data flow: one projection split (last axis) into q, k,
    v and a gated MLP; q/k head RMS norm + RoPE; attention and GLU outputs concatenated (last axis) into
    the output projection. Planned with views, every split and concat part is a pitched row view."""
    d = heads * hd
    b = ProgramBuilder("single_block")
    x = b.input("x", (batch, tokens, d), dtype)
    cos, sin = b.input("cos", (tokens, hd), "f32"), b.input("sin", (tokens, hd), "f32")
    proj = b.emit("linear", x, b.param("w_in", (3 * d + 2 * f, d), dtype))
    q, k, v, mlp = b.emit_multi("split", proj, axis=-1, sizes=(d, d, d, 2 * f))
    q, k, v = (b.emit("reshape", t, shape=(batch, tokens, heads, hd)) for t in (q, k, v))
    q, k = (
        b.emit("rope", b.emit("rms_norm", t, b.param(f"norm{i}", (hd,), dtype), eps=1e-6), cos, sin, mode=mode)
        for i, t in enumerate((q, k))
    )
    o = b.emit("reshape", b.emit("sdpa", q, k, v), shape=(batch, tokens, d))
    cat = b.emit("concat", o, b.emit("glu", mlp, act="silu", gated_half="first"), axis=-1)
    b.output(b.emit("linear", cat, b.param("w_out", (d, d + f), dtype)))
    return b.build()


PARALLEL = {"a": 128, "f": 384, "d": 256, "out": 1024}
"""parallel_projection_input's widths: attention part, MLP hidden, model width, output projection width."""


def parallel_projection_input() -> Program:
    """A parallel block's output projection over concat(attention part, glu(MLP part)) of one fused projection
    (FLUX.2's single blocks in miniature), its output projection wide enough for the W8A8 passes (1,024 outputs,
    not a program output): quantized, the concat and GLU become one `concat_glu_quant` reading the split's parts."""
    a, f, d, out = PARALLEL["a"], PARALLEL["f"], PARALLEL["d"], PARALLEL["out"]
    b = ProgramBuilder("parallel_fp8")
    proj = b.emit("linear", b.input("x", (2, 16, d), "bf16"), b.param("w_in", (a + 2 * f, d), "bf16"))
    attn, mlp = b.emit_multi("split", proj, axis=-1, sizes=(a, 2 * f))
    cat = b.emit("concat", attn, b.emit("glu", mlp, act="silu", gated_half="first"), axis=-1)
    b.output(b.emit("reshape", b.emit("linear", cat, b.param("w_out", (out, a + f), "bf16")), shape=(32, out)))
    return b.build()
