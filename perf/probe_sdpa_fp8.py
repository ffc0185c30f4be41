"""cuDNN's fp8 (e4m3) flash attention against its bf16 one, at the 1024² attention of klein 4B (24 heads),
klein 9B (32) and Krea 2 (48 query heads over 12 key/value heads): the time of each, and the fp8 output's error
against the bf16 output. The fp8 graph takes per-tensor scales: q, k and v quantized to their own amax, the
softmax probabilities scaled by 448 (they lie in [0, 1]) and the output by v's scale (an average of v's rows is
bounded by v's amax), so no scale needs a second pass. Also asks for a bf16 output, which Hopper may refuse.
Usage (GPU machine): python3 perf/probe_sdpa_fp8.py --out FILE.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

SHAPES = {"klein-4b": (24, 24), "klein-9b": (32, 32), "krea2": (48, 12)}
E4M3_MAX = 448.0


def main() -> None:
    import cudnn
    import torch

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tokens", type=int, default=4608)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    handle = cudnn.create_handle()
    stream = torch.cuda.current_stream()
    cudnn.set_stream(handle=handle, stream=stream.cuda_stream)
    s, d = args.tokens, 128
    scale = 1.0 / math.sqrt(d)
    results: dict[str, object] = {"cudnn": str(cudnn.backend_version()), "device": torch.cuda.get_device_name()}

    def timed(fn) -> float:  # type: ignore[no-untyped-def]
        for _ in range(3):
            fn()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        times = []
        for _ in range(args.iters):
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
        return sorted(times)[len(times) // 2]

    def bshd(b: int, h: int) -> tuple[list[int], list[int]]:  # our [B, S, H, D] as cuDNN's [B, H, S, D] view
        return [b, h, s, d], [s * h * d, d, h * d, 1]

    def build(g):  # type: ignore[no-untyped-def]
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        return torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)

    for model, (hq, hkv) in SHAPES.items():
        gen = torch.Generator(device="cuda").manual_seed(0)
        q = torch.randn(1, s, hq, d, device="cuda", generator=gen)
        k = torch.randn(1, s, hkv, d, device="cuda", generator=gen)
        v = torch.randn(1, s, hkv, d, device="cuda", generator=gen)
        flops = 4 * s * s * hq * d
        row: dict[str, object] = {"heads": [hq, hkv], "tokens": s}

        # bf16
        qb, kb, vb = (t.to(torch.bfloat16) for t in (q, k, v))
        ob = torch.empty_like(qb)
        g = cudnn.pygraph(io_data_type=cudnn.data_type.BFLOAT16, intermediate_data_type=cudnn.data_type.FLOAT,
                          compute_data_type=cudnn.data_type.FLOAT, handle=handle)  # fmt: skip
        tq = g.tensor(name="q", dim=bshd(1, hq)[0], stride=bshd(1, hq)[1], data_type=cudnn.data_type.BFLOAT16)
        tk = g.tensor(name="k", dim=bshd(1, hkv)[0], stride=bshd(1, hkv)[1], data_type=cudnn.data_type.BFLOAT16)
        tv = g.tensor(name="v", dim=bshd(1, hkv)[0], stride=bshd(1, hkv)[1], data_type=cudnn.data_type.BFLOAT16)
        to, _ = g.sdpa(q=tq, k=tk, v=tv, generate_stats=False, attn_scale=scale, name="sdpa")
        to.set_output(True).set_dim(bshd(1, hq)[0]).set_stride(bshd(1, hq)[1]).set_data_type(cudnn.data_type.BFLOAT16)
        ws = build(g)
        pack = {tq: qb, tk: kb, tv: vb, to: ob}
        ms = timed(lambda g=g, pack=pack, ws=ws: g.execute(pack, ws, handle=handle))
        row["bf16_ms"] = round(ms, 4)
        row["bf16_tflops"] = round(flops / ms / 1e9, 1)

        # fp8: per-tensor scales from each input's amax
        amax = {n: float(t.abs().max()) for n, t in (("q", q), ("k", k), ("v", v))}
        qs = {n: E4M3_MAX / a for n, a in amax.items()}
        q8, k8, v8 = ((t * qs[n]).to(torch.float8_e4m3fn) for n, t in (("q", q), ("k", k), ("v", v)))
        scalars = {
            "descale_q": 1 / qs["q"], "descale_k": 1 / qs["k"], "descale_v": 1 / qs["v"],
            "descale_s": 1 / E4M3_MAX, "scale_s": E4M3_MAX, "scale_o": qs["v"],
        }  # fmt: skip
        for out_name, out_type, out_torch in (
            ("fp8", cudnn.data_type.FP8_E4M3, torch.float8_e4m3fn),
            ("fp8_bf16_out", cudnn.data_type.BFLOAT16, torch.bfloat16),
        ):
            try:
                e4m3, fp32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
                g = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=fp32, compute_data_type=fp32,
                                  handle=handle)  # fmt: skip
                tq = g.tensor(name="q", dim=bshd(1, hq)[0], stride=bshd(1, hq)[1], data_type=e4m3)
                tk = g.tensor(name="k", dim=bshd(1, hkv)[0], stride=bshd(1, hkv)[1], data_type=e4m3)
                tv = g.tensor(name="v", dim=bshd(1, hkv)[0], stride=bshd(1, hkv)[1], data_type=e4m3)
                ts = {n: g.tensor(name=n, dim=[1, 1, 1, 1], stride=[1, 1, 1, 1], data_type=fp32) for n in scalars}
                to, _, amax_s, amax_o = g.sdpa_fp8(q=tq, k=tk, v=tv, **ts, generate_stats=False, attn_scale=scale,
                                                   name="sdpa_fp8")  # fmt: skip
                to.set_output(True).set_dim(bshd(1, hq)[0]).set_stride(bshd(1, hq)[1]).set_data_type(out_type)
                for a in (amax_s, amax_o):
                    a.set_output(True).set_dim([1, 1, 1, 1]).set_stride([1, 1, 1, 1]).set_data_type(fp32)
                ws = build(g)
                o8 = torch.empty(1, s, hq, d, device="cuda", dtype=out_torch)
                am = [torch.zeros(1, 1, 1, 1, device="cuda") for _ in range(2)]
                pack = {tq: q8, tk: k8, tv: v8, to: o8, amax_s: am[0], amax_o: am[1]}
                pack.update({ts[n]: torch.full((1, 1, 1, 1), val, device="cuda") for n, val in scalars.items()})
                ms = timed(lambda g=g, pack=pack, ws=ws: g.execute(pack, ws, handle=handle))
                got = o8.float() / (qs["v"] if out_name == "fp8" else 1.0)
                want = ob.float()
                row[f"{out_name}_ms"] = round(ms, 4)
                row[f"{out_name}_tflops"] = round(flops / ms / 1e9, 1)
                row[f"{out_name}_rel_l2_vs_bf16"] = round(float((got - want).norm() / want.norm()), 5)
                row[f"{out_name}_amax_s_o"] = [float(a) for a in am]
            except Exception as exc:  # noqa: BLE001 - a refusal is a result
                row[f"{out_name}_error"] = f"{type(exc).__name__}: {exc}"[:400]
        results[model] = row
        print(model, json.dumps(row))
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
