"""The backward half of the conformance kit on a backend: every differentiable op case's VJP program
(`dif.testing.backward`) run on the CUDA backend (default) against the reference interpreter at f32
and bf16. Prints failures and writes backward_conformance.json (into --out-dir).

Usage (GPU machine, after `source perf/h200_env.sh`):  python3 perf/train_backward_cuda.py --out-dir "$OUT"
                                             on a CPU:  python3 perf/train_backward_cuda.py --backend cpu
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from pathlib import Path

from dif.dtypes import DType
from dif.testing.backward import differentiable_cases, run_backward_case


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", default="cuda", choices=["cuda", "cpu", "opencl"])
    ap.add_argument("--out-dir", type=Path, default=None)
    args = ap.parse_args()
    if args.backend == "cuda":
        from dif_backend_cuda.device import CudaBackend

        backend = CudaBackend()
    elif args.backend == "opencl":
        from dif_backend_opencl.device import OpenCLBackend  # type: ignore[attr-defined]

        backend = OpenCLBackend()
    else:
        from dif_backend_cpu import CpuBackend

        backend = CpuBackend()
    results = [run_backward_case(backend, c) for c in differentiable_cases(dtypes=(DType.F32, DType.BF16))]
    counts = Counter(r.status for r in results)
    failures = [r.line() for r in results if r.status != "pass"]
    doc = {"backend": args.backend, "cases": len(results), "counts": dict(counts), "failures": failures}
    if args.out_dir is not None:
        args.out_dir.mkdir(parents=True, exist_ok=True)
        (args.out_dir / "backward_conformance.json").write_text(json.dumps(doc, indent=2))
    for line in failures[:40]:
        print(line[:300])
    print(f"backward conformance on {args.backend}: {dict(counts)} of {len(results)} cases")


if __name__ == "__main__":
    main()
