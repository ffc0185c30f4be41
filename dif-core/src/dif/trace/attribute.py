"""Reading trace files and attributing their time (after execution: what `dif trace` prints).

A trace file holds one `dif-telemetry/1` document of kind "trace" per line (DIF_TRACE_FILE). Reading
is strict: a line that is not a complete JSON document (a writer killed mid-line), a document of
another schema or kind, or an op event without op id / kind / ms is a `FormatError` naming the file
and line. Attribution sums op and runtime event milliseconds by op, op kind, block (the provenance
the frontend recorded, carried on each event) and stage (program and prepare/run); the part of the
measured wall time no event covers is reported as `unattributed_ms`, never spread over the others.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from dif.errors import FormatError
from dif.telemetry import validate_document
from dif.trace.recorder import TRACE_KIND
from dif.trace.vocabulary import KINDS

MAX_LINE = 1 << 28


def check_trace(doc: Any, where: str) -> dict[str, Any]:
    """`doc` as a trace document, or `FormatError` saying what is wrong at `where`."""
    try:
        validate_document(doc)
    except FormatError as exc:
        raise FormatError(f"{where}: {exc}") from None
    if doc["kind"] != TRACE_KIND:
        raise FormatError(f"{where}: a '{doc['kind']}' document, not a trace", hint="give a DIF_TRACE_FILE file")
    data = doc["data"]
    for key, kind in (("stage", str), ("program", str), ("backend", str), ("wall_ms", (int, float))):
        if not isinstance(data.get(key), kind) or isinstance(data.get(key), bool):
            raise FormatError(f"{where}: trace data.{key} is missing or not a {getattr(kind, '__name__', 'number')}")
    for i, ev in enumerate(doc["events"]):
        if ev["name"].startswith("dif::"):
            continue
        if ev.get("kind") not in KINDS:
            raise FormatError(f"{where}: events[{i}] has kind {ev.get('kind')!r}, not one of the vocabulary's")
        if "ms" not in ev and ev["name"] == "op":
            raise FormatError(f"{where}: events[{i}] (op) has no ms")
        if ev["name"] == "op" and ("op_id" not in ev or not isinstance(ev.get("opcode"), str)):
            raise FormatError(f"{where}: events[{i}] (op) needs op_id and opcode")
    return doc  # type: ignore[no-any-return]


def read_trace_file(path: str | Path) -> list[dict[str, Any]]:
    """Every trace document of a DIF_TRACE_FILE file, in order; `FormatError` on anything incomplete."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise FormatError(f"{path}: cannot read the trace ({exc.strerror})") from None
    if not raw.strip():
        raise FormatError(f"{path}: the trace file is empty", hint="run a tool with DIF_TRACE_FILE set first")
    docs = []
    lines = raw.split(b"\n")
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        if number == len(lines):
            raise FormatError(f"{where}: the last document does not end with a newline (truncated trace?)")
        if len(line) > MAX_LINE:
            raise FormatError(f"{where}: line of {len(line)} bytes is too long for a trace document")
        try:
            doc = json.loads(line)
        except (UnicodeDecodeError, ValueError, RecursionError):
            raise FormatError(f"{where}: not a complete JSON document (truncated trace?)") from None
        docs.append(check_trace(doc, where))
    return docs


def _add(table: dict[str, dict[str, float]], key: str, ms: float, count: int = 1) -> None:
    row = table.setdefault(key, {"ms": 0.0, "count": 0})
    row["ms"] += ms
    row["count"] += count


def _share(ms: float, total: float) -> float:
    return round(ms / total, 6) if total else 0.0


def _rounded(table: Mapping[str, Mapping[str, float]], total: float) -> list[dict[str, Any]]:
    rows = sorted(table.items(), key=lambda kv: (-kv[1]["ms"], kv[0]))
    return [
        {"name": k, "ms": round(v["ms"], 6), "count": int(v["count"]), "share": _share(v["ms"], total)} for k, v in rows
    ]


def attribute(docs: Sequence[Mapping[str, Any]], *, top: int = 20) -> dict[str, Any]:
    """Where the traced time went, over `docs` (trace documents of one or many executions).

    Returns {"executions", "wall_ms", "attributed_ms", "unattributed_ms", "by_kind", "by_block",
    "by_stage", "by_opcode", "top_ops", "programs"}: rows of {name, ms, count, share of wall}."""
    by_kind: dict[str, dict[str, float]] = {}
    by_block: dict[str, dict[str, float]] = {}
    by_stage: dict[str, dict[str, float]] = {}
    by_opcode: dict[str, dict[str, float]] = {}
    by_op: dict[str, dict[str, float]] = {}
    wall = attributed = 0.0
    programs: dict[str, str] = {}
    for doc in docs:
        data = doc["data"]
        stage = f"{data['program']}:{data['stage']}"
        programs[data["program"]] = str(data.get("fingerprint", ""))
        wall += float(data["wall_ms"])
        _add(by_stage, stage, float(data["wall_ms"]))
        for ev in doc["events"]:
            if ev["name"].startswith("dif::") or "ms" not in ev:
                continue
            ms = float(ev["ms"])
            attributed += ms
            _add(by_kind, ev["kind"], ms)
            if ev["name"] == "op":
                block = "/".join(p for p in (ev.get("module", ""), ev.get("block", "")) if p) or "(no provenance)"
                _add(by_block, block, ms)
                _add(by_opcode, ev["opcode"], ms)
                _add(by_op, f"{data['program']}#{ev['op_id']} {ev['opcode']}", ms)
    return {
        "executions": len(docs),
        "wall_ms": round(wall, 6),
        "attributed_ms": round(attributed, 6),
        "unattributed_ms": round(wall - attributed, 6),
        "by_kind": _rounded(by_kind, wall),
        "by_block": _rounded(by_block, wall),
        "by_stage": _rounded(by_stage, wall),
        "by_opcode": _rounded(by_opcode, wall),
        "top_ops": _rounded(by_op, wall)[:top],
        "programs": dict(sorted(programs.items())),
    }


def read_traces(paths: Iterable[str | Path]) -> list[dict[str, Any]]:
    """The documents of several trace files, file by file."""
    out: list[dict[str, Any]] = []
    for p in paths:
        out.extend(read_trace_file(p))
    return out


def op_events(docs: Sequence[Mapping[str, Any]], fingerprint: str) -> dict[int, list[dict[str, Any]]]:
    """Op events of the executions of the program with `fingerprint`, by op id (for `dif inspect --trace`)."""
    out: dict[int, list[dict[str, Any]]] = {}
    for doc in docs:
        if doc["data"].get("fingerprint") != fingerprint:
            continue
        for ev in doc["events"]:
            if ev["name"] == "op":
                out.setdefault(int(ev["op_id"]), []).append(dict(ev))
    return out
