"""Can a GEMM that does the elementwise work in its epilogue beat cuBLASLt + a separate kernel at the power limit?

klein 9B's forward spends ~7.5 ms in memory-bound kernels next to ~111 ms of library GEMMs and attention
(docs/performance.md); 0.70x of diffusers eager needs most of those 7.5 ms gone, which cuBLASLt's epilogues
cannot express (no GLU, no per-column gate for bf16). This probe writes the two biggest as Triton GEMM
epilogues and times them back to back (warm clocks, interleaved rounds, medians) against cuBLAS (torch):

- single-block MLP input: h = x @ W^T (4608x4096 -> 24576), then silu(h[:, :12288]) * h[:, 12288:] -- as one
  GEMM with two accumulators (gate and up rows of W) and the GLU in the epilogue;
- single-block output: y = r + gate * (x @ W^T) (4608x16384 -> 4096) -- the gated residual in the epilogue;
- the plain Triton GEMM at both shapes, to separate Triton's GEMM speed from the fusion's saving.

The epilogues round the product to bf16 before the activation / gate, as dif's unfused ops do. torch is used
for buffers and the cuBLAS side only (a probe, not a runtime path).

Usage: python3 perf/probe_triton_fused.py --out probe_triton_fused.json  (needs a GPU, torch, triton)
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable
from typing import Any

CONFIGS = (  # (BM, BN, BK, warps, stages); BN is per accumulator
    (128, 256, 64, 8, 3),
    (128, 128, 64, 8, 4),
    (128, 128, 64, 4, 4),
    (256, 128, 64, 8, 3),
)
GLU_CONFIGS = ((128, 128, 64, 8, 3), (128, 128, 64, 8, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4))
EPI_PLAIN, EPI_GLU, EPI_GATED = 0, 1, 2


def kernels() -> Any:
    import triton
    import triton.language as tl

    @triton.jit
    def gemm(a, w, c, r, g, M, N, K, lda, ldw, ldc,
             EPI: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP: tl.constexpr):  # fmt: skip
        # tiles in groups of GROUP row-blocks so neighbouring programs share A and W tiles in L2
        pid = tl.program_id(0)
        tiles_m, tiles_n = M // BM, N // BN
        per_group = GROUP * tiles_n
        first = (pid // per_group) * GROUP
        rows = tl.minimum(tiles_m - first, GROUP)
        pm = first + (pid % per_group) % rows
        pn = (pid % per_group) // rows
        offs_m = pm * BM + tl.arange(0, BM)
        offs_n = pn * BN + tl.arange(0, BN)
        offs_k = tl.arange(0, BK)
        a_ptr = a + offs_m[:, None] * lda + offs_k[None, :]
        w_ptr = w + offs_n[:, None] * ldw + offs_k[None, :]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        if EPI == 1:  # the up rows of W follow its N gate rows
            u_ptr = w_ptr + N * ldw
            acc_up = tl.zeros((BM, BN), dtype=tl.float32)
        for _ in range(0, K // BK):
            x_tile = tl.load(a_ptr)
            acc = tl.dot(x_tile, tl.trans(tl.load(w_ptr)), acc)
            if EPI == 1:
                acc_up = tl.dot(x_tile, tl.trans(tl.load(u_ptr)), acc_up)
                u_ptr += BK
            a_ptr += BK
            w_ptr += BK
        h = acc.to(tl.bfloat16).to(tl.float32)
        if EPI == 1:
            up = acc_up.to(tl.bfloat16).to(tl.float32)
            h = (h * tl.sigmoid(h)) * up
        if EPI == 2:
            gate = tl.load(g + offs_n).to(tl.float32)
            res = tl.load(r + offs_m[:, None] * ldc + offs_n[None, :]).to(tl.float32)
            h = res + (gate[None, :] * h).to(tl.bfloat16).to(tl.float32)
        tl.store(c + offs_m[:, None] * ldc + offs_n[None, :], h.to(tl.bfloat16))

    return gemm


def launcher(gemm: Any, epi: int, x: Any, w: Any, out: Any, cfg: tuple[int, ...], r: Any = None, g: Any = None):
    bm, bn, bk, warps, stages = cfg
    m, k = x.shape
    n = out.shape[1]
    grid = ((m // bm) * (n // bn),)
    r = out if r is None else r
    g = out if g is None else g

    def run() -> None:
        gemm[grid](x, w, out, r, g, m, n, k, x.stride(0), w.stride(0), out.stride(0),
                   EPI=epi, BM=bm, BN=bn, BK=bk, GROUP=8, num_warps=warps, num_stages=stages)  # fmt: skip

    return run


def sustained(runs: dict[str, Callable[[], None]], rounds: int = 5, batch: int = 10) -> dict[str, float]:
    """Median ms per call of each runner, in interleaved rounds of `batch` back-to-back calls after 60 warm-up
    calls (the forward's clocks, not an idle GPU's)."""
    import torch

    first = next(iter(runs.values()))
    for _ in range(60):
        first()
    times: dict[str, list[float]] = {k: [] for k in runs}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(rounds):
        for name, fn in runs.items():
            start.record()
            for _ in range(batch):
                fn()
            end.record()
            end.synchronize()
            times[name].append(start.elapsed_time(end) / batch)
    return {k: round(statistics.median(v), 4) for k, v in times.items()}


def best_config(make: Callable[[tuple[int, ...]], Callable[[], None]], configs: tuple) -> tuple[tuple, dict]:
    """The config whose runner is fastest over 20 calls (each compiled and run once first)."""
    import torch

    seen: dict[str, Any] = {}
    for cfg in configs:
        try:
            fn = make(cfg)
            fn()
            torch.cuda.synchronize()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(20):
                fn()
            end.record()
            end.synchronize()
            seen[str(cfg)] = round(start.elapsed_time(end) / 20, 4)
        except Exception as exc:  # noqa: BLE001 - a config the compiler or the GPU refuses
            seen[str(cfg)] = f"{type(exc).__name__}: {str(exc)[:160]}"
    timed = {k: v for k, v in seen.items() if isinstance(v, float)}
    if not timed:
        raise RuntimeError(f"no config ran: {seen}")
    pick = min(timed, key=timed.__getitem__)
    return next(c for c in configs if str(c) == pick), seen


def rel(a: Any, b: Any) -> float:
    a, b = a.float(), b.float()
    return float((a - b).norm() / b.norm())


def compare(gemm: Any, label: str, epi: int, x: Any, w: Any, out: Any, want_of: Callable[[Any], Any],
            configs: tuple, extra: tuple = ()) -> dict[str, Any]:  # fmt: skip
    """The fused GEMM (epilogue `epi`, its best of `configs`), Triton's plain GEMM and cuBLAS's on x @ w^T:
    errors against `want_of(cuBLAS's product)` and the product itself, then sustained times."""
    import torch

    h = torch.matmul(x, w.t())
    plain_out = torch.empty_like(h)
    cfg, tried = best_config(lambda c: launcher(gemm, epi, x, w, out, c, *extra), configs)
    pcfg, ptried = best_config(lambda c: launcher(gemm, EPI_PLAIN, x, w, plain_out, c), CONFIGS)
    fused, plain = launcher(gemm, epi, x, w, out, cfg, *extra), launcher(gemm, EPI_PLAIN, x, w, plain_out, pcfg)
    fused()
    plain()
    res = {"shape": label, "fused_config": cfg, "tried": tried, "plain_config": pcfg, "plain_tried": ptried,
           "fused_rel_l2": rel(out, want_of(h)), "plain_rel_l2": rel(plain_out, h)}  # fmt: skip
    name = {EPI_GLU: "glu", EPI_GATED: "gated"}[epi]
    res["ms"] = sustained({
        "cublas_gemm": lambda: torch.matmul(x, w.t(), out=h),
        "triton_gemm": plain,
        f"triton_gemm_{name}": fused,
    })  # fmt: skip
    print(json.dumps(res), flush=True)
    return res


def probe_glu(gemm: Any, m: int = 4608, k: int = 4096, half: int = 12288) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(2 * half, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    out = torch.empty(m, half, device="cuda", dtype=torch.bfloat16)

    def want(h: Any) -> Any:
        return (F.silu(h[:, :half].float()) * h[:, half:].float()).to(torch.bfloat16)

    return compare(gemm, f"{m}x{k} -> 2x{half}, GLU", EPI_GLU, x, w, out, want, GLU_CONFIGS)


def probe_gated(gemm: Any, m: int = 4608, k: int = 16384, n: int = 4096) -> dict[str, Any]:
    import torch

    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5
    r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

    def want(h: Any) -> Any:
        return (r.float() + (g.float() * h.float()).to(torch.bfloat16).float()).to(torch.bfloat16)

    return compare(gemm, f"{m}x{k} -> {n}, gated residual", EPI_GATED, x, w, out, want, CONFIGS, (r, g))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="probe_triton_fused.json")
    args = ap.parse_args()
    import torch
    import triton

    gemm = kernels()
    result: dict[str, Any] = {"device": torch.cuda.get_device_name(), "triton": triton.__version__,
                              "torch": torch.__version__}  # fmt: skip
    for name, probe in (("glu", probe_glu), ("gated_residual", probe_gated)):
        try:
            result[name] = probe(gemm)
        except Exception as exc:  # noqa: BLE001 - report and go on to the next probe
            result[name] = {"error": f"{type(exc).__name__}: {str(exc)[:400]}"}
            print(name, result[name], flush=True)
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
