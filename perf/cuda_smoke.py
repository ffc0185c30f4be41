"""One device call's worth of checks for dif-backend-cuda: probe, NVRTC compile (+ disk cache reload),
the conformance kit at f32/bf16 on every kernel path, a tiny FLUX.2 transformer against the CPU
backend, and CUDA-event timings of the main kernels (library vs portable path, results compared).

Usage (on the GPU machine, repo root):  python3 perf/cuda_smoke.py [--flux2-4b]
Writes $OUT/cuda_smoke.json (or perf/results/cuda_smoke.json) and prints a summary table last.
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from denoiser_models import CONFIGS  # noqa: E402
from dif_device_bridge import cuda_event_times  # noqa: E402

from dif.dtypes import DType  # noqa: E402
from dif.ir.builder import ProgramBuilder  # noqa: E402
from dif.plan.planner import plan_program  # noqa: E402

REPORT: dict[str, Any] = {"sections": {}}


def section(name: str):  # type: ignore[no-untyped-def]
    def wrap(fn):  # type: ignore[no-untyped-def]
        def run(*args: Any) -> Any:
            t0 = time.perf_counter()
            try:
                out = fn(*args)
                REPORT["sections"][name] = {"ok": True, "seconds": round(time.perf_counter() - t0, 2), "result": out}
                return out
            except Exception as exc:
                REPORT["sections"][name] = {
                    "ok": False,
                    "seconds": round(time.perf_counter() - t0, 2),
                    "error": f"{type(exc).__name__}: {exc}"[:2000],
                    "traceback": traceback.format_exc()[-3000:],
                }
                print(f"[{name}] FAILED: {type(exc).__name__}: {exc}", flush=True)
                return None

        return run

    return wrap


@section("probe")
def probe() -> dict[str, Any]:
    from dif_backend_cuda.device import cuda_availability, probe_budget, probe_profile

    avail = cuda_availability()
    return {
        "available": avail.ok,
        "reason": avail.reason,
        "profile": probe_profile().to_dict(),
        "budget": probe_budget().to_dict(),
    }


SMOKE_KERNELS = [
    ("elementwise", "binary_add_bf16"),
    ("elementwise", "unary_silu_bf16"),
    ("norm", "rms_norm_bf16_bf16"),
    ("layout", "strided_copy_u16"),
    ("linalg", "gemm_bf16"),
    ("attention", "flash_attn_bf16"),
]


@section("compile")
def compile_kernels() -> dict[str, Any]:
    """A few kernels compiled cold (one NVRTC program each, in parallel), then found in the cache."""
    from dif_backend_cuda.device import CudaBackend
    from dif_backend_cuda.kernels import KernelCache

    be = CudaBackend()
    t0 = time.perf_counter()
    be.kernels.warm(SMOKE_KERNELS)
    cold = time.perf_counter() - t0
    again = KernelCache(be.kernels.arch)
    t0 = time.perf_counter()
    again.warm(SMOKE_KERNELS)
    return {
        "cold_s": round(cold, 2),
        "cached_s": round(time.perf_counter() - t0, 3),
        "cold": be.kernels.stats,
        "cached": again.stats,
    }


@section("conformance")
def conformance() -> dict[str, Any]:
    from dif.testing.conformance import run_conformance
    from dif_backend_cuda.device import CudaBackend

    out = {}
    variants = {
        "default": ({}, None),
        "portable": ({"gemm": "nvrtc", "sdpa": "flash"}, ["linear", "matmul", "sdpa", "conv2d"]),
        "eager": ({"graph": False}, None),
    }
    for name, (options, ops) in variants.items():
        t0 = time.perf_counter()
        report = run_conformance(CudaBackend(**options), ops=ops, dtypes=(DType.F32, DType.BF16))
        counts: dict[str, dict[str, int]] = {}
        for r in report.results:
            counts.setdefault(r.dtype.value, {}).setdefault(r.status, 0)
            counts[r.dtype.value][r.status] += 1
        out[name] = {
            "counts": counts,
            "failures": [r.line() for r in report.failures][:60],
            "seconds": round(time.perf_counter() - t0, 2),
        }
        print(f"conformance[{name}]: {counts}", flush=True)
        for line in out[name]["failures"][:25]:
            print("   ", line, flush=True)
    return out


def _extra_cases(dt: DType) -> list[tuple[str, tuple[np.ndarray, ...], dict[str, Any]]]:
    """Shapes the op table's own cases do not reach: long rows (register-cached and looping norm paths),
    widened copies, large broadcasts, real attention head sizes."""
    rng = np.random.default_rng(7)

    def r(*shape: int) -> np.ndarray:
        return _rand(rng, shape, dt)

    mask = np.ones((2, 300), bool)
    mask[1, 200:] = False
    cos = rng.uniform(-1, 1, (300, 128)).astype(np.float32)
    return [
        ("rms_norm", (r(64, 3072), (1 + 0.1 * r(3072)).astype(dt.np)), {}),
        ("rms_norm", (r(4, 20000), r(20000)), {"round_before_weight": True}),
        ("rms_norm", (r(1, 300, 24, 128), (1 + 0.1 * r(128)).astype(dt.np)), {}),
        ("rms_norm", (r(3, 7, 256), r(256)), {"round_before_weight": True, "offset": 1.0}),
        ("mul", (r(2, 300, 3072), r(2, 1, 3072)), {}),
        ("modulate", (r(2, 3, 5, 64), r(3, 1, 64), r(2, 1, 5, 1)), {}),
        ("add", (r(2, 3, 4, 5, 6, 7), r(3, 1, 5, 1, 7)), {}),
        ("layer_norm", (r(64, 3072), r(3072), r(3072)), {"eps": 1e-6}),
        ("layer_norm", (r(3, 9000),), {}),
        ("softmax", (r(16, 5000),), {}),
        ("modulate", (r(2, 300, 3072), r(2, 1, 3072), r(2, 1, 3072)), {}),
        ("add", (r(4608, 3072), r(3072)), {}),
        ("concat", (r(2, 64, 24, 128), r(2, 512, 24, 128)), {"axis": 1}),
        ("split", (r(4, 100, 9216),), {"axis": -1, "sizes": (3072, 3072, 3072)}),
        ("transpose", (r(2, 64, 24, 128),), {"perm": (0, 2, 1, 3)}),
        ("glu", (r(64, 18432),), {"act": "silu"}),
        ("rope", (r(1, 300, 24, 128), cos, np.sqrt(1 - cos**2)), {"mode": "pairs"}),
        ("linear", (r(300, 3072), (0.02 * r(512, 3072)).astype(dt.np), r(512)), {}),
        ("sdpa", (r(1, 300, 24, 128), r(1, 300, 24, 128), r(1, 300, 24, 128)), {}),
        ("sdpa", (r(2, 300, 8, 128), r(2, 300, 2, 128), r(2, 300, 2, 128), mask), {}),
        ("reduce_mean", (r(8, 3000, 64),), {"axes": (1,)}),
    ]


@section("extra_cases")
def extra_cases() -> dict[str, Any]:
    from dif.ops.registry import Case
    from dif.testing.conformance import ConformanceCase, run_case
    from dif_backend_cuda.device import CudaBackend

    be = CudaBackend()
    out: dict[str, Any] = {"failures": []}
    for dt in (DType.F32, DType.BF16):
        passed = 0
        for i, (op, operands, attrs) in enumerate(_extra_cases(dt)):
            res = run_case(be, ConformanceCase(op, dt, Case(f"extra{i}", operands, attrs)))
            passed += res.status == "pass"
            if res.status != "pass":
                out["failures"].append(res.line())
                print("   ", res.line()[:400], flush=True)
        out[dt.value] = f"{passed}/{len(_extra_cases(dt))} pass"
        print(f"extra_cases[{dt.value}]: {out[dt.value]}", flush=True)
    return out


def _rand(rng: np.random.Generator, shape: tuple[int, ...], dtype: DType, scale: float = 1.0) -> np.ndarray:
    return (rng.standard_normal(shape, dtype=np.float32) * scale).astype(dtype.np)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-30))


@section("flux2_tiny")
def flux2_tiny() -> dict[str, Any]:
    from dif_backend_cpu import CpuBackend
    from dif_backend_cuda.device import CudaBackend
    from dif_frontend_flux2.config import Flux2TransformerConfig
    from dif_frontend_flux2.model import build_transformer, flux2_rope_tables, flux2_timestep_proj

    cfg = Flux2TransformerConfig(
        num_layers=1,
        num_single_layers=2,
        num_attention_heads=2,
        attention_head_dim=32,
        joint_attention_dim=24,
        in_channels=16,
        axes_dims_rope=(8, 8, 8, 8),
    )
    out = {}
    for dt in (DType.F32, DType.BF16):
        program = build_transformer(cfg, batch=1, n_img=16, n_txt=8, dtype=dt)
        rng = np.random.default_rng(0)
        weights = {p.name: _rand(rng, p.type.shape, p.type.dtype, 0.1) for p in program.params}
        cos, sin = flux2_rope_tables(8, 4, 4, axes_dims=cfg.axes_dims_rope)
        inputs = {
            "latents": _rand(rng, (1, 16, 16), dt),
            "text_features": _rand(rng, (1, 8, 24), dt),
            "timestep_proj": flux2_timestep_proj([500.0], dtype=dt),
            "rope_cos": cos,
            "rope_sin": sin,
        }
        results = {}
        for name, be in (("cpu", CpuBackend()), ("cuda", CudaBackend())):
            plan = plan_program(program, be.profile(), be.budget())
            exe = be.prepare(program, plan, weights)
            results[name] = exe.run(inputs)[program.outputs[0]]
            if name == "cuda":
                choices = sorted(set(exe.choices.values()))
                graph = exe.graph is not None
        out[dt.value] = {
            "nodes": len(program.nodes),
            "rel_l2": _rel(results["cuda"], results["cpu"]),
            "max_abs": float(np.abs(results["cuda"].astype(np.float64) - results["cpu"]).max()),
            "paths": choices,
            "graph": graph,
        }
        print(f"flux2_tiny[{dt.value}]: {out[dt.value]}", flush=True)
    return out


def time_ms(exe: Any, iters: int = 20, warm: int = 3) -> float:
    return float(np.median(cuda_event_times(exe, iters, warm)))


def _one_node(op: str, shapes: list[tuple[tuple[int, ...], DType, str]], **attrs: Any) -> Any:
    b = ProgramBuilder(f"bench.{op}")
    operands = [(b.param if kind == "param" else b.input)(f"a{i}", s, dt) for i, (s, dt, kind) in enumerate(shapes)]
    b.output(b.emit(op, *operands, **attrs))
    return b.build()


BENCH = [
    # name, op, operands (shape, dtype, input|param), attrs, flops, bytes, variants
    (
        "linear 4608x3072->9216 bf16",
        "linear",
        [((4608, 3072), DType.BF16, "input"), ((9216, 3072), DType.BF16, "param"), ((9216,), DType.BF16, "param")],
        {},
        2 * 4608 * 3072 * 9216,
        0,
        [{"gemm": "cublaslt"}, {"gemm": "nvrtc"}],
    ),
    (
        "sdpa B1 S4608 H24 D128 bf16",
        "sdpa",
        [((1, 4608, 24, 128), DType.BF16, "input")] * 3,
        {},
        4 * 4608 * 4608 * 24 * 128,
        0,
        [{"sdpa": "cudnn"}, {"sdpa": "flash"}],
    ),
    ("add 4608x3072 bf16", "add", [((4608, 3072), DType.BF16, "input")] * 2, {}, 0, 3 * 4608 * 3072 * 2, [{}]),
    (
        "modulate 1x4608x3072 bf16",
        "modulate",
        [
            ((1, 4608, 3072), DType.BF16, "input"),
            ((1, 1, 3072), DType.BF16, "input"),
            ((1, 1, 3072), DType.BF16, "input"),
        ],
        {},
        0,
        2 * 4608 * 3072 * 2,
        [{}],
    ),
    (
        "rms_norm 110592x128 bf16",
        "rms_norm",
        [((110592, 128), DType.BF16, "input"), ((128,), DType.BF16, "param")],
        {},
        0,
        2 * 110592 * 128 * 2,
        [{}],
    ),
    (
        "layer_norm 4608x3072 bf16",
        "layer_norm",
        [((4608, 3072), DType.BF16, "input")],
        {},
        0,
        2 * 4608 * 3072 * 2,
        [{}],
    ),
    (
        "glu silu 4608x18432 bf16",
        "glu",
        [((4608, 18432), DType.BF16, "input")],
        {"act": "silu"},
        0,
        4608 * 18432 * 2 * 3 // 2,
        [{}],
    ),
    (
        "rope 1x4608x24x128 bf16",
        "rope",
        [
            ((1, 4608, 24, 128), DType.BF16, "input"),
            ((4608, 128), DType.F32, "input"),
            ((4608, 128), DType.F32, "input"),
        ],
        {"mode": "pairs"},
        0,
        2 * 4608 * 24 * 128 * 2,
        [{}],
    ),
    (
        "conv2d 1x128x256x256 k3 bf16",
        "conv2d",
        [
            ((1, 128, 256, 256), DType.BF16, "input"),
            ((128, 128, 3, 3), DType.BF16, "param"),
            ((128,), DType.BF16, "param"),
        ],
        {"padding": (1, 1, 1, 1)},
        2 * 128 * 128 * 9 * 256 * 256,
        0,
        [{}],
    ),
]


@section("bench")
def bench() -> list[dict[str, Any]]:
    from dif_backend_cuda.device import CudaBackend

    rows = []
    for name, op, shapes, attrs, flops, nbytes, variants in BENCH:
        program = _one_node(op, shapes, **attrs)
        rng = np.random.default_rng(1)
        inputs = {v.name: _rand(rng, v.type.shape, v.type.dtype, 0.5) for v in program.inputs}
        weights = {v.name: _rand(rng, v.type.shape, v.type.dtype, 0.05) for v in program.params}
        results = []
        for opts in variants:
            be = CudaBackend(**opts)
            try:
                exe = be.prepare(program, plan_program(program, be.profile(), be.budget()), weights)
                y = exe.run(inputs)[program.outputs[0]]
                ms = time_ms(exe)
            except Exception as exc:
                rows.append({"name": name, "variant": opts, "error": f"{type(exc).__name__}: {exc}"[:500]})
                continue
            row = {
                "name": name,
                "variant": opts,
                "ms": round(ms, 4),
                "path": sorted(set(exe.choices.values())),
                "graph": exe.graph is not None,
            }
            if flops:
                row["tflops"] = round(flops / ms / 1e9, 1)
            if nbytes:
                row["gbps"] = round(nbytes / ms / 1e6, 1)
            if results:
                row["rel_l2_vs_first"] = _rel(y, results[0])
            results.append(y)
            finite = bool(np.isfinite(y.astype(np.float32)).all())
            row["finite"] = finite
            rows.append(row)
            print(f"bench: {row}", flush=True)
            del exe
    return rows


@section("flux2_4b")
def flux2_4b() -> dict[str, Any]:
    """Full-size FLUX.2 klein 4B transformer forward (1024x1024: 4096 image + 512 text tokens), random bf16."""
    from dif_backend_cuda.device import CudaBackend
    from dif_frontend_flux2.config import Flux2TransformerConfig
    from dif_frontend_flux2.model import build_transformer, flux2_rope_tables, flux2_timestep_proj

    cfg = Flux2TransformerConfig.from_dict(CONFIGS["klein-4b"])  # its transformer/config.json
    t0 = time.perf_counter()
    program = build_transformer(cfg, batch=1, n_img=4096, n_txt=512, dtype=DType.BF16)
    built = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    biggest = max(p.type.numel for p in program.params)
    pool = (rng.standard_normal(biggest + 4099, dtype=np.float32) * 0.02).astype(DType.BF16.np)
    weights = {}
    for i, p in enumerate(program.params):  # views into one random pool, shifted per tensor: no 8 GB host fill
        start = (i * 7919) % 4099
        weights[p.name] = pool[start : start + p.type.numel].reshape(p.type.shape)
    be = CudaBackend()
    plan = plan_program(program, be.profile(), be.budget())
    exe = be.prepare(program, plan, weights)
    cos, sin = flux2_rope_tables(512, 64, 64, axes_dims=cfg.axes_dims_rope)
    inputs = {
        "latents": _rand(rng, (1, 4096, cfg.in_channels), DType.BF16),
        "text_features": _rand(rng, (1, 512, cfg.joint_attention_dim), DType.BF16),
        "timestep_proj": flux2_timestep_proj([900.0], dtype=DType.BF16),
        "rope_cos": cos,
        "rope_sin": sin,
    }
    y = exe.run(inputs)[program.outputs[0]]
    ms = time_ms(exe, iters=10, warm=2)
    profile = {op: {"ms": round(v["ms"], 3), "steps": v["steps"]} for op, v in exe.profile(iters=3).items()}
    print(f"flux2_4b profile (eager, ms per op): {profile}", flush=True)
    paths: dict[str, int] = {}
    for c in exe.choices.values():
        paths[c] = paths.get(c, 0) + 1
    return {
        "build_s": round(built, 2),
        "nodes": len(program.nodes),
        "arena_gib": round(plan.arena_bytes / 2**30, 2),
        "params_gib": round(plan.param_bytes / 2**30, 2),
        "timings": exe.timings,
        "graph": exe.graph is not None,
        "graph_error": exe.graph_error,
        "forward_ms_median": round(ms, 2),
        "paths": paths,
        "finite": bool(np.isfinite(y.astype(np.float32)).all()),
        "steps": len(exe.steps),
        "profile": profile,
    }


def main() -> int:
    out_dir = Path(os.environ.get("OUT") or "perf/results")
    out_dir.mkdir(parents=True, exist_ok=True)
    probe()
    compile_kernels()
    conf = conformance()
    extra = extra_cases()
    flux2_tiny()
    bench()
    all_pass = bool(conf) and all(not v["failures"] for v in conf.values()) and bool(extra) and not extra["failures"]
    if "--flux2-4b" in sys.argv and all_pass:
        res = flux2_4b()
        print(f"flux2_4b: {res}", flush=True)
    (out_dir / "cuda_smoke.json").write_text(json.dumps(REPORT, indent=1, default=str))
    print("\n== summary ==")
    for name, sec in REPORT["sections"].items():
        status = "ok" if sec["ok"] else "FAILED " + sec["error"][:200]
        print(f"{name:12} {sec['seconds']:>8.1f}s {status}")
    if conf:
        for name, v in conf.items():
            print(f"conformance {name:9} {v['counts']}")
    for row in REPORT["sections"].get("bench", {}).get("result") or []:
        extra = {k: row[k] for k in ("tflops", "gbps", "rel_l2_vs_first", "error") if k in row}
        print(f"{row['name']:32} {json.dumps(row['variant']):22} {row.get('ms', math.nan):>9} ms {extra}")
    return 0 if all_pass else 1


if __name__ == "__main__":
    sys.exit(main())
