"""Checks every backend makes on what it is handed, so all of them fail alike and name the backend.

Where it sits: inside a backend's `prepare` (the plan belongs to the program; weights are host
arrays of the declared types) and `run` (inputs likewise), before anything touches a device; and in
`dif.runtime`'s selection (`coverage`: the ops and dtypes a program needs that a backend lacks).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
from attrs import frozen

from dif.dtypes import dtype_of
from dif.errors import DifError, PlanBindingError, WeightError
from dif.ir.program import Program
from dif.ir.types import TensorType
from dif.plan.plan import Plan, check_plan
from dif.plan.views import check_view_capabilities


def describe_array(arr: Any) -> str:
    """`bf16[2, 3]` for an array, its numpy dtype name if dif has no such dtype, else the type name."""
    shape, dtype = getattr(arr, "shape", None), getattr(arr, "dtype", None)
    if shape is None or dtype is None:
        return type(arr).__name__
    try:
        name = dtype_of(arr).value
    except DifError:
        name = str(dtype)
    return f"{name}{list(shape)}"


def matches_type(arr: Any, t: TensorType) -> bool:
    """Whether `arr` is an array of exactly `t`'s shape and dtype."""
    try:
        return tuple(arr.shape) == t.shape and dtype_of(arr) == t.dtype
    except (DifError, AttributeError, TypeError):
        return False


def check_plan_binding(program: Program, plan: Plan, backend: str) -> None:
    """`PlanBindingError` unless `plan` was made for `program` (structural fingerprint), then
    `dif.plan.plan.check_plan` (every value placed, lifetimes consistent) and only views its target
    declares."""
    from dif.fingerprint import fingerprint

    got = fingerprint(program)
    if got != plan.program_fingerprint:
        raise PlanBindingError(
            f"backend '{backend}': plan was made for program {plan.program_fingerprint}, not '{program.name}' ({got})",
            hint="re-plan this program",
        )
    check_plan(plan, program)
    check_view_capabilities(plan, program, plan.binding.target_profile.capabilities)


def check_weights(program: Program, weights: Mapping[str, Any], backend: str) -> dict[str, np.ndarray]:
    """Every parameter by name as an array, checked for shape and dtype (extra tensors are ignored);
    `WeightError` naming the backend and the parameter otherwise."""
    bound: dict[str, np.ndarray] = {}
    for p in program.params:
        if p.name not in weights:
            raise WeightError(
                f"backend '{backend}': parameter '{p.name}' ({p.type}) is missing from the weights",
                hint="check the frontend's weight-name mapping for this checkpoint",
            )
        arr = weights[p.name]
        if not matches_type(arr, p.type):
            raise WeightError(f"backend '{backend}': parameter '{p.name}' expected {p.type}, got {describe_array(arr)}")
        bound[p.name] = np.asarray(arr)
    return bound


def check_inputs(program: Program, inputs: Mapping[str, Any], backend: str) -> dict[str, np.ndarray]:
    """Every program input by name as an array, checked for shape and dtype; `DifError` otherwise."""
    checked: dict[str, np.ndarray] = {}
    for v in program.inputs:
        if v.name not in inputs:
            raise DifError(f"backend '{backend}': input '{v.name}' ({v.type}) was not provided")
        arr = inputs[v.name]
        if not matches_type(arr, v.type):
            raise DifError(f"backend '{backend}': input '{v.name}' expected {v.type}, got {describe_array(arr)}")
        checked[v.name] = np.asarray(arr)
    return checked


# -- coverage: does a backend declare everything a program uses? ------------------------------


@frozen
class Coverage:
    """What `program` uses that `backend` does not declare (sorted names; both empty: it can run it)."""

    backend: str
    missing_ops: tuple[str, ...] = ()
    missing_dtypes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.missing_ops and not self.missing_dtypes

    def describe(self) -> str:
        """`cuda lacks op conv3d and dtype f8e4m3`, or `cpu has every op and dtype`."""
        if self.ok:
            return f"{self.backend} has every op and dtype"
        parts = [
            f"{kind}{'s' if len(names) > 1 else ''} {', '.join(names)}"
            for kind, names in (("op", self.missing_ops), ("dtype", self.missing_dtypes))
            if names
        ]
        return f"{self.backend} lacks {' and '.join(parts)}"


def program_ops(program: Program) -> frozenset[str]:
    """Every op name a node of `program` uses."""
    return frozenset(node.op for node in program.nodes)


def program_dtypes(program: Program) -> frozenset[str]:
    """Every element type of `program`'s inputs, parameters and node results."""
    values = [*program.inputs, *program.params, *(v for node in program.nodes for v in node.results)]
    return frozenset(v.type.dtype.value for v in values)


def coverage(
    program: Program, backend: str, ops: frozenset[str] | None, dtypes: Iterable[str] | None = None
) -> Coverage:
    """The ops of `program` outside `ops` (None: the backend runs every op) and its dtypes outside
    `dtypes` (None or empty: the backend declares none, so none are checked)."""
    missing_ops = () if ops is None else tuple(sorted(program_ops(program) - ops))
    declared = frozenset(dtypes or ())
    missing_dtypes = tuple(sorted(program_dtypes(program) - declared)) if declared else ()
    return Coverage(backend, missing_ops, missing_dtypes)
