"""What `dif bisect` compares: runtime captures (DIF_CAPTURE `.diftensor` files) and oracle fixtures.

Oracle-fixture manifest protocol (JSON, written by development scripts from the reference library,
checked by `dif bisect validate-oracle`, read by `dif bisect manifest`):
    {"schema": "dif-oracle-fixture/1",
     "producer": {"library": "diffusers", "version": "0.42.1", "script": "...", ...},
     "tensors": "oracle.safetensors",            # relative to the manifest's folder
     "boundaries": [{"name": "...",             # reported name, unique, in semantic order
                     "tensor": "...",           # key in the tensors file
                     "dif": "..." | null,       # key of the matching tensor in a dif capture
                     "shape": [..], "dtype": "f32"}]}
Tools that read it stay model-neutral: the model-specific mapping lives in the script that wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from attrs import frozen

from dif.errors import FormatError

ORACLE_SCHEMA = "dif-oracle-fixture/1"
_DTYPES = {"f64": np.float64, "f32": np.float32, "f16": np.float16}


@frozen
class Capture:
    """A DIF_CAPTURE file: tensors by value name and what the runtime recorded about them."""

    path: Path
    tensors: dict[str, np.ndarray]
    program: str
    fingerprint: str
    backend: str
    mode: str
    order: tuple[str, ...]
    ops: dict[str, tuple[int, str]]
    blocks: dict[str, str]


def load_capture(path: str | Path) -> Capture:
    """Read a capture; `FormatError` when it is not one (a plain tensor file has no capture metadata)."""
    from dif.serialize.diftensor import load_tensors
    from dif.trace.recorder import CAPTURE_KEY

    path = Path(path)
    tensors, meta = load_tensors(path)
    raw = meta.get(CAPTURE_KEY)
    if raw is None:
        raise FormatError(f"{path}: not a dif capture (no '{CAPTURE_KEY}' metadata)", hint="write it with DIF_CAPTURE")
    try:
        doc = json.loads(raw)
        order = tuple(str(n) for n in doc["order"])
        ops = {str(k): (int(v[0]), str(v[1])) for k, v in doc["ops"].items()}
        capture = Capture(
            path,
            dict(tensors),
            str(doc["program"]),
            str(doc["fingerprint"]),
            str(doc["backend"]),
            str(doc["mode"]),
            order,
            ops,
            {str(k): str(v) for k, v in doc.get("blocks", {}).items()},
        )
    except (ValueError, KeyError, TypeError, IndexError, AttributeError) as exc:
        raise FormatError(f"{path}: capture metadata is malformed ({type(exc).__name__}: {exc})"[:300]) from None
    absent = [n for n in order if n not in tensors]
    if absent:
        raise FormatError(f"{path}: capture metadata lists {absent[0]!r} but the file has no such tensor")
    return capture


@frozen
class OracleBoundary:
    name: str
    tensor: str
    dif: str | None
    shape: tuple[int, ...]
    dtype: str


@frozen
class OracleFixture:
    path: Path
    tensors_path: Path
    producer: dict[str, Any]
    boundaries: tuple[OracleBoundary, ...]


def _fail(path: Path, message: str) -> FormatError:
    return FormatError(f"{path}: {message}", hint="regenerate the fixture with its script, or fix the manifest")


def read_manifest(path: str | Path) -> OracleFixture:
    """Parse a manifest (the structure only; `validate_oracle` also opens the tensors)."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise FormatError(f"{path}: cannot read the manifest ({exc.strerror})") from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise _fail(path, "the manifest is not JSON") from None
    if not isinstance(doc, dict) or doc.get("schema") != ORACLE_SCHEMA:
        found = doc.get("schema") if isinstance(doc, dict) else type(doc).__name__
        raise _fail(path, f"schema is {found!r}, expected {ORACLE_SCHEMA!r}")
    extra = sorted(set(doc) - {"schema", "producer", "tensors", "boundaries"})
    if extra:
        raise _fail(path, f"unknown keys {extra}")
    if not isinstance(doc.get("producer"), dict) or not isinstance(doc["producer"].get("library"), str):
        raise _fail(path, "producer must be an object naming the library that made the tensors")
    if not isinstance(doc.get("tensors"), str) or not doc["tensors"]:
        raise _fail(path, "tensors must name the safetensors file (relative to the manifest)")
    raw = doc.get("boundaries")
    if not isinstance(raw, list) or not raw:
        raise _fail(path, "boundaries must be a non-empty list")
    out, seen = [], set()
    for i, b in enumerate(raw):
        where = f"boundaries[{i}]"
        if not isinstance(b, dict) or set(b) - {"name", "tensor", "dif", "shape", "dtype"}:
            raise _fail(path, f"{where} must be an object with name, tensor, dif, shape, dtype")
        name, tensor, dif_key = b.get("name"), b.get("tensor"), b.get("dif")
        if not isinstance(name, str) or not name or not isinstance(tensor, str) or not tensor:
            raise _fail(path, f"{where} needs a non-empty name and tensor")
        if name in seen:
            raise _fail(path, f"{where}: boundary name {name!r} appears twice")
        seen.add(name)
        if dif_key is not None and not isinstance(dif_key, str):
            raise _fail(path, f"{where} ({name}): dif must be a string or null")
        shape = b.get("shape")
        if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) for d in shape):
            raise _fail(path, f"{where} ({name}): shape must be a list of integers")
        if b.get("dtype") not in _DTYPES:
            raise _fail(path, f"{where} ({name}): dtype {b.get('dtype')!r} is not one of {sorted(_DTYPES)}")
        out.append(OracleBoundary(name, tensor, dif_key, tuple(shape), b["dtype"]))
    tensors_path = (path.parent / doc["tensors"]).resolve()
    return OracleFixture(path, tensors_path, dict(doc["producer"]), tuple(out))


