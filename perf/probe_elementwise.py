"""How close do the CUDA backend's memory-bound kernels come to the H200's bandwidth at klein 9B's shapes?

Each case is a program of `CHAIN` nodes of one op (each reading the previous one's result, or the same input
when the op changes shape), run as dif runs a forward (one CUDA graph), timed by replay: milliseconds per node
and the bytes it must move per second, next to a device-to-device copy of the same bytes. Variants re-plan the
same program with one lowering knob changed (threads per block, the kernel family), to see which launch
shapes a kernel is sensitive to.

Usage: python3 perf/probe_elementwise.py --out probe_elementwise.json  (needs a GPU and cupy)
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from contextlib import contextmanager
from typing import Any

CHAIN = 8
TOKENS = 4608  # klein 9B at 1024x1024: 4096 image + 512 text tokens


def _program(op: str) -> tuple[Any, int]:
    """A chain of `op` at klein 9B's single-block shapes, and the bytes one node must move."""
    from dif.ir.builder import ProgramBuilder

    b = ProgramBuilder(f"chain_{op}")
    d, bf = 4096, 2
    if op == "norm_modulate":
        x = b.input("x", (1, TOKENS, d), "bf16")
        s, t = b.input("s", (1, 1, d), "bf16"), b.input("t", (1, 1, d), "bf16")
        for _ in range(CHAIN):
            x = b.emit("norm_modulate", x, s, t, kind="layer", eps=1e-6)
        moved = 2 * TOKENS * d * bf
    elif op == "gated_residual":
        x, u = b.input("x", (1, TOKENS, d), "bf16"), b.input("u", (1, TOKENS, d), "bf16")
        g = b.input("g", (1, 1, d), "bf16")
        for _ in range(CHAIN):
            x = b.emit("gated_residual", x, g, u)
        moved = 3 * TOKENS * d * bf
    elif op == "rms_norm_rope":
        x = b.input("x", (1, TOKENS, 32, 128), "bf16")
        w = b.input("w", (128,), "bf16")
        cos, sin = b.input("cos", (TOKENS, 128), "f32"), b.input("sin", (TOKENS, 128), "f32")
        for _ in range(CHAIN):
            x = b.emit("rms_norm_rope", x, w, cos, sin, mode="pairs")
        moved = 2 * TOKENS * d * bf + 2 * TOKENS * 128 * 4
    elif op == "glu":
        src = b.input("x", (1, TOKENS, 2 * 12288), "bf16")
        outs = [b.emit("glu", src, act="silu", gated_half="first") for _ in range(CHAIN)]
        x = outs[0]
        for o in outs[1:]:
            b.output(o)
        moved = 3 * TOKENS * 12288 * bf
    elif op == "norm_modulate_quant":  # the W8A8 GEMM inputs: fp8 values and one f32 scale per row
        src = b.input("x", (1, TOKENS, d), "bf16")
        s, t = b.input("s", (1, 1, d), "bf16"), b.input("t", (1, 1, d), "bf16")
        fp8 = {"kind": "layer", "eps": 1e-6, "dtype": "f8e4m3"}
        outs = [b.emit_multi("norm_modulate_quant", src, s, t, **fp8) for _ in range(CHAIN)]
        moved = TOKENS * d * (bf + 1)
    elif op == "quantize_rows":  # the single blocks' output projection input: attention and MLP, 16384 wide
        src = b.input("x", (1, TOKENS, 4 * d), "bf16")
        outs = [b.emit_multi("quantize_rows", src, dtype="f8e4m3") for _ in range(CHAIN)]
        moved = TOKENS * 4 * d * (bf + 1)
    elif op == "glu_quant":
        src = b.input("x", (1, TOKENS, 2 * 12288), "bf16")
        outs = [b.emit_multi("glu_quant", src, act="silu", gated_half="first", dtype="f8e4m3") for _ in range(CHAIN)]
        moved = TOKENS * 12288 * (2 * bf + 1)
    elif op == "concat_glu_quant":  # the same projection input made by one kernel from attention and the MLP
        attn, src = b.input("attn", (1, TOKENS, d), "bf16"), b.input("x", (1, TOKENS, 2 * 12288), "bf16")
        glu_fp8 = {"act": "silu", "gated_half": "first", "dtype": "f8e4m3"}
        outs = [b.emit_multi("concat_glu_quant", attn, src, **glu_fp8) for _ in range(CHAIN)]
        moved = TOKENS * (d * bf + 12288 * 2 * bf + 4 * d)
    elif op == "rms_norm_modulate_quant":  # Krea 2's adaptive norm: 6144 wide, its weight in f32
        src, w = b.input("x", (1, TOKENS, 6144), "bf16"), b.input("w", (6144,), "f32")
        s, t = b.input("s", (1, 1, 6144), "bf16"), b.input("t", (1, 1, 6144), "bf16")
        rmq = {"eps": 1e-5, "offset": 1.0, "dtype": "f8e4m3"}
        outs = [b.emit_multi("rms_norm_modulate_quant", src, w, s, t, **rmq) for _ in range(CHAIN)]
        moved = TOKENS * 6144 * (bf + 1)
    elif op == "act_mul_quant":  # Krea 2's down projection input: silu(gate) * up, 16384 wide
        g, u = b.input("g", (1, TOKENS, 16384), "bf16"), b.input("u", (1, TOKENS, 16384), "bf16")
        outs = [b.emit_multi("act_mul_quant", g, u, act="silu", dtype="f8e4m3") for _ in range(CHAIN)]
        moved = TOKENS * 16384 * (2 * bf + 1)
    else:
        raise ValueError(op)
    if op.endswith("_quant") or op == "quantize_rows":
        for q, scale in outs:
            b.output(q)
            b.output(scale)
        return b.build(), moved
    b.output(x)
    return b.build(), moved


