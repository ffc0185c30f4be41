"""Provenance sidecar: where each node came from, stored beside a program (a `.difir` section or a
`.provenance.json` file) for `dif inspect`, verifier messages and telemetry attribution.

Document (UTF-8 JSON, sorted keys):
    {"format": "dif.provenance", "version": 1, "program": NAME, "fingerprint": HEX,
     "nodes": [[ID, {"module": .., "block": .., "section": .., "frontend_revision": ..,
                     "tensors": [..], "transforms": [..]}], ...]}
Empty fields are left out. Loading validates everything and raises only `FormatError` subclasses.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dif.errors import FormatError, VersionError
from dif.fingerprint import fingerprint
from dif.ir.program import Program, Provenance
from dif.serialize.container import read_bytes, write_atomic

FORMAT = "dif.provenance"
VERSION = 1
SUFFIX = ".provenance.json"
MAX_NODES = 10_000_000
MAX_STRING = 1 << 16
MAX_TENSORS = 1 << 16
_STR_FIELDS = ("module", "block", "section", "frontend_revision")
_LIST_FIELDS = ("tensors", "transforms")


def provenance_to_bytes(program: Program) -> bytes:
    """The sidecar document for `program.provenance`, bound to the program's fingerprint."""
    nodes = []
    for node_id in sorted(program.provenance):
        prov = program.provenance[node_id]
        entry: dict[str, Any] = {f: getattr(prov, f) for f in _STR_FIELDS if getattr(prov, f)}
        entry.update({f: list(getattr(prov, f)) for f in _LIST_FIELDS if getattr(prov, f)})
        nodes.append([node_id, entry])
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "program": program.name,
        "fingerprint": fingerprint(program),
        "nodes": nodes,
    }
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()


def _string(value: object, where: str) -> str:
    if not isinstance(value, str) or len(value) > MAX_STRING:
        raise FormatError(f"{where} is not a string of at most {MAX_STRING} characters")
    return value


def _entry(node_id: object, entry: object, what: str) -> tuple[int, Provenance]:
    if not isinstance(node_id, int) or isinstance(node_id, bool) or not 0 <= node_id < MAX_NODES:
        raise FormatError(f"{what}: provenance node id {node_id!r} is not a valid node id")
    where = f"{what}: provenance of node {node_id}"
    if not isinstance(entry, dict) or not set(entry) <= {*_STR_FIELDS, *_LIST_FIELDS}:
        raise FormatError(f"{where} is not an object with fields {', '.join(_STR_FIELDS + _LIST_FIELDS)}")
    fields: dict[str, Any] = {f: _string(entry[f], f"{where}, {f}") for f in _STR_FIELDS if f in entry}
    for f in _LIST_FIELDS:
        items = entry.get(f, [])
        if not isinstance(items, list) or len(items) > MAX_TENSORS:
            raise FormatError(f"{where}, {f} is not a list of at most {MAX_TENSORS} strings")
        fields[f] = tuple(_string(s, f"{where}, {f}") for s in items)
    return node_id, Provenance(**fields)


def provenance_from_bytes(
    data: bytes, *, what: str = "<provenance>", program: Program | None = None
) -> dict[int, Provenance]:
    """Node id -> Provenance from a sidecar document. With `program`, the sidecar must carry that
    program's fingerprint and name only its node ids (else `FormatError`)."""
    try:
        doc = json.loads(bytes(data).decode("utf-8"), parse_constant=_reject_constant)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"{what}: provenance is not UTF-8 JSON ({type(exc).__name__})") from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise FormatError(f"{what}: not a dif provenance document", hint=f'expected "format": "{FORMAT}"')
    if doc.get("version") != VERSION:
        raise VersionError(f"{what}: provenance version {doc.get('version')!r} is not {VERSION}")
    nodes, fp = doc.get("nodes"), doc.get("fingerprint")
    _string(doc.get("program"), f"{what}: program name")
    _string(fp, f"{what}: fingerprint")
    if not isinstance(nodes, list) or len(nodes) > MAX_NODES:
        raise FormatError(f"{what}: 'nodes' is not a list")
    out: dict[int, Provenance] = {}
    for item in nodes:
        if not isinstance(item, list) or len(item) != 2:
            raise FormatError(f"{what}: provenance entry {str(item)[:60]} is not [node_id, fields]")
        node_id, prov = _entry(item[0], item[1], what)
        if node_id in out:
            raise FormatError(f"{what}: node {node_id} has two provenance entries")
        out[node_id] = prov
    if program is not None:
        if fp != fingerprint(program):
            raise FormatError(
                f"{what}: provenance belongs to another program (fingerprint {str(fp)[:16]}...)",
                hint="re-save the sidecar together with the program",
            )
        stray = sorted(k for k in out if k >= len(program.nodes))
        if stray:
            raise FormatError(
                f"{what}: provenance names node ids {stray[:5]} beyond the program's {len(program.nodes)}"
            )
    return out


def _reject_constant(name: str) -> None:
    raise ValueError(f"JSON constant {name} is not allowed")


def save_provenance(program: Program, path: str | Path) -> None:
    """Write the sidecar atomically (conventionally NAME.provenance.json beside NAME.difir)."""
    write_atomic(path, provenance_to_bytes(program))


def load_provenance(path: str | Path, *, program: Program | None = None) -> dict[int, Provenance]:
    return provenance_from_bytes(read_bytes(path, str(path)), what=str(path), program=program)
