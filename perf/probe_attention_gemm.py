"""Library ceilings for the klein denoiser's shapes on this GPU, next to torch's own kernels (one call):

- cuDNN SDPA (B1 H32 S4608 D128 bf16) for the token strides dif's plan gives it (q/k packed, v inside the
  QKV GEMM output, o inside the out-projection input) and for the contiguous layouts, every execution plan
  of heuristic modes A, B and FALLBACK; torch's flash and cuDNN SDPA on the same data.
- cuBLASLt (dif's `LtMatmul`) on every distinct klein-9B GEMM: the first 8 and the first 32 heuristic
  candidates, against torch's `x @ w.T`.
- One GEMM's candidates alone and back to back (power-limited clocks), and the choice `tuning.fastest` makes;
  dif's cuDNN SDPA step alone and back to back.
- The gated-residual epilogue `y = x + gate * (a @ w^T)` as one cuDNN matmul + pointwise graph. (cuBLASLt
  cannot: its per-row alpha vector pointer mode answers CUBLAS_STATUS_NOT_SUPPORTED for bf16 on the H200.)

Usage: python3 perf/probe_attention_gemm.py --out probe.json  (needs a GPU, torch, cupy, nvmath, cudnn)
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dif_device_bridge import Device  # noqa: E402

REPS = 15
GPU = Device("cuda")


def timed(fn: Callable[[], Any], reps: int = REPS) -> float:
    """Median milliseconds of `fn` on the legacy default stream (shared by torch and dif's steps)."""
    return GPU.torch_median(fn, reps, 3)[0]


def sdpa_layouts(s: int, h: int, d: int) -> dict[str, tuple[int, int, int, int]]:
    """Token strides (elements) of q, k, v, o as dif's klein plan lays them out, and packed."""
    hd = h * d
    return {
        "packed BSHD": (hd, hd, hd, hd),
        "single block (v in QKV+MLP out, o in out-proj in)": (hd, hd, 3 * hd + 2 * 3 * hd, hd + 3 * hd),
        "double block (v in QKV out)": (hd, hd, 3 * hd, hd),
        "all in QKV out": (3 * hd, 3 * hd, 3 * hd, hd),
    }


def probe_sdpa(s: int, h: int, d: int) -> dict[str, Any]:
    import cudnn
    import cupy
    import torch

    from dif_backend_cuda.sdpa import CudnnContext

    ctx = CudnnContext(cupy.cuda.Stream.null)
    out: dict[str, Any] = {"shape": f"B1 H{h} S{s} D{d} bf16", "tflop": 4 * s * s * d * h / 1e12}
    scale = 1 / math.sqrt(d)
    attention = torch.nn.functional.scaled_dot_product_attention
    bufs: dict[str, Any] = {}
    for name, (qt, kt, vt, ot) in sdpa_layouts(s, h, d).items():
        q, k, v = (torch.randn(s, t, device="cuda", dtype=torch.bfloat16) for t in (qt, kt, vt))
        o = torch.zeros(s, ot, device="cuda", dtype=torch.bfloat16)
        bufs[name] = (q, k, v, o)
        row: dict[str, Any] = {}
        for mode in ("A", "B", "FALLBACK"):
            g = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                              compute_data_type=cudnn.data_type.FLOAT, handle=ctx.handle)  # fmt: skip
            dt = cudnn.data_type.BFLOAT16

            def bshd(n: str, t: int, g: Any = g, dt: Any = dt) -> Any:
                return g.tensor(name=n, dim=[1, h, s, d], stride=[s * t, d, t, 1], data_type=dt)

            tq, tk, tv = bshd("q", qt), bshd("k", kt), bshd("v", vt)
            o_t, _ = g.sdpa(name="sdpa", q=tq, k=tk, v=tv, attn_scale=scale, generate_stats=False)
            o_t.set_output(True).set_dim([1, h, s, d]).set_stride([s * ot, d, ot, 1]).set_data_type(dt)
            try:
                g.validate()
                g.build_operation_graph()
                g.create_execution_plans([getattr(cudnn.heur_mode, mode)])
                g.check_support()
                count = int(g.get_execution_plan_count())
            except Exception as exc:  # noqa: BLE001 - a mode with no plan is a finding, not a failure
                row[mode] = f"{type(exc).__name__}: {str(exc)[:160]}"
                continue
            plans = []
            pack = {tq: q.data_ptr(), tk: k.data_ptr(), tv: v.data_ptr(), o_t: o.data_ptr()}
            for i in range(count):
                try:
                    g.build_plan_at_index(i)
                    ws = cupy.cuda.Memory(max(1, int(g.get_workspace_size())))
                    ms = timed(lambda g=g, pack=pack, ws=ws: g.execute(pack, ws.ptr, handle=ctx.handle))
                    plans.append(round(ms, 4))
                except Exception as exc:  # noqa: BLE001
                    plans.append(f"{type(exc).__name__}: {str(exc)[:80]}")
            row[mode] = plans
        got = o[:, : h * d].float()
        qv, kv, vv = (t[:, : h * d].view(1, s, h, d).transpose(1, 2) for t in (q, k, v))
        want = attention(qv, kv, vv).transpose(1, 2).reshape(s, h * d)
        row["max_abs_vs_torch"] = float((got - want.float()).abs().max())
        for backend in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
            from torch.nn.attention import SDPBackend, sdpa_kernel

            try:
                with sdpa_kernel(getattr(SDPBackend, backend)):
                    row[f"torch {backend}"] = round(timed(lambda qv=qv, kv=kv, vv=vv: attention(qv, kv, vv)), 4)
            except Exception as exc:  # noqa: BLE001
                row[f"torch {backend}"] = f"{type(exc).__name__}: {str(exc)[:80]}"
        out[name] = row
        print(name, json.dumps(row), flush=True)
    return out