@contextmanager
def knob(module: Any, name: str, value: Any) -> Any:
    old = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, old)


def graph_ms(program: Any, reps: int = 25) -> tuple[float, list[str]]:
    """Median ms of one replay of `program`'s graph, and the kernels it launches."""
    import cupy
    import numpy as np

    from dif.plan.planner import plan_program
    from dif_backend_cuda.device import CudaBackend

    backend = CudaBackend()
    exe = backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), {})
    rng = np.random.default_rng(0)
    exe.run({v.name: rng.standard_normal(v.type.shape).astype(v.type.dtype.np) for v in program.inputs})
    stream = backend.stream
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    for _ in range(5):
        exe.execute()
    times = []
    for _ in range(reps):
        start.record(stream)
        exe.execute()
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times), sorted({getattr(s, "name", s.kind) for s in exe.steps})


def copy_ms(nbytes: int, reps: int = 25) -> float:
    """A device-to-device copy moving `nbytes` in all (half read, half written)."""
    import cupy

    src = cupy.zeros(nbytes // 2, dtype=cupy.uint8)
    dst = cupy.empty_like(src)
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(reps):
        start.record()
        cupy.cuda.runtime.memcpyAsync(dst.data.ptr, src.data.ptr, src.nbytes, 3, 0)
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end))
    return statistics.median(times)


@contextmanager
def rows_option(value: str) -> Any:
    """The CUDA backend built with DIF_CUDA_ROWS=`value` (graph_ms makes a fresh backend per case)."""
    import os

    old = os.environ.get("DIF_CUDA_ROWS")
    os.environ["DIF_CUDA_ROWS"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("DIF_CUDA_ROWS")
        else:
            os.environ["DIF_CUDA_ROWS"] = old


def variants() -> dict[str, list[tuple[str, Callable[[], Any]]]]:
    from dif_backend_cuda.lower import fused as lower_fused
    from dif_backend_cuda.lower import quant as lower_quant

    def plain() -> Any:
        return knob(lower_fused, "THREADS", lower_fused.THREADS)

    def wide(kernel: str) -> Any:  # the register-resident kernel's blocks up to 1024 threads
        return knob(lower_quant, "VEC_THREADS", {**lower_quant.VEC_THREADS, kernel: 1024})

    return {
        "norm_modulate": [
            ("default", plain),
            ("128 threads", lambda: knob(lower_fused, "THREADS", 128)),
            ("64 threads", lambda: knob(lower_fused, "THREADS", 64)),
            ("block per row (vec16)", lambda: knob(lower_fused, "WARP_CHUNKS", ())),
        ],
        "rms_norm_rope": [
            ("default", plain),
            ("4 heads per warp", lambda: knob(lower_fused, "ROPE_ROWS", (4,))),
            ("128 threads", lambda: knob(lower_fused, "THREADS", 128)),
        ],
        "gated_residual": [("default", plain)],
        "glu": [("default", plain)],
        "norm_modulate_quant": [
            ("default", plain),
            ("8 rows a block", lambda: knob(lower_quant, "NMQ_WARPS", 8)),
            ("block per row (vec)", lambda: knob(lower_quant, "NMQ_WARP_CHUNKS", ())),
            ("rows staged", lambda: rows_option("staged")),
        ],
        "quantize_rows": [("default", plain), ("rows staged", lambda: rows_option("staged"))],
        "glu_quant": [
            ("default", plain),
            ("1024 threads", lambda: wide("glu_quant")),
            ("rows staged", lambda: rows_option("staged")),
        ],
        "concat_glu_quant": [
            ("default", plain),
            ("1024 threads", lambda: wide("glu_quant")),
            ("rows staged", lambda: rows_option("staged")),
        ],
        "act_mul_quant": [
            ("default", plain),
            ("1024 threads", lambda: wide("act_mul_quant")),
            ("rows staged", lambda: rows_option("staged")),
        ],
        "rms_norm_modulate_quant": [("default", plain), ("rows staged", lambda: rows_option("staged"))],
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="probe_elementwise.json")
    ap.add_argument("--ops", default="", help="comma-separated ops to probe (default: all)")
    args = ap.parse_args()
    wanted = {o for o in args.ops.split(",") if o}
    result: dict[str, Any] = {"chain": CHAIN, "tokens": TOKENS, "cases": []}
    for op, options in variants().items():
        if wanted and op not in wanted:
            continue
        program, moved = _program(op)
        ref = copy_ms(moved)
        for label, make in options:
            with make():
                ms, kernels = graph_ms(program)
            per = ms / CHAIN
            row = {"op": op, "variant": label, "kernels": kernels, "ms_per_node": round(per, 4),
                   "tb_per_s": round(moved / per / 1e9, 2), "copy_ms": round(ref, 4),
                   "copy_tb_per_s": round(moved / ref / 1e9, 2)}  # fmt: skip
            print(json.dumps(row), flush=True)
            result["cases"].append(row)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
