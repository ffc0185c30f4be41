"""Where a traced forward's time goes, by DiffIR opcode: the `op` events of a trace file's run executions
(DIF_TRACE_FILE, or `perf/trace_forward.py --save DIR` -> DIR/trace.jsonl) summed per opcode and divided by
the number of runs, with each opcode's node count and share of the attributed time.

    python perf/trace_by_op.py DIR/trace.jsonl --out FILE.json
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path


def by_opcode(path: Path) -> dict[str, object]:
    totals: dict[str, float] = defaultdict(float)
    nodes: dict[str, set[int]] = defaultdict(set)
    runs = 0
    for line in path.read_text().splitlines():
        doc = json.loads(line)
        if doc["data"]["stage"] != "run":
            continue
        runs += 1
        for event in doc["events"]:
            if event.get("name") == "op":
                totals[event["opcode"]] += event["ms"]
                nodes[event["opcode"]].add(event["op_id"])
    if not runs:
        raise SystemExit(f"{path}: no run execution traced")
    attributed = sum(totals.values()) / runs
    rows = sorted(totals.items(), key=lambda kv: -kv[1])
    return {
        "trace": str(path),
        "runs": runs,
        "attributed_ms_per_run": round(attributed, 3),
        "by_opcode": [
            {
                "opcode": op,
                "ms_per_run": round(ms / runs, 3),
                "nodes": len(nodes[op]),
                "share": round(ms / runs / attributed, 4),
            }
            for op, ms in rows
        ],  # fmt: skip
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", type=Path)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    result = by_opcode(args.trace)
    for row in result["by_opcode"]:  # type: ignore[union-attr]
        print(f"{row['opcode']:24s} {row['ms_per_run']:9.3f} ms  {row['nodes']:4d} nodes  {row['share']:.1%}")
    print(f"{'attributed':24s} {result['attributed_ms_per_run']:9.3f} ms per run ({result['runs']} runs)")
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
