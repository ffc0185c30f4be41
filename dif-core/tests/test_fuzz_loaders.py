"""Fuzz every loader of bytes from outside with hypothesis: whatever the input, only `DifError` may come out.

Each target is (name, loader, valid_bytes_factory), taken from `dif.testing.fuzz_targets.core_targets`
(to fuzz a new format, add it there). Inputs are valid files mutated (bit flips, truncation, insertion,
splices; JSON documents also get structural edits) and plain random bytes.
"""

from __future__ import annotations

import contextlib
import functools
import json
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dif.errors import DifError
from dif.testing.fuzz_run import FuzzTarget
from dif.testing.fuzz_targets import core_targets


# The one registry (dif.testing.fuzz_targets): perf/fuzz.py and test_fuzz_targets.py run the same readers
# with dif's own mutator; here hypothesis drives them (its shrinking gives the smallest failing input).
def _first_seed(target: FuzzTarget) -> bytes:
    return target.seeds()[0]


TARGETS: list[tuple[str, Callable[[bytes], Any], Callable[[], bytes]]] = [
    (t.name, t.load, functools.partial(_first_seed, t)) for t in core_targets()
]

FUZZ = settings(max_examples=100, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])

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
