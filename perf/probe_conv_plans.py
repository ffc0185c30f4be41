"""Which cuDNN execution plan is fast for each convolution of the FLUX.2 VAE decoder, and where cuDNN's
heuristics rank it: the question behind the decode stage's 227 ms on an H100 (stop 27), where the plans the
heuristic lists first ran the decoder's 3x3 convolutions at some 60 TFLOP/s.

For every distinct conv2d problem of the decoder at --size (bf16, NCHW as `dif_backend_cuda.conv` declares it,
and in channels-last strides), each heuristic mode's plans are built and every plan timed (median of 3 rounds of
3 back-to-back calls); the JSON lists, per problem, each plan's name, workspace and milliseconds with its rank
under each mode, and torch's own convolution of the same problem (cudnn.benchmark off, then on) beside them.

Usage: python3 perf/probe_conv_plans.py --size 1024 --out probe_conv_plans.json  (needs a GPU, cupy, cudnn)
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from pipeline_wall import VAE  # noqa: E402

MODES = ("A", "B", "A-nhwc")
"""cuDNN heuristic modes over the NCHW layout dif declares, and mode A over channels-last strides."""


def problems(size: int) -> dict[tuple[Any, ...], int]:
    """(x shape, w shape, padding, stride) -> how many nodes of the decoder have it."""
    from dif_frontend_flux2.config import Flux2VaeConfig
    from dif_frontend_flux2.vae import build_vae_decoder

    cfg = Flux2VaeConfig.from_dict(VAE)
    program = build_vae_decoder(cfg, batch=1, latent_h=size // 8, latent_w=size // 8, dtype="bf16")
    types = {v.name: v.type for v in (*program.inputs, *program.params)}
    for node in program.nodes:
        for r in node.results:
            types[r.name] = r.type
    found: dict[tuple[Any, ...], int] = {}
    for node in program.nodes:
        if node.op == "conv2d":
            x, w = (types[n].shape for n in node.operands[:2])
            key = (tuple(x), tuple(w), node.attrs["padding"][0], tuple(node.attrs["stride"]))
            found[key] = found.get(key, 0) + 1
    return found


def cost(key: tuple[Any, ...]) -> int:
    """Multiply-adds of one convolution of the problem (stride 1, same-size output)."""
    (_n, c, h, w), (o, _ci, kh, kw), _pad, _stride = key
    return o * h * w * c * kh * kw


def timed(run: Any, stream: Any, rounds: int = 3, calls: int = 3) -> float:
    import cupy

    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    run()
    times = []
    for _ in range(rounds):
        start.record(stream)
        for _ in range(calls):
            run()
        end.record(stream)
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / calls)
    return statistics.median(times)


def plans(cudnn: Any, handle: Any, stream: Any, key: tuple[Any, ...], mode: str, bufs: dict[str, Any]) -> list[Any]:
    import cupy

    x_shape, w_shape, pad, stride = key
    n, _c, h, wd = x_shape
    o, _ci, kh, _kw = w_shape
    ho, wo = (h + 2 * pad - kh) // stride[0] + 1, (wd + 2 * pad - kh) // stride[1] + 1
    dt, fp32 = cudnn.data_type.BFLOAT16, cudnn.data_type.FLOAT
    g = cudnn.pygraph(io_data_type=dt, intermediate_data_type=fp32, compute_data_type=fp32, handle=handle)

    mode, _, layout = mode.partition("-")

    def strides(dims: tuple[int, ...]) -> list[int]:
        _nn, cc, hh, ww = dims
        return [cc * hh * ww, 1, ww * cc, cc] if layout == "nhwc" else [cc * hh * ww, hh * ww, ww, 1]

    def nchw(name: str, dims: tuple[int, ...], uid: int) -> Any:
        return g.tensor(name=name, dim=list(dims), stride=strides(dims), data_type=dt, uid=uid)

    tx, tw = nchw("x", x_shape, 1), nchw("w", w_shape, 2)
    y = g.conv_fprop(image=tx, weight=tw, padding=[pad, pad], stride=list(stride), dilation=[1, 1],
                     compute_data_type=fp32)  # fmt: skip
    y.set_output(True).set_dim([n, o, ho, wo]).set_stride(strides((n, o, ho, wo))).set_data_type(dt).set_uid(3)
    g.validate()
    g.build_operation_graph()
    g.create_execution_plans([getattr(cudnn.heur_mode, mode)])
    g.check_support()
    g.build_plans(cudnn.build_plan_policy.ALL)
    count = int(g.get_execution_plan_count())
    pack = {1: bufs["x"].data.ptr, 2: bufs["w"].data.ptr, 3: bufs["y"].data.ptr}
    rows = []
    for i in range(count):
        row: dict[str, Any] = {"rank": i}
        try:
            row["name"] = str(g.get_plan_name_at_index(i))
            need = int(g.get_workspace_size_plan_at_index(i))
            row["workspace_mib"] = round(need / 2**20, 1)
            scratch = cupy.cuda.Memory(max(need, 1))
            run = lambda at=scratch.ptr, index=i: g.execute_plan_at_index(pack, at, index, handle=handle)  # noqa: E731
            row["ms"] = round(timed(run, stream), 4)
        except Exception as exc:  # noqa: BLE001 - a plan that does not build or run
            row["error"] = f"{type(exc).__name__}: {exc}"[:200]
            stream.synchronize()
        rows.append(row)
    return rows


def torch_times(key: tuple[Any, ...]) -> dict[str, float]:
    import torch

    x_shape, w_shape, pad, stride = key
    x = torch.randn(x_shape, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(w_shape, device="cuda", dtype=torch.bfloat16) * 0.02
    out = {}
    for bench in (False, True):
        torch.backends.cudnn.benchmark = bench

        def run() -> None:
            torch.nn.functional.conv2d(x, w, padding=pad, stride=stride)

        for _ in range(3):
            run()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(3):
            start.record()
            for _ in range(3):
                run()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end) / 3)
        out["benchmark" if bench else "default"] = round(statistics.median(times), 4)
    torch.backends.cudnn.benchmark = False
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1024)
    ap.add_argument("--out", default="probe_conv_plans.json")
    ap.add_argument("--no-torch", action="store_true")
    args = ap.parse_args()

    import cudnn
    import cupy

    stream = cupy.cuda.Stream(non_blocking=True)
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=stream.ptr)
    result: dict[str, Any] = {"size": args.size, "cudnn": str(cudnn.backend_version()), "problems": []}
    with stream:
        # the decoder's costliest problems first (FLOPs x nodes): a run cut short has measured what matters
        found = problems(args.size)
        for key, nodes in sorted(found.items(), key=lambda kv: -kv[1] * cost(kv[0])):
            x_shape, w_shape, pad, stride = key
            n, _c, h, wd = x_shape
            o, ci, kh, kw = w_shape
            flops = 2 * n * o * (h // stride[0]) * (wd // stride[1]) * ci * kh * kw
            bufs = {
                "x": cupy.random.standard_normal(x_shape, dtype=cupy.float32).astype(cupy.float16).view(cupy.uint16),
                "w": cupy.zeros(w_shape, dtype=cupy.uint16),
                "y": cupy.zeros((n, o, h // stride[0], wd // stride[1]), dtype=cupy.uint16),
            }  # bf16 as raw 16-bit words: the values do not change the timing
            entry: dict[str, Any] = {"x": list(x_shape), "w": list(w_shape), "nodes": nodes, "gflop": flops / 1e9}
            for mode in MODES:
                try:
                    entry[mode] = plans(cudnn, handle, stream, key, mode, bufs)
                except Exception as exc:  # noqa: BLE001
                    entry[mode] = [{"error": f"{type(exc).__name__}: {exc}"[:300]}]
            if not args.no_torch:
                entry["torch_ms"] = torch_times(key)
            result["problems"].append(entry)
            best = min((r["ms"] for m in MODES for r in entry[m] if "ms" in r), default=None)
            firsts = {m: entry[m][0].get("ms") for m in MODES}
            print(f"{x_shape} {w_shape} x{nodes}: first {firsts} best {best} torch {entry.get('torch_ms')}")
            del bufs
            with open(args.out, "w") as f:  # after every problem: a run cut short keeps what it measured
                json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
