"""Structural fingerprint of a DiffIR program: what plans, caches and `.difir` files are keyed by.

The hash covers ops, attributes, result types, topology (operands as positions: input k, param k,
result j of node i), the types and order of inputs and params, and the outputs. It excludes every
name (program, values, params), provenance and meta, so renaming changes nothing while any change
to an op, attribute, shape, dtype or edge changes the hash. Numbers hash by value, like `==`
(an int 1 and a float 1.0 in an attribute are the same attribute).
"""

from __future__ import annotations

import hashlib
import json
import math
from typing import Any

from dif.errors import VerifyError
from dif.ir.program import Program
from dif.ir.types import TensorType

ALGORITHM = "dif.fingerprint/1"


def _canon(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_canon(v) for v in value]
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    return value


def _type(t: TensorType) -> list[Any]:
    return [t.dtype.value, list(t.shape)]


def structure(program: Program) -> list[Any]:
    """The name-free document the fingerprint hashes (exposed for debugging differing hashes)."""
    refs: dict[str, list[Any]] = {}
    for k, v in enumerate(program.inputs):
        refs[v.name] = ["i", k]
    for k, v in enumerate(program.params):
        refs[v.name] = ["p", k]

    def ref(name: str, where: str) -> list[Any]:
        if name not in refs:
            raise VerifyError(f"program '{program.name}': {where} refers to undefined value '{name}'")
        return refs[name]

    nodes = []
    for i, node in enumerate(program.nodes):
        operands = [ref(o, f"node {node.id} ({node.op})") for o in node.operands]
        attrs = [[k, _canon(node.attrs[k])] for k in sorted(node.attrs)]
        nodes.append([node.op, operands, [_type(r.type) for r in node.results], attrs])
        for j, r in enumerate(node.results):
            refs[r.name] = ["n", i, j]
    return [
        ALGORITHM,
        [_type(v.type) for v in program.inputs],
        [_type(v.type) for v in program.params],
        nodes,
        [ref(o, "an output") for o in program.outputs],
    ]


def fingerprint(program: Program) -> str:
    """Hex sha256 (64 chars) of `structure(program)` in canonical JSON."""
    doc = json.dumps(structure(program), separators=(",", ":"), ensure_ascii=True, allow_nan=True)
    return hashlib.sha256(doc.encode()).hexdigest()
