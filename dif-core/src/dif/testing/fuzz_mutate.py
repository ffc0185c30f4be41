"""Fuzzing, step 1: a seeded mutator turning valid reader inputs into hostile ones.

Where it sits: `dif.testing.fuzz_run` asks it for one input per case. Byte-level edits (bit flips,
truncation, insertion, deletion, overwrites with boundary values, splices from other seeds, random
tails) apply to every format; JSON documents also get structural edits (dropped / duplicated /
renamed keys, values of another type, huge / negative / non-finite numbers, deep nesting, odd
unicode). A case is a pure function of its `random.Random`, so any failure replays from its index.
"""

from __future__ import annotations

import copy
import json
import random
from collections.abc import Sequence
from typing import Any, Literal

Kind = Literal["binary", "json", "text"]

# Byte patterns that sit on the edges of length and offset checks (u64 max, i64 max, zero, -1 as text ...).
BOUNDARY_CHUNKS = (
    b"\xff" * 8,
    b"\x00" * 8,
    b"\xff\xff\xff\xff\xff\xff\xff\x7f",
    b"\x00\x00\x00\x00\x00\x00\x00\x80",
    b"[[[[",
    b"{{{{",
    b'"',
    b"-1",
    b"1e999",
    b"NaN",
    b"\\ud800",
    b"\xc3\x28",
    b"\xed\xa0\x80",
)

# Values a JSON field may be swapped for: every JSON type, numbers at every edge, strings that break encoders.
ODD_VALUES: tuple[Any, ...] = (
    None,
    True,
    False,
    0,
    -1,
    1,
    2**31,
    2**63,
    2**64 + 1,
    -(2**63) - 1,
    10**40,
    -(10**40),
    1.5,
    -0.0,
    1e308,
    float("nan"),
    float("inf"),
    float("-inf"),
    "",
    "x" * 5000,
    "\ud800",
    "\x00",
    "\u202e\u0627\u0644",
    "\U0001f600",
    "../../../etc/passwd",
    "/abs/path",
    "{",
    "{{}}",
    "%s%n",
    [],
    [None],
    [1, 2, 3],
    ["a", 1.5, None],
    {},
    {"": None},
    {"a": {"b": []}},
)


class _Raw:
    """JSON text emitted verbatim (deep nesting that would overflow a recursive encoder)."""

    def __init__(self, text: str) -> None:
        self.text = text


