"""One convolution alone on the CUDA backend, timed as a one-node program (CUDA-graph replay median) beside the
same problem's share of a profiled pipeline: tells a slow cuDNN problem from a slow context (the SD VAE decoder's
256-channel 3x3 convolution at 512^2 took 4.6 ms there, 33 TFLOP/s).

    python3 perf/probe_conv.py --shape 1,256,512,512 --out-channels 256 --dtypes f16,bf16 [--out probe.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from dif_device_bridge import Device  # noqa: E402

from dif.ir.builder import ProgramBuilder  # noqa: E402
from dif.plan.planner import plan_program  # noqa: E402


def probe(
    device: str, shape: tuple[int, ...], out_channels: int, kernel: int, dtype: str, bias: bool, iters: int
) -> dict:  # type: ignore[type-arg]
    n, c, h, w = shape
    b = ProgramBuilder("probe_conv")
    x = b.input("x", shape, dtype)
    wt = b.param("w", (out_channels, c, kernel, kernel), dtype)
    operands = [x, wt] + ([b.param("b", (out_channels,), dtype)] if bias else [])
    b.output(b.emit("conv2d", *operands, padding=(kernel // 2,) * 4, stride=(1, 1), dilation=(1, 1), groups=1))
    program = b.build()
    dev = Device(device)
    backend = dev.backend()
    rng = np.random.default_rng(0)
    weights = {p.name: (0.02 * rng.standard_normal(p.type.shape)).astype(p.type.dtype.np) for p in program.params}
    exe = backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), weights)
    inputs = {"x": rng.standard_normal(shape).astype(program.inputs[0].type.dtype.np)}
    ms, _ = dev.dif_median(exe, inputs, iters, 3)
    flop = 2 * n * h * w * out_channels * c * kernel * kernel
    return {
        "shape": list(shape),
        "out_channels": out_channels,
        "kernel": kernel,
        "dtype": dtype,
        "bias": bias,
        "ms": round(ms, 3),
        "tflops": round(flop / ms / 1e9, 1),
        "choices": sorted(set(getattr(exe, "choices", {}).values())),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="1,256,512,512")
    ap.add_argument("--out-channels", type=int, default=256)
    ap.add_argument("--kernel", type=int, default=3)
    ap.add_argument("--dtypes", default="f16,bf16")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", default=None)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"), help="cpu: check the script")
    a = ap.parse_args()
    shape = tuple(int(s) for s in a.shape.split(","))
    rows = [
        probe(a.device, shape, a.out_channels, a.kernel, dt, bias, a.iters)
        for dt in a.dtypes.split(",")
        for bias in (True, False)
    ]
    for r in rows:
        print(r)
    if a.out:
        Path(a.out).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
