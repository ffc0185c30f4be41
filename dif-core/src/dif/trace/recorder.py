"""The runtime's trace and capture points (called by every backend's executor at prepare and per op).

`begin(stage, program, backend)` returns None when nothing listens (no DIF_TRACE_FILE, no DIF_CAPTURE,
no in-process `collecting()`), so a backend pays one check per execution and one `is None` per op when
tracing is off. Otherwise a `Recorder` collects one event per op (op id, opcode, attribution kind,
provenance block, milliseconds, bytes written), runtime events (copies, allocations, waits), and the
captured op results; `finish()` appends the trace document to DIF_TRACE_FILE and writes the capture.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from attrs import define, field

from dif.env import DIF_CAPTURE, DIF_CAPTURE_DIR, DIF_TRACE_FILE
from dif.errors import DifError
from dif.trace.vocabulary import op_kind

if TYPE_CHECKING:
    from dif.ir.program import Node, Program

TRACE_KIND = "trace"
CAPTURE_MODES = ("ops", "blocks")
CAPTURE_KEY = "dif.capture"
"""safetensors metadata key of a capture: JSON with program, fingerprint, mode, order, ops, blocks."""

_collectors: list[list[dict[str, Any]]] = []
_fingerprints: dict[int, tuple[Program, str]] = {}


@contextmanager
def collecting() -> Iterator[list[dict[str, Any]]]:
    """Within the block every execution records a trace; the finished documents are appended to the
    yielded list (as well as to DIF_TRACE_FILE when that is set). `dif trace program` uses it."""
    docs: list[dict[str, Any]] = []
    _collectors.append(docs)
    try:
        yield docs
    finally:
        _collectors.remove(docs)


def _fingerprint(program: Program) -> str:
    """The program's fingerprint, remembered for the last few programs (a denoiser runs once per step)."""
    hit = _fingerprints.get(id(program))
    if hit is not None and hit[0] is program:
        return hit[1]
    from dif.fingerprint import fingerprint

    if len(_fingerprints) >= 8:
        _fingerprints.clear()
    value = fingerprint(program)
    _fingerprints[id(program)] = (program, value)
    return value


def block_ends(program: Program, schedule: Sequence[int]) -> frozenset[int]:
    """Node ids that end a run of consecutive nodes (in `schedule` order) with the same provenance
    module and block: the boundaries `DIF_CAPTURE=blocks` captures. Nodes without a block are their own run."""
    ends: set[int] = set()
    prev: tuple[str, str] | None = None
    prev_id: int | None = None
    for node_id in schedule:
        prov = program.provenance.get(node_id)
        key = (prov.module, prov.block) if prov is not None and prov.block else None
        if prev_id is not None and (key is None or key != prev):
            ends.add(prev_id)
        prev, prev_id = key, node_id
    if prev_id is not None:
        ends.add(prev_id)
    return frozenset(ends)


