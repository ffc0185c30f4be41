"""The reference interpreter: runs a program node by node with the op table's numpy references.

This is the executable meaning of DiffIR. Backends (including the CPU one, which follows a plan
and an arena) are checked against it. Results are cast to each node's declared type, so bf16
programs round exactly where a bf16 kernel would store.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from dif.errors import DifError
from dif.ir.program import Node, Program
from dif.ops.registry import OPS, OpTable


def bind_check(program: Program, inputs: Mapping[str, np.ndarray], weights: Mapping[str, np.ndarray]) -> None:
    """Raise `DifError` naming the first missing or mis-typed input/weight."""
    from dif.backend_checks import describe_array, matches_type

    for kind, values, given in (("input", program.inputs, inputs), ("parameter", program.params, weights)):
        for v in values:
            if v.name not in given:
                raise DifError(f"{kind} '{v.name}' ({v.type}) was not provided")
            if not matches_type(given[v.name], v.type):
                raise DifError(f"{kind} '{v.name}': expected {v.type}, got {describe_array(given[v.name])}")


def evaluate_node(node: Node, operands: Sequence[np.ndarray], table: OpTable = OPS) -> list[np.ndarray]:
    """`node` computed by its op's numpy reference, stored as `cast_results` says. Executors that
    run a node on the host share this with `interpret`."""
    return cast_results(node, table.get(node.op).run_reference(operands, node.attrs))


def cast_results(node: Node, outs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """A reference's results (compute precision) each cast to and shaped as `node`'s declared
    result type, so bf16 programs round where a bf16 kernel would store."""
    if len(outs) != len(node.results):
        raise DifError(f"node {node.id} ({node.op}) produced {len(outs)} results, expected {len(node.results)}")
    return [
        np.asarray(arr).astype(value.type.dtype.np, copy=False).reshape(value.type.shape)
        for value, arr in zip(node.results, outs, strict=True)
    ]


def interpret(
    program: Program,
    inputs: Mapping[str, np.ndarray],
    weights: Mapping[str, np.ndarray],
    *,
    table: OpTable = OPS,
) -> dict[str, np.ndarray]:
    bind_check(program, inputs, weights)
    env: dict[str, np.ndarray] = {**{v.name: np.asarray(inputs[v.name]) for v in program.inputs}}
    env.update({v.name: np.asarray(weights[v.name]) for v in program.params})
    last_use = {name: users[-1].id for name, users in program.users.items()}
    keep = set(program.outputs)
    for node in program.nodes:
        outs = evaluate_node(node, [env[o] for o in node.operands], table)
        env.update((value.name, arr) for value, arr in zip(node.results, outs, strict=True))
        for name in node.operands:  # free intermediates early: VAE activations are large
            if last_use.get(name) == node.id and name not in keep and name in env and name.startswith("%"):
                del env[name]
    return {name: env[name] for name in program.outputs}
