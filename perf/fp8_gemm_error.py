"""How far one fp8-e4m3 W8A8 GEMM lands from the exact product, on random weights and on structured ones: why the
format gate rejects fp8 on the random-weight checkpoints of `perf/formats_h200.py`.

Both operands are rounded to e4m3 with one scale per row (activations) and per output channel (weights), amax /
448, as `dif.passes.quantize`'s W8A8 path does, and multiplied in fp32. "random": weights N(0, 1/fan_in) and
Gaussian activations, the benchmarks' weights (their dot products are incoherent: the product is small against
the operands, so their rounding errors are large against it). "structured": weights and activations that share a
rank-64 subspace plus 10 % noise, as trained weights and their activations do.

Usage: python perf/fp8_gemm_error.py --out perf/results/stop27/fp8_gemm_error.json  (numpy and ml_dtypes only)
"""

from __future__ import annotations

import argparse
import json

import ml_dtypes
import numpy as np

E4M3_MAX = 448.0


def rounded(x: np.ndarray) -> np.ndarray:
    """x on the e4m3 grid with one scale per row (amax / 448), back in fp32."""
    scale = np.abs(x).max(axis=1, keepdims=True) / E4M3_MAX
    return (x / scale).astype(ml_dtypes.float8_e4m3fn).astype(np.float32) * scale


def rel_l2(got: np.ndarray, want: np.ndarray) -> float:
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--k", type=int, default=4096)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--out", default="fp8_gemm_error.json")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    m, k, n, rank = args.rows, args.k, args.n, 64
    cases = {
        "random": (rng.standard_normal((m, k)), rng.standard_normal((n, k)) / np.sqrt(k)),
    }
    u, v = rng.standard_normal((n, rank)), rng.standard_normal((k, rank))
    w = u @ v.T / np.sqrt(rank * k) + 0.1 * rng.standard_normal((n, k)) / np.sqrt(k)
    x = rng.standard_normal((m, rank)) @ v.T / np.sqrt(rank) + 0.1 * rng.standard_normal((m, k))
    cases["structured"] = (x, w)
    out: dict[str, object] = {"rows": m, "k": k, "n": n, "rel_l2": {}}
    for name, (x, w) in cases.items():
        x, w = x.astype(np.float32), w.astype(np.float32)
        out["rel_l2"][name] = round(rel_l2(rounded(x) @ rounded(w).T, x @ w.T), 5)  # type: ignore[index]
    print(json.dumps(out))
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
