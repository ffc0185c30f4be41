"""The telemetry document: builder output validates; each kind of damage is caught by name."""

from __future__ import annotations

import copy
import json
import time

import pytest

from dif.errors import FormatError
from dif.target import RuntimeBudget, TargetProfile
from dif.telemetry import SCHEMA, EventLog, build_document, dumps, hardware_entry, validate_document

PROFILE = TargetProfile(backend="cpu", device="host", dtypes=("f32",))


def _doc() -> dict:
    log = EventLog()
    log.record("load", bytes=128)
    with log.span("run", op_id=3) as ev:
        ev["backend"] = "cpu"
    return build_document(
        "run",
        tool="dif run",
        data={"out": "y.safetensors"},
        hardware=[hardware_entry("cpu", profile=PROFILE), hardware_entry("cuda", reason="no CUDA driver")],
        runtime_budget={"cpu": RuntimeBudget(free_memory_bytes=1 << 30)},
        events=log,
        argv=["dif", "run"],
        plugins=[{"name": "cpu", "version": "0.1.0", "error": None}],
    )


def test_builder_output_is_valid_and_complete():
    doc = _doc()
    validate_document(doc)
    assert doc["schema"] == SCHEMA == "dif-telemetry/1"
    assert list(doc) == ["schema", "kind", "provenance", "hardware", "runtime_budget", "events", "data"]
    assert doc["provenance"]["tool"] == "dif run"
    assert doc["hardware"][0]["fingerprint"] == PROFILE.fingerprint()
    assert doc["hardware"][1] == {
        "backend": "cuda",
        "available": False,
        "reason": "no CUDA driver",
        "profile": None,
        "fingerprint": None,
    }
    assert doc["runtime_budget"]["cpu"]["free_memory_bytes"] == 1 << 30
    assert [e["name"] for e in doc["events"]] == ["load", "run"]
    assert doc["events"][1]["ms"] >= 0 and doc["events"][1]["backend"] == "cpu"
    assert json.loads(dumps(doc)) == doc


def test_span_measures_time():
    log = EventLog()
    with log.span("sleep"):
        time.sleep(0.01)
    assert log.events[0]["ms"] >= 5


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda d: d.update(schema="dif-telemetry/0"), "schema is"),
        (lambda d: d.pop("events"), "missing keys: events"),
        (lambda d: d.update(extra=1), "unknown keys: extra"),
        (lambda d: d.update(kind=""), "kind must be"),
        (lambda d: d["provenance"].update(time="yesterday"), "not ISO 8601"),
        (lambda d: d["provenance"].update(argv="dif run"), "argv must be"),
        (lambda d: d["hardware"][0].update(profile={"backend": "cpu"}), "not a TargetProfile"),
        (lambda d: d["hardware"][1].update(reason=""), "gives no reason"),
        (lambda d: d["runtime_budget"].update(cpu={"free": 1}), "not a RuntimeBudget"),
        (lambda d: d["events"].append({"ms": 1.0}), "non-empty name"),
        (lambda d: d["events"].append({"name": "x", "ms": -1}), "ms must be"),
        (lambda d: d["events"].append({"name": "x", "bytes": 1.5}), "bytes must be"),
        (lambda d: d["events"].append({"name": "x", "op_id": "3"}), "op_id must be"),
        (lambda d: d.update(data=[]), "data must be"),
        (lambda d: d["data"].update(bad=float("nan")), "not plain JSON"),
    ],
)
def test_validation_names_each_problem(damage, message):
    doc = copy.deepcopy(_doc())
    damage(doc)
    with pytest.raises(FormatError, match=message):
        validate_document(doc)


def test_non_object_document():
    with pytest.raises(FormatError, match="not an object"):
        validate_document([])
