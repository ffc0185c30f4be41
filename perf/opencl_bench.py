"""OpenCL backend micro-benchmarks (PoCL or any OpenCL device): kernel dispatch cost against host
evaluation of tiny ops (which sets `HOST_EVAL_MAX_BYTES_CPU`), GEMM throughput, conv2d 3x3 direct vs
im2col + GEMM, attention fused vs two GEMMs + softmax. Writes JSON to --out and prints a table.

    python perf/opencl_bench.py [--device SELECTOR] [--quick] [--out perf/results/opencl_bench.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ops.registry import OPS
from dif.plan.planner import plan_program
from dif_backend_opencl.device import OpenCLBackend
from dif_backend_opencl.lower import LowerOptions


def _median_time(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up (kernel build, first-touch)
    samples = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t)
    return statistics.median(samples)


def _chain(op: str, n: int, length: int):  # type: ignore[no-untyped-def]
    b = ProgramBuilder(f"chain-{op}-{n}")
    v = b.input("x", (n,), "f32")
    w = b.input("y", (n,), "f32")
    for _ in range(length):
        v = b.emit(op, v, w) if op in ("add", "mul") else b.emit(op, v)
    b.output(v)
    return b.build()


def dispatch(backend: OpenCLBackend, sizes: list[int], length: int, repeat: int) -> list[dict]:
    """Per-node cost of a chain of `length` adds: on the device (one launch each) vs on the host
    (numpy reference + one upload of the chain's result... here: the whole chain on the host)."""
    rows = []
    rng = np.random.default_rng(0)
    for n in sizes:
        program = _chain("add", n, length)
        inputs = {"x": rng.standard_normal(n).astype(np.float32), "y": rng.standard_normal(n).astype(np.float32)}
        saved = backend.host_eval_max_bytes
        backend.host_eval_max_bytes = 0  # the profile's host threshold: the plan places every node on the device
        dev = backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), {})
        t_dev = _median_time(lambda: dev.run(inputs), repeat)  # noqa: B023
        backend.host_eval_max_bytes = 1 << 62  # ... and here every node on the host
        host = backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), {})
        t_host = _median_time(lambda: host.run(inputs), repeat)  # noqa: B023
        backend.host_eval_max_bytes = saved
        want = interpret(program, inputs, {})
        assert np.allclose(dev.run(inputs)[program.outputs[0]], want[program.outputs[0]], rtol=1e-5, atol=1e-5)
        node_bytes = 3 * n * 4
        rows.append({
            "elements": n, "node_bytes": node_bytes,
            "device_us_per_node": 1e6 * t_dev / length, "host_us_per_node": 1e6 * t_host / length,
        })  # fmt: skip
        dev.close()
        host.close()
    return rows


def _bench_program(backend: OpenCLBackend, program, weights, inputs, repeat: int) -> tuple[float, float]:  # type: ignore[no-untyped-def]
    plan = plan_program(program, backend.profile(), backend.budget())
    exe = backend.prepare(program, plan, weights)
    t = _median_time(lambda: exe.run(inputs), repeat)
    got = exe.run(inputs)[program.outputs[0]]
    want = interpret(program, inputs, weights)[program.outputs[0]]
    err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
    exe.close()
    return t, err


def gemm(backend: OpenCLBackend, sizes: list[int], repeat: int) -> list[dict]:
    rows = []
    rng = np.random.default_rng(1)
    for n in sizes:
        b = ProgramBuilder(f"gemm{n}")
        x = b.input("x", (n, n), "f32")
        w = b.param("w", (n, n), "f32")
        b.output(b.emit("linear", x, w))
        program = b.build()
        weights = {"w": rng.standard_normal((n, n)).astype(np.float32)}
        inputs = {"x": rng.standard_normal((n, n)).astype(np.float32)}
        t, err = _bench_program(backend, program, weights, inputs, repeat)
        rows.append({"n": n, "seconds": t, "gflops": 2 * n**3 / t / 1e9, "max_abs_err": err})
    return rows


