"""dif's conformance kit on one OpenCL device (e.g. NVIDIA's platform on the H200), counted into JSON.

Every op case at f32 / bf16 / f16 against the reference interpreter (kernels only: host evaluation
off), f32 also against float64, and the unfused attention / im2col paths. Benchmark-side check, the
same cases `pytest dif-backend-opencl/tests/test_conformance.py` runs on the default device.

Usage:  python3 perf/opencl_conformance.py --device NVIDIA --out $OUT/opencl_conformance_h200.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

from dif.dtypes import DType
from dif.testing.conformance import ConformanceReport, run_conformance

UNFUSED_OPS = ("sdpa", "conv2d")


def tally(report: ConformanceReport) -> dict[str, Any]:
    counts: dict[str, dict[str, dict[str, int]]] = {}
    for r in report.results:
        per = counts.setdefault(r.dtype.value, {}).setdefault(r.check, {})
        per[r.status] = per.get(r.status, 0) + 1
    return {"counts": counts, "failures": [r.line()[:400] for r in report.failures][:60]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default=None, help="'P:D' or a platform/device name substring")
    ap.add_argument("--dtypes", default="f32,bf16,f16")
    ap.add_argument("--ops", default=None, help="comma-separated subset (default: the whole table)")
    ap.add_argument("--out", default="perf/results/opencl_conformance.json")
    args = ap.parse_args()
    from dif_backend_opencl.device import OpenCLBackend
    from dif_backend_opencl.lower import LowerOptions

    dtypes = [DType(d) for d in args.dtypes.split(",")]
    ops = args.ops.split(",") if args.ops else None
    backend = OpenCLBackend(args.device, host_eval_max_bytes=0)
    result: dict[str, Any] = {
        "device": backend.info.name,
        "platform": backend.info.platform,
        "profile": backend.profile().to_dict(),
        "parts": {},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    unfused = LowerOptions(fused_attention_max_dim=0, conv3x3_direct=False, scratch_cap_bytes=512)
    parts = [
        ("f32_with_float64", backend, ops, [d for d in dtypes if d == DType.F32], True),
        ("low_precision", backend, ops, [d for d in dtypes if d != DType.F32], False),
        ("unfused_paths", OpenCLBackend(args.device, host_eval_max_bytes=0, options=unfused),
         [o for o in UNFUSED_OPS if ops is None or o in ops], dtypes, False),
    ]  # fmt: skip
    total = {"pass": 0, "fail": 0, "error": 0, "unsupported": 0}
    for name, be, part_ops, part_dtypes, f64 in parts:
        if not part_dtypes or not part_ops and ops is not None:
            continue
        t0 = time.perf_counter()
        report = run_conformance(be, ops=part_ops, dtypes=part_dtypes, float64=f64)
        part = tally(report) | {"seconds": round(time.perf_counter() - t0, 1)}
        result["parts"][name] = part
        for r in report.results:
            total[r.status] += 1
        result["total"] = total
        out.write_text(json.dumps(result, indent=1))
        print(f"{name}: {part['counts']} ({part['seconds']} s)", flush=True)
        for line in part["failures"][:20]:
            print("   ", line, flush=True)
    print(f"conformance on {result['platform']} / {result['device']}: {total}")
    return 0 if total["fail"] == total["error"] == 0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
