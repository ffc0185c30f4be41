"""`ProgramBuilder.inline` (one program made of others: a pipeline's stages in one graph) and
`PrefixedWeights`, the weights of such a program: the inlined result computes what running the parts
in turn computes, each part's parameters kept apart by its prefix, provenance kept; a missing or
mistyped input is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from dif.errors import DifError
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.weights.bind import PrefixedWeights


def _layer(name: str) -> Program:
    b = ProgramBuilder(name)
    x = b.input("x", (2, 4), "f32")
    w = b.param("w", (3, 4), "f32")
    with b.scope(module=name, block="proj"):
        b.output(b.emit("silu", b.emit("linear", x, w)))
    return b.build()


def _weights(seed: int) -> dict[str, np.ndarray]:
    return {"w": np.random.default_rng(seed).standard_normal((3, 4)).astype(np.float32)}


def test_inlined_parts_compute_the_parts_in_turn() -> None:
    first, second = _layer("first"), _layer("second")
    b = ProgramBuilder("both")
    x = b.input("x", (2, 4), "f32")
    (h,) = b.inline(first, {"x": x}, params="a.")
    pad = b.emit("pad", h, pads=(0, 0, 0, 1))
    (y,) = b.inline(second, {"x": pad}, params="b.")
    b.output(y)
    both = b.build()
    assert [v.name for v in both.params] == ["a.w", "b.w"]
    assert {p.module for p in both.provenance.values()} >= {"first", "second"}

    x0 = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)
    wa, wb = _weights(1), _weights(2)
    weights = PrefixedWeights({"a.": wa, "b.": wb})
    got = interpret(both, {"x": x0}, dict(weights))[both.outputs[0]]
    mid = interpret(first, {"x": x0}, wa)[first.outputs[0]]
    want = interpret(second, {"x": np.pad(mid, ((0, 0), (0, 1)))}, wb)[second.outputs[0]]
    np.testing.assert_array_equal(got, want)


def test_prefixed_weights_map_names_without_reading() -> None:
    weights = PrefixedWeights({"a.": _weights(1), "b.": _weights(2)})
    assert list(weights) == ["a.w", "b.w"] and len(weights) == 2
    assert "a.w" in weights and "c.w" not in weights and "a.v" not in weights
    np.testing.assert_array_equal(weights["b.w"], _weights(2)["w"])
    with pytest.raises(KeyError):
        weights["w"]


def test_inline_refuses_a_missing_or_mistyped_input() -> None:
    part = _layer("part")
    b = ProgramBuilder("outer")
    with pytest.raises(DifError, match="no value for its input.* x"):
        b.inline(part, {})
    wrong = b.input("x", (2, 5), "f32")
    with pytest.raises(DifError, match="input 'x' is"):
        b.inline(part, {"x": wrong})
