"""Checks every backend makes on what it is handed, so all of them fail alike and name the backend.

Where it sits: inside a backend's `prepare` (the plan belongs to the program; weights are host
arrays of the declared types) and `run` (inputs likewise), before anything touches a device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

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
