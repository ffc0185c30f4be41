"""Fuzz every loader of bytes from outside: whatever the input, only `DifError` may come out.

Each target is (name, loader, valid_bytes_factory). A loader takes bytes (file-based loaders write
them to a temp file first). Inputs are valid files mutated (bit flips, truncation, insertion,
splices; JSON documents also get structural edits) and plain random bytes. To fuzz a new format,
add one line to TARGETS.
"""

from __future__ import annotations

import contextlib
import functools
import json
import struct
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dif.errors import DifError
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.serialize import container
from dif.serialize.difir import MAGIC, VERSION, program_from_bytes, program_to_bytes
from dif.serialize.diftensor import load_tensors, save_tensors
from dif.serialize.provenance import provenance_from_bytes, provenance_to_bytes
from dif.serialize.text import parse_program, print_program
from dif.testing.fuzz import fuzz_cases

_TMP = tempfile.TemporaryDirectory(prefix="dif-fuzz-")


@functools.cache
def _program() -> Program:
    b = ProgramBuilder("fuzz")
    x = b.input("x", (2, 6), "f32")
    w = b.param("w", (6, 6), "bf16")
    with b.scope(module="m", block="b0", tensors=["w.weight"]):
        h = b.emit("linear", b.emit("cast", x, dtype="bf16"), w)
        a, c = b.emit_multi("split", h, axis=-1, sizes=[2, 4])
        y = b.emit("concat", b.emit("gelu", a, approximate="tanh"), c, axis=1)
    b.output(b.emit("rms_norm", y, eps=1e-5), a)
    b.meta["k"] = "v"
    return b.build()


def _via_file(data: bytes, load: Callable[[Path], Any]) -> Any:
    path = Path(_TMP.name) / "input.bin"
    path.unlink(missing_ok=True)  # a new inode: never truncate a file an earlier example may still have mapped
    path.write_bytes(data)
    return load(path)


def _load_tensors(data: bytes) -> None:
    tensors, _ = _via_file(data, load_tensors)
    for arr in tensors.values():
        arr.tobytes()  # touch every byte of every mapped view


@functools.cache
def _valid_diftensor() -> bytes:
    import ml_dtypes

    tensors = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3),
        "b": np.ones(4, ml_dtypes.bfloat16),
        "c": np.zeros(0, np.int8),
    }
    path = Path(_TMP.name) / "valid.diftensor"
    save_tensors(path, tensors, {"note": "fuzz"})
    return path.read_bytes()


def _header_and_data() -> tuple[bytes, bytes]:
    raw = _valid_diftensor()
    (n,) = struct.unpack("<Q", raw[:8])
    return raw[8 : 8 + n], raw[8 + n :]


def _load_safetensors_header(header: bytes) -> None:
    _load_tensors(struct.pack("<Q", len(header)) + header + _header_and_data()[1])


def _load_program_section(section: bytes) -> None:
    sections = container.unpack(program_to_bytes(_program()), MAGIC, (VERSION,), "fuzz")[1]
    program_from_bytes(container.pack(MAGIC, VERSION, {**sections, "program": section}))


TARGETS: list[tuple[str, Callable[[bytes], Any], Callable[[], bytes]]] = [
    (
        "container",
        lambda b: container.unpack(b, b"FUZZMAGC", (1,), "fuzz"),
        lambda: container.pack(b"FUZZMAGC", 1, {"a": b"alpha", "": b"", "c": bytes(range(40))}),
    ),
    ("difir", program_from_bytes, lambda: program_to_bytes(_program())),
    (
        "difir-program-section",
        _load_program_section,
        lambda: container.unpack(program_to_bytes(_program()), MAGIC, (VERSION,), "fuzz")[1]["program"],
    ),
    ("diftensor", _load_tensors, _valid_diftensor),
    ("safetensors-header", _load_safetensors_header, lambda: _header_and_data()[0]),
    ("provenance", provenance_from_bytes, lambda: provenance_to_bytes(_program())),
    ("text", lambda b: parse_program(b.decode("utf-8", "replace")), lambda: print_program(_program()).encode()),
    *fuzz_cases(),
]

FUZZ = settings(max_examples=200, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3),
    max_leaves=6,
)


def _paths(doc: Any, prefix: tuple = ()) -> list[tuple]:
    out = [prefix]
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i))
    return out


def _json_edit(draw: st.DrawFn, valid: bytes) -> bytes | None:
    """Replace one sub-value of a JSON document with a random JSON value (None if not JSON)."""
    try:
        doc = json.loads(valid)
    except ValueError:
        return None
    path = draw(st.sampled_from(_paths(doc)))
    value = draw(json_values)
    if not path:
        return json.dumps(value).encode()
    parent = doc
    for key in path[:-1]:
        parent = parent[key]
    if draw(st.booleans()) and isinstance(parent, dict):
        parent.pop(path[-1])
    else:
        parent[path[-1]] = value
    return json.dumps(doc).encode()


@st.composite
def mutated(draw: st.DrawFn, valid: bytes) -> bytes:
    if draw(st.booleans()):
        edited = _json_edit(draw, valid)
        if edited is not None:
            return edited
    data = bytearray(valid)
    for _ in range(draw(st.integers(1, 3))):
        kind = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "overwrite", "tail"]))
        pos = draw(st.integers(0, max(len(data) - 1, 0)))
        if kind == "flip" and data:
            data[pos] ^= 1 << draw(st.integers(0, 7))
        elif kind == "truncate":
            del data[pos:]
        elif kind == "insert":
            data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
        elif kind == "delete":
            del data[pos : pos + draw(st.integers(1, 16))]
        elif kind == "overwrite":
            chunk = draw(
                st.sampled_from([b"\xff" * 8, b"\x00" * 8, b"\x7f\xff\xff\xff\xff\xff\xff\xff", b"[[[[", b'"', b"-1"])
            )
            data[pos : pos + len(chunk)] = chunk
        else:
            data[pos:] = draw(st.binary(max_size=64))
    return bytes(data)


def _only_dif_errors(load: Callable[[bytes], Any], data: bytes) -> None:
    with contextlib.suppress(DifError):  # the only acceptable failure; anything else fails the test
        load(data)


@pytest.mark.parametrize(("name", "load", "valid"), TARGETS, ids=[t[0] for t in TARGETS])
def test_valid_input_loads(name: str, load: Callable[[bytes], Any], valid: Callable[[], bytes]) -> None:
    load(valid())  # the seed must be valid, or the mutations below test nothing


@pytest.mark.parametrize(("name", "load", "valid"), TARGETS, ids=[t[0] for t in TARGETS])
@FUZZ
@given(data=st.data())
def test_mutated_input_raises_only_dif_errors(
    name: str, load: Callable[[bytes], Any], valid: Callable[[], bytes], data: st.DataObject
) -> None:
    _only_dif_errors(load, data.draw(mutated(valid())))


@pytest.mark.parametrize(("name", "load", "valid"), TARGETS, ids=[t[0] for t in TARGETS])
@FUZZ
@given(blob=st.binary(max_size=512))
def test_random_bytes_raise_only_dif_errors(
    name: str, load: Callable[[bytes], Any], valid: Callable[[], bytes], blob: bytes
) -> None:
    _only_dif_errors(load, blob)