def conv(backend: OpenCLBackend, shape: tuple[int, int, int], repeat: int) -> list[dict]:
    c, h, w = shape
    rng = np.random.default_rng(2)
    b = ProgramBuilder("conv3x3")
    x = b.input("x", (1, c, h, w), "f32")
    k = b.param("k", (c, c, 3, 3), "f32")
    b.output(b.emit("conv2d", x, k, padding=(1, 1, 1, 1)))
    program = b.build()
    weights = {"k": (rng.standard_normal((c, c, 3, 3)) * 0.1).astype(np.float32)}
    inputs = {"x": rng.standard_normal((1, c, h, w)).astype(np.float32)}
    rows = []
    saved = backend.options
    for direct in (True, False):
        backend.options = LowerOptions(conv3x3_direct=direct)
        t, err = _bench_program(backend, program, weights, inputs, repeat)
        flops = 2 * c * c * 9 * h * w
        rows.append({"path": "direct" if direct else "im2col+gemm", "shape": [c, h, w], "seconds": t,
                     "gflops": flops / t / 1e9, "max_abs_err": err})  # fmt: skip
    backend.options = saved
    return rows


def attention(backend: OpenCLBackend, s: int, heads: int, d: int, repeat: int) -> list[dict]:
    rng = np.random.default_rng(3)
    b = ProgramBuilder("attn")
    q, k, v = (b.input(n, (1, s, heads, d), "f32") for n in "qkv")
    b.output(b.emit("sdpa", q, k, v))
    program = b.build()
    inputs = {n: rng.standard_normal((1, s, heads, d)).astype(np.float32) for n in "qkv"}
    rows = []
    saved = backend.options
    for fused in (True, False):
        backend.options = LowerOptions(fused_attention_max_dim=128 if fused else 0)
        t, err = _bench_program(backend, program, {}, inputs, repeat)
        rows.append({"path": "fused" if fused else "gemm+softmax+gemm", "s": s, "heads": heads, "d": d,
                     "seconds": t, "gflops": 4 * s * s * d * heads / t / 1e9, "max_abs_err": err})  # fmt: skip
    backend.options = saved
    return rows


def threshold(rows: list[dict]) -> int:
    """Largest node size (bytes) at which the host path is still no slower than a dispatch."""
    ok = [r["node_bytes"] for r in rows if r["host_us_per_node"] <= r["device_us_per_node"]]
    return max(ok, default=0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None)
    ap.add_argument("--quick", action="store_true", help="tiny shapes (CI / shared machines)")
    ap.add_argument("--out", default="perf/results/opencl_bench.json")
    args = ap.parse_args()
    backend = OpenCLBackend(args.device, host_eval_max_bytes=0)  # kernels only; dispatch() toggles it
    repeat = 5 if args.quick else 11
    sizes = [16, 64, 256, 1024, 4096, 16384, 65536] if args.quick else [16, 64, 256, 1024, 4096, 16384, 65536, 262144]
    result = {
        "device": backend.profile().to_dict(),
        "ops_in_table": len(OPS),
        "dispatch": dispatch(backend, sizes, 32, repeat),
        "gemm": gemm(backend, [128, 256] if args.quick else [256, 512, 1024], repeat),
        "conv3x3": conv(backend, (32, 32, 32) if args.quick else (64, 64, 64), repeat),
        "attention": attention(backend, 256 if args.quick else 1024, 4, 64, repeat),
    }
    result["host_eval_threshold_bytes"] = threshold(result["dispatch"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    print(f"device: {backend.info.name} ({backend.info.platform})")
    print(f"{'elements':>9} {'node B':>8} {'device us/node':>15} {'host us/node':>13}")
    for r in result["dispatch"]:
        print(
            f"{r['elements']:>9} {r['node_bytes']:>8} {r['device_us_per_node']:>15.1f} {r['host_us_per_node']:>13.1f}"
        )
    print(f"host-eval threshold (host no slower than a dispatch): {result['host_eval_threshold_bytes']} B")
    for r in result["gemm"]:
        print(
            f"gemm {r['n']}^3: {r['seconds'] * 1e3:.2f} ms, {r['gflops']:.1f} GFLOP/s, "
            f"max abs err {r['max_abs_err']:.2g}"
        )
    for r in result["conv3x3"] + result["attention"]:
        print(
            f"{r['path']:>18}: {r['seconds'] * 1e3:.2f} ms, {r['gflops']:.1f} GFLOP/s, "
            f"max abs err {r['max_abs_err']:.2g}"
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