KLEIN_9B_GEMMS = [  # (rows, k, out, count per forward)
    (4608, 4096, 36864, 24),
    (4608, 16384, 4096, 24),
    (4096, 4096, 12288, 8),
    (4096, 4096, 4096, 8),
    (4096, 4096, 24576, 8),
    (4096, 12288, 4096, 8),
    (512, 4096, 12288, 8),
    (512, 4096, 4096, 8),
    (512, 4096, 24576, 8),
    (512, 12288, 4096, 8),
]


def probe_gemms() -> dict[str, Any]:
    import cupy
    import torch

    from dif.dtypes import DType
    from dif_backend_cuda import gemm

    stream = cupy.cuda.Stream.null
    lt = gemm.LtContext(64 << 20)
    rows_out = []
    total = {"lt8": 0.0, "lt32": 0.0, "torch": 0.0}
    for rows, k, n, count in KLEIN_9B_GEMMS:
        x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
        y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
        prob = gemm.linear_problem(DType.BF16, x.data_ptr(), w.data_ptr(), y.data_ptr(), 0, rows, k, n)
        gemm.TUNE_CANDIDATES = 32
        step = gemm.LtMatmul(lt, prob)
        per = []
        for choice in range(step.candidates):
            step.choice = choice
            try:
                per.append(timed(lambda step=step: step(stream), reps=7))
            except Exception:  # noqa: BLE001
                per.append(float("inf"))
        lt8, lt32 = min(per[:8]), min(per)
        th = timed(lambda x=x, w=w: torch.matmul(x, w.t()))
        flop = 2 * rows * k * n
        row = {"shape": f"{rows}x{k}->{n}", "count": count, "candidates": step.candidates,
               "lt8_ms": round(lt8, 4), "lt32_ms": round(lt32, 4), "best_index": per.index(lt32),
               "torch_ms": round(th, 4), "lt32_tflops": round(flop / lt32 / 1e9, 1),
               "torch_tflops": round(flop / th / 1e9, 1)}  # fmt: skip
        for key, ms in (("lt8", lt8), ("lt32", lt32), ("torch", th)):
            total[key] += ms * count
        rows_out.append(row)
        print(json.dumps(row), flush=True)
    return {"gemms": rows_out, "forward_total_ms": {k: round(v, 2) for k, v in total.items()}}


def probe_sustained(rows: int = 4608, k: int = 4096, n: int = 36864, calls: int = 60) -> dict[str, Any]:
    """Every cuBLASLt candidate of one GEMM timed alone (median of single calls) and back to back (`calls`
    in a row, as a forward runs them at the power limit): does the ranking change?"""
    import cupy
    import torch

    from dif.dtypes import DType
    from dif_backend_cuda import gemm

    stream = cupy.cuda.Stream.null
    lt = gemm.LtContext(64 << 20)
    x = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
    y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    step = gemm.LtMatmul(lt, gemm.linear_problem(DType.BF16, x.data_ptr(), w.data_ptr(), y.data_ptr(), 0, rows, k, n))

    def run(choice: int) -> None:
        step.choice = choice
        step(stream)

    single, sustained = [], []
    for choice in range(step.candidates):
        single.append(round(timed(lambda choice=choice: run(choice)), 4))
        sustained.append(round(timed(lambda choice=choice: [run(choice) for _ in range(calls)], reps=3) / calls, 4))
    from dif_backend_cuda.tuning import fastest

    chosen, ms = fastest(run, step.candidates, stream)
    res = {"shape": f"{rows}x{k}->{n}", "single_ms": single, "sustained_ms": sustained,
           "tuning_choice": chosen, "tuning_ms": round(ms, 4)}  # fmt: skip
    print(json.dumps(res), flush=True)
    return res


