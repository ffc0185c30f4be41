"""How one captured tensor is judged against its oracle: cosine, relative L2, norm ratio, max abs and
non-finite counts (float64 over the positions finite on both sides), each against an explicit bar."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
from attrs import asdict, frozen


@frozen
class Bars:
    """A boundary passes when every bar holds; `max_abs` None means that bar is off. Non-finite values
    must sit at the same positions on both sides (`nonfinite_must_match`)."""

    min_cosine: float = 0.999
    max_rel_l2: float = 1e-2
    max_norm_ratio_deviation: float = 1e-2
    max_abs: float | None = None
    nonfinite_must_match: bool = True

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite(x: float) -> float | None:
    return x if math.isfinite(x) else None


def compare(candidate: np.ndarray, reference: np.ndarray) -> dict[str, Any]:
    """Metrics of `candidate` against `reference` (same shape): cosine, rel_l2 (||c - r|| / ||r||),
    norm_ratio (||c|| / ||r||), max_abs, nonfinite counts and whether their positions match.
    A metric without a value (a zero reference norm) is None."""
    c = np.asarray(candidate).astype(np.float64, copy=False).reshape(-1)
    r = np.asarray(reference).astype(np.float64, copy=False).reshape(-1)
    fc, fr = np.isfinite(c), np.isfinite(r)
    both = fc & fr
    c, r = c[both], r[both]
    nc, nr = float(np.linalg.norm(c)), float(np.linalg.norm(r))
    diff = c - r
    nd = float(np.linalg.norm(diff))
    if nc == 0.0 and nr == 0.0:
        cosine: float | None = 1.0
    elif nc == 0.0 or nr == 0.0:
        cosine = 0.0
    else:
        cosine = float(np.dot(c, r) / (nc * nr))
    return {
        "cosine": cosine,
        "rel_l2": (_finite(nd / nr) if nr else (0.0 if nd == 0.0 else None)),
        "norm_ratio": (_finite(nc / nr) if nr else (1.0 if nc == 0.0 else None)),
        "max_abs": float(np.max(np.abs(diff))) if diff.size else 0.0,
        "nonfinite_candidate": int((~fc).sum()),
        "nonfinite_reference": int((~fr).sum()),
        "nonfinite_match": bool(np.array_equal(fc, fr)),
        "elements": int(fc.size),
    }


def judge(metrics: dict[str, Any], bars: Bars) -> list[str]:
    """The bars `metrics` break, as short texts (empty: passed)."""
    broken = []
    cos, rel, ratio = metrics["cosine"], metrics["rel_l2"], metrics["norm_ratio"]
    if cos is None or cos < bars.min_cosine:
        broken.append(f"cosine {cos} < {bars.min_cosine}")
    if rel is None or rel > bars.max_rel_l2:
        broken.append(f"rel_l2 {rel} > {bars.max_rel_l2}")
    if ratio is None or abs(ratio - 1.0) > bars.max_norm_ratio_deviation:
        broken.append(f"norm_ratio {ratio} off 1 by more than {bars.max_norm_ratio_deviation}")
    if bars.max_abs is not None and metrics["max_abs"] > bars.max_abs:
        broken.append(f"max_abs {metrics['max_abs']} > {bars.max_abs}")
    if bars.nonfinite_must_match and not metrics["nonfinite_match"]:
        broken.append(
            f"non-finite values differ ({metrics['nonfinite_candidate']} in the candidate, "
            f"{metrics['nonfinite_reference']} in the reference)"
        )
    return broken
