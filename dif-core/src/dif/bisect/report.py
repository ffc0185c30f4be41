"""The first-divergence report: boundaries in semantic order, each passed / failed / not observed.

The first failed boundary is the first OBSERVED boundary (present on both sides) that breaks a bar; the
last passed is the observed boundary before it that held every bar. What lies between them unobserved
is listed as the unobserved span: the divergence entered somewhere after the last pass and at or before
the first failure, and the report never names a boundary that nobody observed as the place.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from attrs import field, frozen

from dif.bisect.metrics import Bars, compare, judge

PASSED = "passed"
FAILED = "failed"
NOT_OBSERVED = "not observed"


@frozen
class Boundary:
    """One point of comparison: `name` as reported, the tensor's key in the candidate and in the
    reference (None: that side has no tensor for it), and facts shown beside it (op id, opcode, block)."""

    name: str
    candidate: str | None
    reference: str | None
    info: dict[str, Any] = field(factory=dict)


def _missing(b: Boundary, cand: Mapping[str, np.ndarray], ref: Mapping[str, np.ndarray]) -> list[str]:
    out = []
    if b.candidate is None or b.candidate not in cand:
        out.append("candidate")
    if b.reference is None or b.reference not in ref:
        out.append("reference")
    return out


def bisect(
    boundaries: Sequence[Boundary],
    candidate: Mapping[str, np.ndarray],
    reference: Mapping[str, np.ndarray],
    bars: Bars,
    *,
    order_source: str,
) -> dict[str, Any]:
    """Judge `boundaries` in order and name the divergence. Every boundary is judged (a later pass after
    a failure is shown too: it says the divergence was absorbed there, not that it never happened)."""
    rows: list[dict[str, Any]] = []
    for b in boundaries:
        row: dict[str, Any] = {"name": b.name, **b.info}
        missing = _missing(b, candidate, reference)
        if missing:
            row.update(status=NOT_OBSERVED, missing=missing)
        else:
            assert b.candidate is not None and b.reference is not None
            c, r = candidate[b.candidate], reference[b.reference]
            if tuple(c.shape) != tuple(r.shape):
                row.update(status=FAILED, broken=[f"shape {list(c.shape)} != reference {list(r.shape)}"])
            else:
                metrics = compare(c, r)
                broken = judge(metrics, bars)
                row.update(status=FAILED if broken else PASSED, metrics=metrics)
                if broken:
                    row["broken"] = broken
        rows.append(row)
    first = next((i for i, r in enumerate(rows) if r["status"] == FAILED), None)
    last = None
    if first is not None:
        last = next((i for i in range(first - 1, -1, -1) if rows[i]["status"] == PASSED), None)
    observed = sum(1 for r in rows if r["status"] != NOT_OBSERVED)
    span: list[str] = []
    if first is not None:
        start = 0 if last is None else last + 1
        span = [r["name"] for r in rows[start:first] if r["status"] == NOT_OBSERVED]
    if observed == 0:
        verdict = "nothing observed"
    elif first is None:
        verdict = "agree"
    else:
        verdict = "diverged"
    return {
        "order_source": order_source,
        "bars": bars.to_dict(),
        "verdict": verdict,
        "boundaries_total": len(rows),
        "observed": observed,
        "first_failed": rows[first]["name"] if first is not None else None,
        "last_passed": rows[last]["name"] if last is not None else None,
        "unobserved_between": span,
        "boundaries": rows,
    }


def summary_line(report: Mapping[str, Any]) -> str:
    """One line a person reads first."""
    if report["verdict"] != "diverged":
        return f"{report['verdict']}: {report['observed']} of {report['boundaries_total']} boundaries observed"
    after = report["last_passed"] or "(the start: no earlier boundary passed)"
    gap = report["unobserved_between"]
    hidden = f"; {len(gap)} unobserved in between: {', '.join(gap[:8])}" + (" …" if len(gap) > 8 else "") if gap else ""
    return f"diverged: first failed {report['first_failed']}, last passed {after}{hidden}"
