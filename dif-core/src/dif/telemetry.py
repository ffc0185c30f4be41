"""The one JSON document every dif tool emits with `--json` (schema "dif-telemetry/1").

Layout:
    {"schema": "dif-telemetry/1", "kind": "probe" | "run" | ...,
     "provenance": {"tool", "dif_version", "plugins": [{name, version, error}], "argv", "time", "host"},
     "hardware": [{"backend", "available", "reason", "profile": TargetProfile dict | null, "fingerprint"}],
     "runtime_budget": {backend name: RuntimeBudget dict},
     "events": [{"name", "op_id"?, "ms"?, "bytes"?, ...}],
     "data": {kind-specific}}
`build_document` makes one, `validate_document` checks one (tests run it on every tool's output).
"""

from __future__ import annotations

import datetime
import json
import platform
import sys
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from attrs import define, field

from dif import __version__
from dif.errors import FormatError
from dif.target import RuntimeBudget, TargetProfile

SCHEMA = "dif-telemetry/1"
TOP_LEVEL = ("schema", "kind", "provenance", "hardware", "runtime_budget", "events", "data")


@define
class EventLog:
    """Events collected while a tool runs; `span` times a block in milliseconds."""

    events: list[dict[str, Any]] = field(factory=list)

    def record(self, name: str, **fields: Any) -> dict[str, Any]:
        event = {"name": name, **fields}
        self.events.append(event)
        return event

    @contextmanager
    def span(self, name: str, **fields: Any) -> Iterator[dict[str, Any]]:
        """Record `name` with its wall time in `ms`; the yielded dict may receive more fields."""
        event: dict[str, Any] = {"name": name, **fields}
        start = time.perf_counter()
        try:
            yield event
        finally:
            event["ms"] = round((time.perf_counter() - start) * 1000.0, 3)
            self.events.append(event)


def hardware_entry(backend: str, *, profile: TargetProfile | None = None, reason: str = "") -> dict[str, Any]:
    """One `hardware` item: the backend's TargetProfile, or why it is unavailable."""
    return {
        "backend": backend,
        "available": profile is not None,
        "reason": reason,
        "profile": profile.to_dict() if profile is not None else None,
        "fingerprint": profile.fingerprint() if profile is not None else None,
    }


def _plugins_now() -> list[dict[str, Any]]:
    from dif.plugins.manager import plugin_records  # records only; never triggers loading

    return [{"name": r.name, "version": r.version, "error": r.error} for r in plugin_records()]