@define
class Recorder:
    """One execution being traced and/or captured (mutable runtime state of a backend's run)."""

    stage: str
    program: Program
    backend: str
    trace: bool
    capture: str | None
    capture_ids: frozenset[int] | None = None
    events: list[dict[str, Any]] = field(factory=list)
    captured: dict[str, np.ndarray] = field(factory=dict)
    start: float = field(factory=time.perf_counter)

    @staticmethod
    def clock() -> float:
        return time.perf_counter()

    def wants_capture(self, node: Node) -> bool:
        """Whether `op` will keep this node's results (a device backend copies them to the host only then)."""
        return self.capture is not None and (self.capture_ids is None or node.id in self.capture_ids)

    def op(
        self,
        node: Node,
        started: float,
        results: Sequence[np.ndarray],
        *,
        impl: str = "",
        ms: float | None = None,
        start_ms: float | None = None,
        **fields: Any,
    ) -> None:
        """Node `node` ran from `started` (`clock()`) until now; `results` are its outputs as the backend
        holds them (host arrays; a device backend passes what it copied, or nothing). `impl` names the
        backend implementation (kernel, library algorithm) that ran it. A device backend that timed the
        node itself (device events) passes `ms` and `start_ms` (from the execution's first event)."""
        if self.trace:
            if ms is None:
                ms = (time.perf_counter() - started) * 1000.0
            if start_ms is None:
                start_ms = (started - self.start) * 1000.0
            event: dict[str, Any] = {
                "name": "op",
                "op_id": node.id,
                "opcode": node.op,
                "kind": op_kind(node.op),
                "ms": round(ms, 6),
                "start_ms": round(start_ms, 6),
                "bytes": int(sum(r.type.nbytes for r in node.results)),
            }
            prov = self.program.provenance.get(node.id)
            if prov is not None:
                event.update({k: v for k, v in (("module", prov.module), ("block", prov.block)) if v})
                if prov.section:
                    event["section"] = prov.section
            if impl:
                event["impl"] = impl
            event.update(fields)
            self.events.append(event)
        if self.wants_capture(node):
            for value, arr in zip(node.results, results, strict=False):
                self.captured[value.name] = np.array(arr, copy=True)

    def event(self, name: str, *, ms: float | None = None, nbytes: int | None = None, **fields: Any) -> None:
        """A runtime event (`dif.trace.vocabulary.RUNTIME_KINDS`: a copy, an allocation, a wait...)."""
        if not self.trace:
            return
        event: dict[str, Any] = {"name": name, "kind": name, **fields}
        if ms is not None:
            event["ms"] = round(float(ms), 6)
        if nbytes is not None:
            event["bytes"] = int(nbytes)
        self.events.append(event)

    def finish(self) -> dict[str, Any] | None:
        """Close the execution: the trace document (appended to DIF_TRACE_FILE and to any collector,
        returned) and the capture file. Returns None when only capturing."""
        wall = (time.perf_counter() - self.start) * 1000.0
        if self.capture is not None:
            self._write_capture()
        if not self.trace:
            return None
        from dif.telemetry import build_document

        events = [{"name": f"dif::{self.stage}", "ms": round(wall, 6)}, *self.events]
        data = {
            "stage": self.stage,
            "program": self.program.name,
            "fingerprint": _fingerprint(self.program),
            "backend": self.backend,
            "wall_ms": round(wall, 6),
            "nodes": len(self.program.nodes),
        }
        doc = build_document(TRACE_KIND, tool=f"dif.trace ({self.backend} {self.stage})", data=data, events=events)
        path = DIF_TRACE_FILE.get()
        if path:
            append_line(Path(path), json.dumps(doc, separators=(",", ":"), allow_nan=False))
        for docs in _collectors:
            docs.append(doc)
        return doc

    def _write_capture(self) -> None:
        from dif.serialize.diftensor import save_tensors

        folder = Path(DIF_CAPTURE_DIR.get() or "dif-capture")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise DifError(f"DIF_CAPTURE_DIR {folder}: cannot create the folder ({exc.strerror})") from None
        stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in self.program.name) or "program"
        n = 0
        while (folder / f"{stem}.{n}.diftensor").exists():
            n += 1
        producers = self.program.producers
        order = [r.name for node in self.program.nodes for r in node.results if r.name in self.captured]
        blocks = {}
        for name in order:
            prov = self.program.provenance.get(producers[name].id)
            if prov is not None and prov.block:
                blocks[name] = "/".join(p for p in (prov.module, prov.block) if p)
        meta = {
            "program": self.program.name,
            "fingerprint": _fingerprint(self.program),
            "backend": self.backend,
            "mode": self.capture,
            "order": order,
            "ops": {name: [producers[name].id, producers[name].op] for name in order},
            "blocks": blocks,
        }
        save_tensors(folder / f"{stem}.{n}.diftensor", self.captured, {CAPTURE_KEY: json.dumps(meta, sort_keys=True)})


def append_line(path: Path, line: str) -> None:
    """Append `line` + newline to `path` in one write (one document per line; concurrent writers of
    whole lines do not interleave on POSIX append)."""
    try:
        with path.open("a", encoding="utf-8") as f:
            f.write(line + "\n")
    except OSError as exc:
        raise DifError(f"DIF_TRACE_FILE {path}: cannot append ({exc.strerror})") from None


def begin(stage: str, program: Program, backend: str, schedule: Sequence[int] | None = None) -> Recorder | None:
    """A recorder for one execution of `program` ("prepare" or "run"), or None when nothing listens.
    `schedule` (the plan's) decides the block boundaries of DIF_CAPTURE=blocks."""
    trace = bool(_collectors) or bool(DIF_TRACE_FILE.get())
    capture = DIF_CAPTURE.get_choice(CAPTURE_MODES) if stage == "run" else None
    if not trace and capture is None:
        return None
    ids = None
    if capture == "blocks":
        ids = block_ends(program, schedule if schedule is not None else [n.id for n in program.nodes])
    return Recorder(stage, program, backend, trace, capture, ids)
