"""Counts of a pytest JUnit XML report as JSON (perf results of a device run; no pipeline role).

Usage:  python3 perf/junit_summary.py REPORT.xml OUT.json [--label TEXT] [--key value ...]
"""

from __future__ import annotations

import argparse
import json
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path


def summarize(xml_path: Path) -> dict[str, object]:
    root = ET.parse(xml_path).getroot()
    cases = root.iter("testcase")
    status: Counter[str] = Counter()
    failed: list[str] = []
    skip_reasons: Counter[str] = Counter()
    seconds = 0.0
    for case in cases:
        seconds += float(case.get("time", 0) or 0)
        name = f"{case.get('classname', '')}::{case.get('name', '')}"
        kids = {child.tag: child for child in case}
        if "failure" in kids or "error" in kids:
            status["failed" if "failure" in kids else "error"] += 1
            bad = kids.get("failure", kids.get("error"))
            failed.append(f"{name}: {(bad.get('message') or '')[:300]}")
        elif "skipped" in kids:
            status["skipped"] += 1
            skip_reasons[(kids["skipped"].get("message") or "")[:200]] += 1
        else:
            status["passed"] += 1
    return {
        "counts": dict(status),
        "total": sum(status.values()),
        "seconds": round(seconds, 1),
        "failed": failed[:100],
        "skip_reasons": dict(skip_reasons.most_common(10)),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("xml")
    ap.add_argument("out")
    ap.add_argument("--label", default="")
    ap.add_argument("--meta", nargs="*", default=[], help="key=value pairs recorded as they are")
    args = ap.parse_args()
    result: dict[str, object] = {"label": args.label}
    result.update(dict(kv.split("=", 1) for kv in args.meta))
    result["pytest"] = summarize(Path(args.xml))
    Path(args.out).write_text(json.dumps(result, indent=1))
    print(f"{args.label}: {result['pytest']['counts']} in {result['pytest']['seconds']} s")  # type: ignore[index]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
