"""`.difir` round trips, the structural fingerprint, the provenance sidecar, and loader failures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from attrs import evolve

from dif.errors import ChecksumError, FormatError, VerifyError, VersionError
from dif.fingerprint import fingerprint
from dif.ir.program import Node, Program, Provenance, Value
from dif.ir.types import TensorType
from dif.ops.registry import OpTable, defop
from dif.serialize import container
from dif.serialize.difir import (
    MAGIC,
    VERSION,
    load_program,
    program_doc,
    program_from_bytes,
    program_to_bytes,
    save_program,
)
from dif.serialize.provenance import load_provenance, provenance_from_bytes, provenance_to_bytes, save_provenance


def _sections(data: bytes) -> dict[str, bytes]:
    return container.unpack(data, MAGIC, (VERSION,), "test")[1]


def _repack(data: bytes, **changes: bytes | None) -> bytes:
    sections = _sections(data)
    for name, value in changes.items():
        if value is None:
            sections.pop(name)
        else:
            sections[name] = value
    return container.pack(MAGIC, VERSION, sections)


def _nested(depth: int) -> list:
    doc: list = [1]
    for _ in range(depth):
        doc = [doc]
    return doc


def _with_doc(program: Program, edit) -> bytes:  # type: ignore[no-untyped-def]
    """`.difir` bytes whose program section was edited, with a fingerprint that matches the edit."""
    doc = program_doc(program)
    edit(doc)
    return _repack(program_to_bytes(program), program=json.dumps(doc).encode())


# -- round trips ----------------------------------------------------------------------------------


def test_bytes_round_trip(program: Program) -> None:
    data = program_to_bytes(program)
    back = program_from_bytes(data)
    assert back == program
    assert fingerprint(back) == fingerprint(program)
    assert back.meta == program.meta
    assert back.provenance == program.provenance
    assert back.provenance[1].tensors == ("blocks.0.attn.qkv.weight",)
    assert program_to_bytes(back) == data  # deterministic


def test_file_round_trip_is_atomic(program: Program, tmp_path: Path) -> None:
    path = tmp_path / "model.difir"
    save_program(program, path)
    assert load_program(path) == program
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model.difir"]  # no temp file left behind
    assert path.read_bytes()[:8] == MAGIC


def test_without_provenance_and_meta(program: Program) -> None:
    bare = evolve(program, provenance={}, meta={})
    data = program_to_bytes(bare)
    assert "provenance" not in _sections(data)
    back = program_from_bytes(_repack(data, meta=None))
    assert back == program and back.meta == {} and back.provenance == {}


# -- fingerprint ----------------------------------------------------------------------------------


def test_fingerprint_ignores_names_meta_and_provenance(make_program) -> None:  # type: ignore[no-untyped-def]
    a = make_program()
    b = make_program("renamed", x="latents", w="w_qkv")
    assert a != b
    assert len(fingerprint(a)) == 64 and int(fingerprint(a), 16) >= 0
    assert fingerprint(a) == fingerprint(b)
    assert fingerprint(evolve(a, meta={}, provenance={})) == fingerprint(a)


def test_fingerprint_sees_every_structural_change(make_program) -> None:  # type: ignore[no-untyped-def]
    base = make_program()
    fp = fingerprint(base)
    assert fingerprint(make_program(eps=1e-5)) != fp  # an attribute

    def node_changed(index: int, **changes: object) -> Program:
        nodes = list(base.nodes)
        nodes[index] = evolve(nodes[index], **changes)
        return evolve(base, nodes=tuple(nodes))

    assert fingerprint(node_changed(8, op="silu", attrs={})) != fp  # an op
    assert fingerprint(node_changed(10, operands=("%9", "%8"))) != fp  # an edge
    assert fingerprint(evolve(base, outputs=base.outputs[::-1])) != fp  # output order
    bigger = Value("x", TensorType((2, 8, 17), "f32"))
    assert fingerprint(evolve(base, inputs=(bigger,))) != fp  # a shape
    as_bf16 = Value(base.params[1].name, TensorType((16,), "bf16"))
    assert fingerprint(evolve(base, params=(base.params[0], as_bf16))) != fp  # a dtype
    assert fingerprint(evolve(base, params=base.params[::-1])) != fp  # param order


def test_fingerprint_hashes_numbers_by_value() -> None:
    t = TensorType((2,), "f32")

    def with_scale(scale: object) -> Program:
        node = Node(0, "scalar_affine", ("x",), (Value("%0", t),), {"scale": scale, "bias": 0.0})
        return Program("p", (Value("x", t),), (), (node,), ("%0",))

    assert fingerprint(with_scale(1)) == fingerprint(with_scale(1.0))  # equal programs, equal hashes
    assert fingerprint(with_scale(True)) != fingerprint(with_scale(1))
    assert fingerprint(with_scale(1.5)) != fingerprint(with_scale(1.0))


# -- provenance sidecar ---------------------------------------------------------------------------


def test_provenance_sidecar_round_trip(program: Program, tmp_path: Path) -> None:
    path = tmp_path / "model.provenance.json"
    save_provenance(program, path)
    assert load_provenance(path) == program.provenance
    assert load_provenance(path, program=program) == program.provenance
    other = evolve(program, inputs=(Value("x", TensorType((2, 8, 17), "f32")),))
    with pytest.raises(FormatError, match="belongs to another program"):
        load_provenance(path, program=other)


def test_provenance_sidecar_rejects_bad_documents(program: Program) -> None:
    doc = json.loads(provenance_to_bytes(program))
    with pytest.raises(VersionError):
        provenance_from_bytes(json.dumps({**doc, "version": 2}).encode())
    with pytest.raises(FormatError, match="not a dif provenance document"):
        provenance_from_bytes(b"[]")
    with pytest.raises(FormatError, match="node 0 has two provenance entries"):
        provenance_from_bytes(json.dumps({**doc, "nodes": doc["nodes"] + doc["nodes"][:1]}).encode())
    with pytest.raises(FormatError, match="beyond the program"):
        nodes = doc["nodes"] + [[500, {"module": "m"}]]
        provenance_from_bytes(json.dumps({**doc, "nodes": nodes}).encode(), program=program)
    with pytest.raises(FormatError, match="tensors"):
        provenance_from_bytes(json.dumps({**doc, "nodes": [[0, {"tensors": "w"}]]}).encode())
    assert provenance_from_bytes(json.dumps({**doc, "nodes": [[3, {}]]}).encode()) == {3: Provenance()}


# -- loader failures ------------------------------------------------------------------------------


def test_container_level_failures(program: Program, tmp_path: Path) -> None:
    data = program_to_bytes(program)
    with pytest.raises(FormatError, match="bad magic"):
        program_from_bytes(b"\x00" * 8 + data[8:])
    with pytest.raises(VersionError):
        program_from_bytes(data[:8] + (2).to_bytes(4, "little") + data[12:])
    with pytest.raises(ChecksumError):
        program_from_bytes(data[:-3] + bytes([data[-3] ^ 1]) + data[-2:])
    with pytest.raises(FormatError, match="truncated"):
        program_from_bytes(data[:-10], what="cut.difir")
    with pytest.raises(FormatError, match="cannot read"):
        load_program(tmp_path / "missing.difir")


def test_section_failures(program: Program) -> None:
    data = program_to_bytes(program)
    with pytest.raises(FormatError, match="missing \\['fingerprint'\\]"):
        program_from_bytes(_repack(data, fingerprint=None))
    with pytest.raises(FormatError, match="unknown \\['extra'\\]"):
        program_from_bytes(_repack(data, extra=b"x"))
    with pytest.raises(FormatError, match="not UTF-8 JSON"):
        program_from_bytes(_repack(data, program=b"{not json"))
    with pytest.raises(FormatError, match="meta section"):
        program_from_bytes(_repack(data, meta=b"[1]"))
    with pytest.raises(ChecksumError, match="stored fingerprint"):
        program_from_bytes(_repack(data, fingerprint=b"0" * 64))


def test_edited_program_fails_the_fingerprint(program: Program) -> None:
    def eps(doc: dict) -> None:
        doc["nodes"][0][3]["eps"] = 1e-5

    with pytest.raises(ChecksumError, match="differs from the program's"):
        program_from_bytes(_with_doc(program, eps))


@pytest.mark.parametrize(
    ("edit", "error", "fragment"),
    [
        (lambda d: d["inputs"][0].__setitem__(2, [2, 8, 1 << 60]), FormatError, "dims in 0..2^48"),
        (lambda d: d["inputs"][0].__setitem__(2, [1] * 40), FormatError, "shape is not a list of at most"),
        (lambda d: d["inputs"][0].__setitem__(1, "f128"), FormatError, "unknown dtype"),
        (lambda d: d["inputs"][0].__setitem__(1, ["f32"]), FormatError, "unknown dtype"),
        (lambda d: d["inputs"][0].__setitem__(0, "x" * 5000), FormatError, "not a name"),
        (lambda d: d["nodes"][0].__setitem__(3, {"eps": {"a": 1}}), FormatError, "is not a number, string"),
        (lambda d: d["nodes"].__setitem__(0, ["rms_norm"]), FormatError, "node 0 is not [op, operands"),
        (lambda d: d.pop("outputs"), FormatError, "program section is not an object"),
        (lambda d: d["nodes"][0][3].__setitem__("eps", _nested(40)), FormatError, "attribute value"),
        (lambda d: d["nodes"][1].__setitem__(1, ["%5", "blocks.0.attn.qkv.weight"]), VerifyError, "node 1 (linear)"),
    ],
)
def test_program_section_is_validated(program: Program, edit, error: type, fragment: str) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error) as info:
        program_from_bytes(_with_doc(program, edit), what="bad.difir")
    assert fragment in str(info.value)
    assert "bad.difir" in str(info.value)


def test_loading_uses_the_given_table() -> None:
    table = OpTable()
    defop("ident", operands=("x",), infer=lambda x: x, cases=None, table=table)(lambda x: x)
    t = TensorType((3,), "i32")
    program = Program("custom", (Value("x", t),), (), (Node(0, "ident", ("x",), (Value("%0", t),), {}),), ("%0",))
    data = program_to_bytes(program)
    assert program_from_bytes(data, table=table) == program
    with pytest.raises(VerifyError, match="unknown op 'ident'"):
        program_from_bytes(data)