class _Pairs:
    """A JSON object as a list of pairs, so a key can appear twice."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def encode_json(value: Any) -> str:
    """`value` as JSON text; `_Raw` and `_Pairs` written as they are, NaN/Infinity as Python writes them."""
    if isinstance(value, _Raw):
        return value.text
    if isinstance(value, _Pairs):
        return "{" + ",".join(f"{json.dumps(k)}:{encode_json(v)}" for k, v in value.pairs) + "}"
    if isinstance(value, dict):
        return encode_json(_Pairs(list(value.items())))
    if isinstance(value, list):
        return "[" + ",".join(encode_json(v) for v in value) + "]"
    return json.dumps(value)  # ensure_ascii: a lone surrogate becomes an escape, decoded back to one


def _odd(rng: random.Random) -> Any:
    """One of ODD_VALUES, copied: edits write into the value, and a shared one would leak into later cases."""
    return copy.deepcopy(rng.choice(ODD_VALUES))


def _paths(doc: Any, prefix: tuple[Any, ...] = (), depth: int = 0) -> list[tuple[Any, ...]]:
    out = [prefix]
    if depth > 64:
        return out
    if isinstance(doc, dict):
        for k, v in doc.items():
            out += _paths(v, (*prefix, k), depth + 1)
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            out += _paths(v, (*prefix, i), depth + 1)
    return out


def _get(doc: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        doc = doc[key]
    return doc


class Mutator:
    """Mutations of `seeds` (valid inputs of one reader), drawn from `rng`."""

    def __init__(self, seeds: Sequence[bytes], kind: Kind) -> None:
        self.seeds = list(seeds)
        self.kind = kind
        self._docs: list[Any] = []
        if kind == "json":
            for seed in self.seeds:
                try:
                    self._docs.append(json.loads(seed))
                except ValueError:
                    self._docs.append(None)

    def case(self, rng: random.Random) -> bytes:
        """One input: random bytes (5%), a JSON-structural edit (JSON targets, 60%), else byte edits."""
        roll = rng.random()
        if roll < 0.05:
            return rng.randbytes(rng.randrange(0, 600))
        index = rng.randrange(len(self.seeds))
        if self.kind == "json" and roll < 0.65 and self._docs[index] is not None:
            data = self._json_case(rng, self._docs[index])
            return self._byte_edits(rng, data, 1) if rng.random() < 0.15 else data
        return self._byte_edits(rng, self.seeds[index], rng.randint(1, 4))

    # -- bytes ---------------------------------------------------------------------------------
    def _byte_edits(self, rng: random.Random, seed: bytes, count: int) -> bytes:
        data = bytearray(seed)
        for _ in range(count):
            op = rng.randrange(9)
            pos = rng.randrange(len(data) + 1)
            if op <= 1 and data:  # bit flip, the commonest corruption
                pos = min(pos, len(data) - 1)
                data[pos] ^= 1 << rng.randrange(8)
            elif op == 2:
                del data[pos:]
            elif op == 3:
                data[pos:pos] = rng.randbytes(rng.randint(1, 16))
            elif op == 4:
                del data[pos : pos + rng.randint(1, 64)]
            elif op == 5:
                chunk = rng.choice(BOUNDARY_CHUNKS)
                data[pos : pos + len(chunk)] = chunk
            elif op == 6:  # splice: a piece of some seed (maybe this one) at another place
                other = rng.choice(self.seeds)
                if other:
                    start = rng.randrange(len(other))
                    data[pos:pos] = other[start : start + rng.randint(1, 256)]
            elif op == 7 and data:  # duplicate a chunk in place
                end = min(len(data), pos + rng.randint(1, 64))
                data[pos:pos] = data[pos:end]
            else:
                data[pos:] = rng.randbytes(rng.randrange(0, 64))
        return bytes(data)

    # -- JSON ----------------------------------------------------------------------------------
    def _json_case(self, rng: random.Random, doc: Any) -> bytes:
        doc = json.loads(json.dumps(doc))  # a private copy to edit
        for _ in range(rng.randint(1, 3)):
            doc = self._json_edit(rng, doc)
        return encode_json(doc).encode("utf-8", "surrogatepass")

    def _json_edit(self, rng: random.Random, doc: Any) -> Any:
        paths = _paths(doc)
        path = rng.choice(paths)
        target = _get(doc, path)
        op = rng.randrange(8)
        if op == 0:
            value: Any = _odd(rng)
        elif op == 1:
            value = _Raw("[" * (depth := rng.choice((50, 1000, 100_000))) + "0" + "]" * depth)
        elif op == 2:
            value = self._other_type(rng, target)
        elif op == 3:  # a number at or past its edge, or of the other kind
            value = rng.choice((0, -1, -(2**70), 2**70, 1e300, -1e-300, float("nan"), 1 << 100))
            if isinstance(target, int | float) and not isinstance(target, bool) and rng.random() < 0.5:
                value = rng.choice((-target, target * 10**6, target + 1, target - 1, float(target) + 0.5))
        elif op == 4:
            value = copy.deepcopy(_get(doc, rng.choice(paths)))  # another field's value (a copy: no cycles)
        elif isinstance(target, dict) and target:
            key = rng.choice(list(target))
            pairs = list(target.items())
            if op == 5:
                pairs = [(k, v) for k, v in pairs if k != key]  # drop a key
            elif op == 6:
                pairs.append((key, _odd(rng)))  # a duplicate key, the later value different
            else:
                pairs = [(rng.choice(("", key + "_", key.upper(), "\ud800", "__metadata__")) if k == key else k, v)
                         for k, v in pairs]  # fmt: skip
            value = _Pairs(pairs)
        elif isinstance(target, list) and target:
            if op == 5:
                del target[rng.randrange(len(target))]
                value = target
            else:
                value = target + target if op == 6 else list(reversed(target))
        else:
            value = _odd(rng)
        if not path:
            return value
        _get(doc, path[:-1])[path[-1]] = value
        return doc

    @staticmethod
    def _other_type(rng: random.Random, value: Any) -> Any:
        """`value` turned into another JSON type (a number as a string, a list as an object ...)."""
        if isinstance(value, str):
            return rng.choice((len(value), [value], {value: value}, None))
        if isinstance(value, bool):
            return rng.choice((int(value), str(value).lower(), None))
        if isinstance(value, int | float):
            return rng.choice((str(value), [value], bool(value), float(value)))
        if isinstance(value, list):
            return rng.choice(({str(i): v for i, v in enumerate(value)}, len(value), ""))
        if isinstance(value, dict):
            return rng.choice((list(value.values()), list(value), "", 0))
        return rng.choice(("null", 0, [], {}))