def build_document(
    kind: str,
    *,
    tool: str,
    data: Mapping[str, Any] | None = None,
    hardware: Sequence[Mapping[str, Any]] = (),
    runtime_budget: Mapping[str, RuntimeBudget | Mapping[str, Any]] | None = None,
    events: Sequence[Mapping[str, Any]] | EventLog = (),
    argv: Sequence[str] | None = None,
    plugins: Sequence[Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """A complete, validated telemetry document."""
    budgets = {
        name: (b.to_dict() if isinstance(b, RuntimeBudget) else dict(b)) for name, b in (runtime_budget or {}).items()
    }
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "kind": kind,
        "provenance": {
            "tool": tool,
            "dif_version": __version__,
            "plugins": [dict(p) for p in (plugins if plugins is not None else _plugins_now())],
            "argv": list(sys.argv if argv is None else argv),
            "time": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
            "host": {"python": platform.python_version(), "platform": platform.platform(terse=True)},
        },
        "hardware": [dict(h) for h in hardware],
        "runtime_budget": budgets,
        "events": [dict(e) for e in (events.events if isinstance(events, EventLog) else events)],
        "data": dict(data or {}),
    }
    validate_document(doc)
    return doc


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _problems(doc: Any) -> Iterator[str]:
    if not isinstance(doc, dict):
        yield f"document is {type(doc).__name__}, not an object"
        return
    missing = [k for k in TOP_LEVEL if k not in doc]
    extra = sorted(set(doc) - set(TOP_LEVEL))
    if missing:
        yield f"missing keys: {', '.join(missing)}"
    if extra:
        yield f"unknown keys: {', '.join(extra)}"
    if doc.get("schema") != SCHEMA:
        yield f"schema is {doc.get('schema')!r}, expected {SCHEMA!r}"
    if not isinstance(doc.get("kind"), str) or not doc.get("kind"):
        yield "kind must be a non-empty string"
    yield from _provenance_problems(doc.get("provenance"))
    yield from _hardware_problems(doc.get("hardware"))
    budgets = doc.get("runtime_budget")
    if not isinstance(budgets, dict):
        yield "runtime_budget must be an object"
    else:
        for name, budget in budgets.items():
            try:
                RuntimeBudget.from_dict(budget)
            except Exception as exc:
                yield f"runtime_budget[{name!r}] is not a RuntimeBudget: {exc}"
    yield from _event_problems(doc.get("events"))
    if not isinstance(doc.get("data"), dict):
        yield "data must be an object"
    try:
        json.dumps(doc, allow_nan=False)
    except (TypeError, ValueError) as exc:
        yield f"not plain JSON: {exc}"


def _provenance_problems(prov: Any) -> Iterator[str]:
    if not isinstance(prov, dict):
        yield "provenance must be an object"
        return
    for key in ("tool", "dif_version", "time"):
        if not isinstance(prov.get(key), str) or not prov.get(key):
            yield f"provenance.{key} must be a non-empty string"
    if not isinstance(prov.get("argv"), list) or not all(isinstance(a, str) for a in prov.get("argv", [])):
        yield "provenance.argv must be a list of strings"
    plugins = prov.get("plugins")
    if not isinstance(plugins, list) or not all(
        isinstance(p, dict) and isinstance(p.get("name"), str) for p in plugins
    ):
        yield "provenance.plugins must be a list of objects with a name"
    try:
        datetime.datetime.fromisoformat(str(prov.get("time")))
    except ValueError:
        yield f"provenance.time {prov.get('time')!r} is not ISO 8601"


def _hardware_problems(hardware: Any) -> Iterator[str]:
    if not isinstance(hardware, list):
        yield "hardware must be a list"
        return
    for i, entry in enumerate(hardware):
        where = f"hardware[{i}]"
        if not isinstance(entry, dict):
            yield f"{where} must be an object"
            continue
        if not isinstance(entry.get("backend"), str) or not isinstance(entry.get("available"), bool):
            yield f"{where} needs a backend name and an 'available' boolean"
            continue
        if entry["available"]:
            try:
                TargetProfile.from_dict(entry.get("profile"))  # type: ignore[arg-type]
            except Exception as exc:
                yield f"{where}.profile is not a TargetProfile: {exc}"
        elif not isinstance(entry.get("reason"), str) or not entry.get("reason"):
            yield f"{where} is unavailable but gives no reason"


def _event_problems(events: Any) -> Iterator[str]:
    if not isinstance(events, list):
        yield "events must be a list"
        return
    for i, event in enumerate(events):
        where = f"events[{i}]"
        if not isinstance(event, dict) or not isinstance(event.get("name"), str) or not event.get("name"):
            yield f"{where} must be an object with a non-empty name"
            continue
        if "op_id" in event and not _is_int(event["op_id"]):
            yield f"{where}.op_id must be an integer"
        if "ms" in event and (
            not isinstance(event["ms"], int | float) or isinstance(event["ms"], bool) or event["ms"] < 0
        ):
            yield f"{where}.ms must be a non-negative number"
        if "bytes" in event and (not _is_int(event["bytes"]) or event["bytes"] < 0):
            yield f"{where}.bytes must be a non-negative integer"


def validate_document(doc: Any) -> None:
    """Raise `FormatError` listing every way `doc` departs from the schema."""
    problems = list(_problems(doc))
    if problems:
        raise FormatError("telemetry document is invalid: " + "; ".join(problems))


def dumps(doc: Mapping[str, Any]) -> str:
    """The document as indented JSON (validated first)."""
    validate_document(doc)
    return json.dumps(doc, indent=2, allow_nan=False)