def load_oracle(path: str | Path) -> tuple[OracleFixture, dict[str, np.ndarray]]:
    """The manifest and its tensors, checked against each other (`validate_oracle`)."""
    from dif.serialize.diftensor import load_tensors

    fixture = read_manifest(path)
    if not fixture.tensors_path.is_file():
        raise _fail(fixture.path, f"its tensors file {fixture.tensors_path} does not exist")
    tensors, _ = load_tensors(fixture.tensors_path)
    for b in fixture.boundaries:
        if b.tensor not in tensors:
            raise _fail(
                fixture.path, f"boundary {b.name!r} names tensor {b.tensor!r}, which {fixture.tensors_path.name} lacks"
            )
        arr = tensors[b.tensor]
        if tuple(arr.shape) != b.shape:
            raise _fail(
                fixture.path,
                f"boundary {b.name!r}: tensor {b.tensor!r} is {list(arr.shape)}, manifest says {list(b.shape)}",
            )
        if arr.dtype != np.dtype(_DTYPES[b.dtype]):
            raise _fail(
                fixture.path, f"boundary {b.name!r}: tensor {b.tensor!r} is {arr.dtype}, manifest says {b.dtype}"
            )
    return fixture, dict(tensors)


def validate_oracle(path: str | Path) -> dict[str, Any]:
    """Check a manifest and its tensors; returns a summary (with non-finite counts per boundary)."""
    fixture, tensors = load_oracle(path)
    return {
        "manifest": str(fixture.path),
        "tensors": str(fixture.tensors_path),
        "producer": fixture.producer,
        "boundaries": [
            {
                "name": b.name,
                "tensor": b.tensor,
                "dif": b.dif,
                "shape": list(b.shape),
                "dtype": b.dtype,
                "nonfinite": int((~np.isfinite(tensors[b.tensor])).sum()),
            }
            for b in fixture.boundaries
        ],
    }


def write_manifest(
    path: str | Path,
    tensors: Mapping[str, np.ndarray],
    boundaries: list[dict[str, Any]],
    producer: Mapping[str, Any],
) -> Path:
    """Write `tensors` beside the manifest (`<stem>.safetensors`) and the manifest itself; `boundaries`
    are {"name", "tensor", "dif"} in semantic order (shape and dtype are filled in from the tensors).
    Development scripts call this; the result passes `validate_oracle`."""
    from dif.serialize.container import write_atomic
    from dif.serialize.diftensor import save_tensors

    path = Path(path)
    dtype_name = {np.dtype(v): k for k, v in _DTYPES.items()}
    tensors_path = path.with_name(path.stem + ".safetensors")
    save_tensors(tensors_path, dict(tensors), dif_metadata=False)
    rows = [
        {
            "name": b["name"],
            "tensor": b["tensor"],
            "dif": b.get("dif"),
            "shape": list(tensors[b["tensor"]].shape),
            "dtype": dtype_name[np.asarray(tensors[b["tensor"]]).dtype],
        }
        for b in boundaries
    ]
    doc = {"schema": ORACLE_SCHEMA, "producer": dict(producer), "tensors": tensors_path.name, "boundaries": rows}
    write_atomic(path, (json.dumps(doc, indent=1, sort_keys=True) + "\n").encode())
    return path
