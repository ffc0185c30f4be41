"""Checks for program rewrites (optimizer passes): a rewritten program computes exactly what the original does."""

from __future__ import annotations

import numpy as np

from dif.interp import interpret
from dif.ir.program import Program


def random_bindings(program: Program, seed: int = 0) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(inputs, weights) of `program`: standard normal draws in each value's dtype."""
    rng = np.random.default_rng(seed)
    make = lambda v: rng.standard_normal(v.type.shape).astype(v.type.dtype.np)  # noqa: E731
    return {v.name: make(v) for v in program.inputs}, {v.name: make(v) for v in program.params}


def assert_bit_identical(before: Program, after: Program, seed: int = 0) -> None:
    """`after` gives every output of `before`, byte for byte, under the reference interpreter on random inputs and
    weights: a fusion whose reference rounds each intermediate where the unfused program stored it must."""
    inputs, weights = random_bindings(before, seed)
    want, got = interpret(before, inputs, weights), interpret(after, inputs, weights)
    assert list(want) == list(got)
    for name in want:
        assert got[name].dtype == want[name].dtype, name
        np.testing.assert_array_equal(got[name].view(np.uint8), want[name].view(np.uint8), err_msg=name)