def probe_sdpa_sustained(s: int = 4608, h: int = 32, d: int = 128, calls: int = 40) -> dict[str, Any]:
    """dif's cuDNN SDPA step (klein single-block strides, tuned plan) alone and `calls` back to back."""
    import cupy
    import torch

    from dif.dtypes import DType
    from dif_backend_cuda.sdpa import CudnnContext, CudnnSdpa

    ctx = CudnnContext(cupy.cuda.Stream.null)
    strides = list(sdpa_layouts(s, h, d)["single block (v in QKV+MLP out, o in out-proj in)"])
    q, k, v = (torch.randn(s, t, device="cuda", dtype=torch.bfloat16) for t in strides[:3])
    o = torch.zeros(s, strides[3], device="cuda", dtype=torch.bfloat16)
    step = CudnnSdpa(ctx, DType.BF16, 1, s, s, h, h, d, q.data_ptr(), k.data_ptr(), v.data_ptr(), o.data_ptr(),
                     1 / math.sqrt(d), False, strides)  # fmt: skip
    stream = cupy.cuda.Stream.null
    single = timed(lambda: step(stream))
    sustained = timed(lambda: [step(stream) for _ in range(calls)], reps=3) / calls
    res = {"choice": step.choice, "single_ms": round(single, 4), "sustained_ms": round(sustained, 4),
           "sustained_tflops": round(4 * s * s * d * h / sustained / 1e9, 1)}  # fmt: skip
    print(json.dumps(res), flush=True)
    return res


def probe_cudnn_matmul_fusion(rows: int = 4608, k: int = 16384, n: int = 4096) -> dict[str, Any]:
    """y = x + gate * (a @ w^T) as one cuDNN graph (matmul, then pointwise mul and add in its epilogue):
    every plan's time and error, next to the bare GEMM (cuBLASLt through torch)."""
    import cudnn
    import cupy
    import torch

    from dif_backend_cuda.sdpa import CudnnContext

    ctx = CudnnContext(cupy.cuda.Stream.null)
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / math.sqrt(k)
    x = torch.randn(rows, n, device="cuda", dtype=torch.bfloat16)
    gate = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    y = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    res: dict[str, Any] = {"shape": f"{rows}x{k}->{n}", "torch_gemm_ms": round(timed(lambda: a @ w.t()), 4)}
    bf16, f32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
    try:
        g = cudnn.pygraph(io_data_type=bf16, intermediate_data_type=f32, compute_data_type=f32, handle=ctx.handle)
        ta = g.tensor(name="a", dim=[1, rows, k], stride=[rows * k, k, 1], data_type=bf16)
        tw = g.tensor(name="wt", dim=[1, k, n], stride=[n * k, 1, k], data_type=bf16)
        tg = g.tensor(name="gate", dim=[1, 1, n], stride=[n, n, 1], data_type=bf16)
        tx = g.tensor(name="x", dim=[1, rows, n], stride=[rows * n, n, 1], data_type=bf16)
        mm = g.matmul(name="mm", A=ta, B=tw, compute_data_type=f32)
        mm.set_data_type(f32)
        scaled = g.mul(name="gate_mul", a=mm, b=tg, compute_data_type=f32)
        scaled.set_data_type(f32)
        out = g.add(name="residual", a=scaled, b=tx, compute_data_type=f32)
        out.set_output(True).set_data_type(bf16).set_dim([1, rows, n]).set_stride([rows * n, n, 1])
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        count = int(g.get_execution_plan_count())
        g.build_plans(cudnn.build_plan_policy.ALL)
        pack = {ta: a.data_ptr(), tw: w.data_ptr(), tg: gate.data_ptr(), tx: x.data_ptr(), out: y.data_ptr()}
        want = x.float() + gate.float() * (a.float() @ w.float().t())
        plans = []
        for i in range(count):
            try:
                ws = cupy.cuda.Memory(max(1, int(g.get_workspace_size_plan_at_index(i))))
                g.execute_plan_at_index(pack, ws.ptr, i, handle=ctx.handle)
                torch.cuda.synchronize()
                err = float((y.float() - want).norm() / want.norm())
                ms = timed(lambda i=i, ws=ws: g.execute_plan_at_index(pack, ws.ptr, i, handle=ctx.handle))
                plans.append({"ms": round(ms, 4), "rel_l2": err, "name": str(g.get_plan_name_at_index(i))})
            except Exception as exc:  # noqa: BLE001
                plans.append(f"{type(exc).__name__}: {str(exc)[:120]}")
        res["plans"] = plans
    except Exception as exc:  # noqa: BLE001 - unsupported on this library is the finding
        res["error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    print(json.dumps(res), flush=True)
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="probe_attention_gemm.json")
    ap.add_argument("--parts", default="sdpa,gemm,sustained,fusion")
    args = ap.parse_args()
    import torch

    result: dict[str, Any] = {"device": torch.cuda.get_device_name()}
    parts = args.parts.split(",")
    if "sustained" in parts:
        result["sustained"] = probe_sustained()
    if "sdpa_sustained" in parts:
        result["sdpa_sustained"] = probe_sdpa_sustained()
    if "fusion" in parts:
        result["cudnn_matmul_fusion"] = probe_cudnn_matmul_fusion()
    if "sdpa" in parts:
        result["sdpa"] = probe_sdpa(4608, 32, 128)
    if "gemm" in parts:
        result["gemm"] = probe_gemms()
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
