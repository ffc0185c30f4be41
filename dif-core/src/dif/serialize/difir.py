"""`.difir`: the canonical binary form of a DiffIR program (what frontends emit and tools load).

A `dif.serialize.container` (magic `\\x89DIFIR\\r\\n`, version 1) with sections
    program      canonical JSON (sorted keys, no spaces, ASCII):
                 {"name", "inputs": [[name, dtype, shape]], "params": [...],
                  "nodes": [[op, [operand names], [[name, dtype, shape]], {attr: value}]], "outputs": [names]}
    fingerprint  `dif.fingerprint.fingerprint` of the program, ASCII hex
    meta         JSON object str -> str (optional)
    provenance   the `dif.serialize.provenance` sidecar document (optional)
Loading checks the container, every field's type and size, re-verifies the program and compares
the fingerprint; every failure is a `DifError` subclass, never a raw Python error.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from attrs import evolve

from dif.dtypes import DType
from dif.errors import ChecksumError, FormatError, VerifyError
from dif.fingerprint import fingerprint
from dif.ir.program import AttrValue, Node, Program, Value
from dif.ir.types import TensorType
from dif.ops.registry import OPS, OpTable
from dif.serialize.container import pack, read_bytes, unpack, write_atomic
from dif.serialize.provenance import provenance_from_bytes, provenance_to_bytes
from dif.verify import MAX_RANK, verify_program

MAGIC = b"\x89DIFIR\r\n"
VERSION = 1
SUFFIX = ".difir"
REQUIRED_SECTIONS = frozenset({"program", "fingerprint"})
KNOWN_SECTIONS = REQUIRED_SECTIONS | {"meta", "provenance"}
# Guards against hostile or corrupt files (a real model program is far below every one of them).
MAX_VALUES = 1 << 22
MAX_NAME = 4096
MAX_OPERANDS = 1 << 16
MAX_DIM = 1 << 48
MAX_ATTR_ITEMS = 1 << 20
MAX_ATTR_DEPTH = 32
MAX_STRING = 1 << 24


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True).encode()


def _value_doc(v: Value) -> list[Any]:
    return [v.name, v.type.dtype.value, list(v.type.shape)]


def _attr_doc(value: AttrValue) -> Any:
    return [_attr_doc(v) for v in value] if isinstance(value, tuple | list) else value


def program_doc(program: Program) -> dict[str, Any]:
    """The JSON-ready content of the `program` section."""
    return {
        "name": program.name,
        "inputs": [_value_doc(v) for v in program.inputs],
        "params": [_value_doc(v) for v in program.params],
        "nodes": [
            [n.op, list(n.operands), [_value_doc(r) for r in n.results], {k: _attr_doc(a) for k, a in n.attrs.items()}]
            for n in program.nodes
        ],
        "outputs": list(program.outputs),
    }


def program_to_bytes(program: Program) -> bytes:
    """Deterministic `.difir` bytes (equal programs with equal meta/provenance give equal bytes)."""
    sections = {
        "program": _dumps(program_doc(program)),
        "fingerprint": fingerprint(program).encode(),
        "meta": _dumps(dict(program.meta)),
    }
    if program.provenance:
        sections["provenance"] = provenance_to_bytes(program)
    return pack(MAGIC, VERSION, sections)


# -- decoding -------------------------------------------------------------------------------------


class _Decoder:
    def __init__(self, what: str) -> None:
        self.what = what

    def fail(self, message: str) -> FormatError:
        return FormatError(f"{self.what}: {message}", hint="the file is corrupt or not written by dif; re-create it")

    def items(self, doc: Any, where: str, limit: int = MAX_VALUES) -> list[Any]:
        if not isinstance(doc, list) or len(doc) > limit:
            raise self.fail(f"{where} is not a list of at most {limit} items")
        return doc

    def name(self, doc: Any, where: str) -> str:
        if not isinstance(doc, str) or len(doc) > MAX_NAME:
            raise self.fail(f"{where} is not a name (a string of at most {MAX_NAME} characters)")
        return doc

    def value(self, doc: Any, where: str) -> Value:
        if not isinstance(doc, list) or len(doc) != 3:
            raise self.fail(f"{where} is not [name, dtype, shape]")
        name = self.name(doc[0], where)
        if not isinstance(doc[1], str) or doc[1] not in DType._value2member_map_:
            raise self.fail(f"{where} ({name!r}): unknown dtype {str(doc[1])[:40]!r}")
        shape = self.items(doc[2], f"{where} ({name!r}) shape", MAX_RANK)
        if not all(isinstance(d, int) and not isinstance(d, bool) and 0 <= d <= MAX_DIM for d in shape):
            raise self.fail(f"{where} ({name!r}): shape {str(shape)[:80]} is not a list of dims in 0..2^48")
        return Value(name, TensorType(tuple(shape), DType(doc[1])))

    def attr(self, doc: Any, where: str, depth: int = 0) -> AttrValue:
        if doc is None or isinstance(doc, bool | int | float):
            return doc  # type: ignore[no-any-return]
        if isinstance(doc, str):
            if len(doc) > MAX_STRING:
                raise self.fail(f"{where}: string attribute longer than {MAX_STRING}")
            return doc
        if isinstance(doc, list) and depth < MAX_ATTR_DEPTH:
            return tuple(self.attr(v, where, depth + 1) for v in self.items(doc, where, MAX_ATTR_ITEMS))
        raise self.fail(f"{where}: attribute value {str(doc)[:60]} is not a number, string, bool, null or list")

    def node(self, index: int, doc: Any) -> Node:
        where = f"node {index}"
        if not isinstance(doc, list) or len(doc) != 4:
            raise self.fail(f"{where} is not [op, operands, results, attrs]")
        op = self.name(doc[0], f"{where} op")
        names = self.items(doc[1], f"{where} operands", MAX_OPERANDS)
        operands = tuple(self.name(o, f"{where} operand") for o in names)
        results = tuple(self.value(r, f"{where} result") for r in self.items(doc[2], f"{where} results", MAX_OPERANDS))
        if not isinstance(doc[3], dict) or len(doc[3]) > MAX_OPERANDS:
            raise self.fail(f"{where} ({op}) attrs is not an object")
        attrs = {
            self.name(k, f"{where} attr name"): self.attr(v, f"{where} ({op}) attr {k!r}") for k, v in doc[3].items()
        }
        return Node(index, op, operands, results, attrs)

    def program(self, doc: Any, meta: dict[str, str]) -> Program:
        if not isinstance(doc, dict) or set(doc) != {"name", "inputs", "params", "nodes", "outputs"}:
            raise self.fail("program section is not an object with name, inputs, params, nodes, outputs")
        return Program(
            self.name(doc["name"], "program name"),
            tuple(self.value(v, "input") for v in self.items(doc["inputs"], "inputs")),
            tuple(self.value(v, "param") for v in self.items(doc["params"], "params")),
            tuple(self.node(i, n) for i, n in enumerate(self.items(doc["nodes"], "nodes"))),
            tuple(self.name(o, "output") for o in self.items(doc["outputs"], "outputs")),
            {},
            meta,
        )

    def meta(self, doc: Any) -> dict[str, str]:
        if not isinstance(doc, dict) or len(doc) > MAX_OPERANDS:
            raise self.fail("meta section is not a JSON object")
        for k, v in doc.items():
            if not isinstance(v, str) or len(v) > MAX_STRING or len(k) > MAX_NAME:
                raise self.fail(f"meta entry {k[:40]!r} is not a string (at most {MAX_STRING} characters)")
        return dict(doc)


def _json(data: bytes, what: str, section: str) -> Any:
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"{what}: section '{section}' is not UTF-8 JSON ({type(exc).__name__})") from None


def program_from_bytes(data: bytes, what: str = "<bytes>", *, table: OpTable = OPS) -> Program:
    """Decode, verify (against `table`) and fingerprint-check `.difir` bytes; `what` names the source."""
    _version, sections = unpack(bytes(data), MAGIC, (VERSION,), what)
    missing, unknown = REQUIRED_SECTIONS - set(sections), set(sections) - KNOWN_SECTIONS
    if missing or unknown:
        raise FormatError(
            f"{what}: sections {sorted(sections)[:8]}; missing {sorted(missing)}, unknown {sorted(unknown)[:8]}",
            hint="this .difir was not written by a compatible dif",
        )
    dec = _Decoder(what)
    meta = dec.meta(_json(sections["meta"], what, "meta")) if "meta" in sections else {}
    program = dec.program(_json(sections["program"], what, "program"), meta)
    try:
        verify_program(program, table=table)
    except VerifyError as exc:
        raise VerifyError(f"{what}: {exc}") from None
    stored = sections["fingerprint"].decode("ascii", errors="replace")
    actual = fingerprint(program)
    if stored != actual:
        raise ChecksumError(
            f"{what}: stored fingerprint {stored[:16]}... differs from the program's {actual[:16]}...",
            hint="the program section was altered or written by another fingerprint algorithm; re-save it",
        )
    if "provenance" in sections:
        prov = provenance_from_bytes(sections["provenance"], what=f"{what} (provenance)", program=program)
        program = evolve(program, provenance=prov)
    return program


def save_program(program: Program, path: str | Path) -> None:
    """Write `program` as `.difir` atomically (temp file + rename)."""
    write_atomic(path, program_to_bytes(program))


def load_program(path: str | Path, *, table: OpTable = OPS) -> Program:
    return program_from_bytes(read_bytes(path, str(path)), what=str(path), table=table)
