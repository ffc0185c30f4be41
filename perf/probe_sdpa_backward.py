"""cuDNN's flash-attention backward as dif runs it (`dif_backend_cuda.sdpa.CudnnSdpaBackward`), its two graphs
timed apart at klein-9B's 1024² attention (B1, 4,608 tokens, 32 heads of 128, bf16): the forward with
statistics (what reusing the forward's statistics would save), the backward in cuDNN's deterministic and
default algorithms, and the plain forward for scale. Checks the gradients of both algorithms against each
other. Usage (GPU machine): python3 perf/probe_sdpa_backward.py [--tokens 4608] --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def main() -> None:
    import cupy

    from dif.dtypes import DType
    from dif_backend_cuda.device import CudaBackend
    from dif_backend_cuda.sdpa import CudnnSdpa, CudnnSdpaBackward

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4608)
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    backend = CudaBackend()
    ctx = backend.cudnn()
    s, h, d = args.tokens, args.heads, args.dim
    rng = cupy.random.default_rng(0)
    names = ("q", "k", "v", "o", "do", "dq", "dk", "dv")
    # bf16 storage: the top halves of fp32 normals (truncated, fine for timing and for comparing two kernels)
    bufs = {n: (rng.standard_normal((1, s, h, d), dtype=cupy.float32).view(cupy.uint32) >> 16).astype(cupy.uint16)
            for n in names}  # fmt: skip
    stats = cupy.zeros((h * s,), cupy.float32)
    ptrs = {n: int(a.data.ptr) for n, a in bufs.items()}
    strides = dict.fromkeys(names, h * d)
    scale = 1.0 / math.sqrt(d)
    forward = CudnnSdpa(ctx, DType.BF16, 1, s, s, h, h, d, ptrs["q"], ptrs["k"], ptrs["v"], ptrs["o"], scale, False,
                        [h * d] * 4)  # fmt: skip
    forward(backend.stream)  # o from q, k, v: the backward's own inputs consistent
    steps = {
        det: CudnnSdpaBackward(ctx, DType.BF16, 1, s, s, h, h, d, ptrs, int(stats.data.ptr), scale, strides, det)
        for det in (True, False)
    }

    def timed(fn) -> float:  # type: ignore[no-untyped-def]
        stream = backend.stream
        for _ in range(3):
            fn()
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        start.record(stream)
        for _ in range(args.iters):
            fn()
        end.record(stream)
        end.synchronize()
        return cupy.cuda.get_elapsed_time(start, end) / args.iters

    report: dict[str, object] = {"tokens": s, "heads": h, "dim": d, "device": backend.profile().device}
    report["forward_ms"] = timed(lambda: forward(backend.stream))
    grads = {}
    for det, step in steps.items():
        label = "deterministic" if det else "default"
        report[f"{label}_choice"] = step.choice
        report[f"{label}_stats_ms"] = timed(lambda st=step: st.recompute(backend.stream))
        report[f"{label}_backward_ms"] = timed(
            lambda st=step: st.backward.graph.execute(st.pack, st.backward.workspace.ptr, handle=ctx.handle)
        )
        report[f"{label}_total_ms"] = timed(lambda st=step: st(backend.stream))
        grads[det] = [(bufs[n].astype(cupy.uint32) << 16).view(cupy.float32) for n in ("dq", "dk", "dv")]
    for i, n in enumerate(("dq", "dk", "dv")):
        a, b = grads[True][i], grads[False][i]
        report[f"{n}_rel_l2_default_vs_deterministic"] = float(cupy.linalg.norm(a - b) / cupy.linalg.norm(a))
    args.out.write_text(json.dumps(report, indent=1))
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
