"""Numerical tolerances for checking a backend (or the reference) per result dtype; used by the
conformance kit (`dif.testing.conformance`) and by any parity test that compares arrays.

A float result passes when, elementwise, |got - want| <= atol * scale + rtol * |want|, where
`scale` = max(1, max |want|) so that values cancelling to ~0 inside a large tensor are judged
against the tensor's magnitude, and both atol and rtol grow with sqrt(reduction length) because
summation order legitimately differs between backends. Non-finite values must match exactly;
integer and bool results must be equal.
"""

from __future__ import annotations

import math

import numpy as np
from attrs import frozen

from dif.dtypes import DType


@frozen
class Tolerance:
    rtol: float
    atol: float

    @property
    def exact(self) -> bool:
        return self.rtol == 0 and self.atol == 0

    def scaled(self, reduction: int) -> Tolerance:
        """Looser by sqrt(reduction length): rounding error of a length-k sum grows ~sqrt(k)."""
        factor = math.sqrt(max(1, reduction))
        return Tolerance(self.rtol * factor, self.atol * factor)


TOLERANCES: dict[DType, Tolerance] = {
    DType.F32: Tolerance(1e-5, 1e-6),
    DType.F16: Tolerance(2e-3, 1e-3),  # one f16 ulp is ~9.8e-4 relative
    DType.BF16: Tolerance(1.6e-2, 1e-2),  # one bf16 ulp is ~7.8e-3 relative; allow two
    DType.F8E4M3: Tolerance(1.25e-1, 6e-2),  # 3 mantissa bits
    DType.F8E5M2: Tolerance(2.5e-1, 1.2e-1),  # 2 mantissa bits
    DType.I8: Tolerance(0.0, 0.0),
    DType.I32: Tolerance(0.0, 0.0),
    DType.I64: Tolerance(0.0, 0.0),
    DType.U8: Tolerance(0.0, 0.0),
    DType.BOOL: Tolerance(0.0, 0.0),
}


FP8_ACCUMULATION = Tolerance(2.5e-4, 2.5e-4)
"""The floor for a result accumulated from fp8 operands: matrix units add fp8 products in an accumulator of
about 14 mantissa bits (Hopper, also with cuBLASLt's fast accumulation off), so each addition may round at
~2^-13 of the running sum, not of the final value; twice that, relative to the tensor's magnitude."""


def tolerance_for(dtype: DType, *, reduction: int = 1) -> Tolerance:
    """The tolerance for results stored as `dtype`, loosened for a reduction of length `reduction`."""
    tol = TOLERANCES[DType(dtype)]
    return tol if tol.exact else tol.scaled(reduction)


@frozen
class Comparison:
    ok: bool
    max_abs: float
    max_rel: float
    detail: str = ""


def compare(got: np.ndarray, want: np.ndarray, tol: Tolerance) -> Comparison:
    """Compare `got` with `want` (any dtypes; float math in float64). Shapes must be equal."""
    got, want = np.asarray(got), np.asarray(want)
    if got.shape != want.shape:
        return Comparison(False, math.inf, math.inf, f"shape {got.shape} != expected {want.shape}")
    if got.size == 0:
        return Comparison(True, 0.0, 0.0)
    g = got.astype(np.float64)
    w = want.astype(np.float64)
    if tol.exact:
        diff = np.abs(np.where(np.isnan(g) & np.isnan(w), 0.0, g - w))
        mismatches = int(np.count_nonzero(~((g == w) | (np.isnan(g) & np.isnan(w)))))
        max_abs = float(np.nan_to_num(diff, nan=math.inf).max())
        detail = f"{mismatches} of {got.size} elements differ" if mismatches else ""
        return Comparison(mismatches == 0, max_abs, max_abs, detail)
    finite_w = np.isfinite(w)
    same_special = (np.isnan(g) & np.isnan(w)) | (g == w)
    bad_special = int(np.count_nonzero(~finite_w & ~same_special) + np.count_nonzero(finite_w & ~np.isfinite(g)))
    gf, wf = g[finite_w & np.isfinite(g)], w[finite_w & np.isfinite(g)]
    if gf.size == 0:
        return Comparison(bad_special == 0, 0.0, 0.0, f"{bad_special} non-finite mismatches" if bad_special else "")
    scale = max(1.0, float(np.abs(wf).max()))
    err = np.abs(gf - wf)
    allowed = tol.atol * scale + tol.rtol * np.abs(wf)
    over = int(np.count_nonzero(err > allowed))
    max_abs = float(err.max())
    max_rel = float((err / np.maximum(np.abs(wf), tol.atol * scale)).max())
    parts = []
    if over:
        k = int(np.argmax(err - allowed))
        parts.append(f"{over} of {got.size} elements out of tolerance (worst: got {gf[k]!r}, want {wf[k]!r})")
    if bad_special:
        parts.append(f"{bad_special} non-finite mismatches")
    return Comparison(over == 0 and bad_special == 0, max_abs, max_rel, "; ".join(parts))
