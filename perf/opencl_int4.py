"""int4-group weight-only linears on an OpenCL device against the bf16 linear they replace, in one run.

For each (rows, in, out) shape: `linear` over a bf16 weight and `int4_linear` over the same weight quantized in
groups of 32 (a GGUF Q4_0 file's blocks) and 128 (`dif opt --formats int4-group`), each a one-node program
whose weights are prepared on the device once, so a run times the GEMM (plus the activation's upload and the
result's download, the same for every variant). Reports the median of `--repeats` runs, the ratio to bf16,
the weight bytes on the device and the result's rel-L2 against the reference interpreter.

Usage:  python3 perf/opencl_int4.py [--device NAME] [--out perf/results/opencl_int4.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.ops.quant import quantize_weight_groups
from dif.plan.planner import plan_program

SHAPES = ((256, 3072, 3072), (1024, 3072, 9216))  # a 4B-class block's projections at 256 / 1024 tokens
GROUPS = (32, 128)


def linear_program(rows: int, k: int, n: int, group: int) -> Program:
    """x [rows, k] bf16 through one linear over a parameter weight (group 0: bf16 `linear`, else int4_linear)."""
    b = ProgramBuilder(f"linear-g{group}")
    x = b.input("x", (rows, k), "bf16")
    if group:
        y = b.emit("int4_linear", x, b.param("wq", (n, k // 2), "u8"), b.param("ws", (n, k // group), "f16"),
                   group_size=group)  # fmt: skip
    else:
        y = b.emit("linear", x, b.param("w", (n, k), "bf16"))
    b.output(y)
    return b.build()


def time_variant(
    backend: Any, program: Program, weights: dict[str, np.ndarray], x: np.ndarray, repeats: int
) -> tuple[float, float]:
    """(median seconds of `repeats` runs after a first one, the result's rel-L2 against the reference)."""
    exe = backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), weights)
    out = program.outputs[0]
    got = exe.run({"x": x})[out]  # the first run builds the kernels
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        exe.run({"x": x})
        seconds.append(time.perf_counter() - start)
    want = interpret(program, {"x": x}, weights)[out]
    g, w = np.asarray(got, np.float64), np.asarray(want, np.float64)
    rel = float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))
    return statistics.median(seconds), rel


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="'P:D' or a platform/device name substring")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default="perf/results/opencl_int4.json")
    args = ap.parse_args()
    from dif_backend_opencl.device import OpenCLBackend

    backend = OpenCLBackend(args.device, host_eval_max_bytes=0)
    rng = np.random.default_rng(0)
    rows_out: list[dict[str, Any]] = []
    for rows, k, n in SHAPES:
        x = rng.standard_normal((rows, k)).astype(ml_dtypes.bfloat16)
        w = (rng.standard_normal((n, k)) / np.sqrt(k)).astype(np.float32)
        variants: dict[str, tuple[Program, dict[str, np.ndarray]]] = {
            "bf16": (linear_program(rows, k, n, 0), {"w": w.astype(ml_dtypes.bfloat16)})
        }
        for g in GROUPS:
            wq, ws = quantize_weight_groups(w, g)
            variants[f"int4-g{g}"] = (linear_program(rows, k, n, g), {"wq": wq, "ws": ws})
        results = {}
        for name, (program, weights) in variants.items():
            median, rel = time_variant(backend, program, weights, x, args.repeats)
            results[name] = {"median_s": median, "weight_bytes": sum(a.nbytes for a in weights.values()),
                             "rel_l2_vs_reference": rel}  # fmt: skip
        base = results["bf16"]
        for r in results.values():
            r["time_vs_bf16"] = r["median_s"] / base["median_s"]
            r["weight_bytes_vs_bf16"] = r["weight_bytes"] / base["weight_bytes"]
        rows_out.append({"rows": rows, "in": k, "out": n, "variants": results})
        print(f"{rows}x{k}->{n}: " + ", ".join(
            f"{name} {r['median_s'] * 1e3:.1f} ms ({r['time_vs_bf16']:.2f}x, weights {r['weight_bytes_vs_bf16']:.2f}x)"
            for name, r in results.items()))  # fmt: skip
    doc = {"device": backend.info.name, "platform": backend.info.platform, "repeats": args.repeats,
           "shapes": rows_out}  # fmt: skip
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc, indent=2) + "\n")
    tmp.replace(out)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
