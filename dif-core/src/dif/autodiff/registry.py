"""The op table's VJP column: op name -> the rule that emits the op's vector-Jacobian product as DiffIR.

A rule is given the forward node's operands and results (as values of the program being built), the
cotangent of each result (None where nothing downstream depends on it) and which operands want a
gradient; it emits backward nodes with the same `ProgramBuilder` and returns one gradient per operand
(None for operands that want none or have none, e.g. integer indices). Because the backward is made of
ordinary ops, every backend that runs the forward opset runs it too. Plugins adding ops add their rules
with `register_vjp`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import frozen

from dif.errors import DifError
from dif.ir.builder import ProgramBuilder, Var


class NoVjpError(DifError):
    """An op (or one operand of it) has no VJP rule, so a program cannot be differentiated through it."""


@frozen
class VjpArgs:
    """What a rule sees of one forward node. `operands[i]` is None for an omitted optional operand."""

    b: ProgramBuilder
    op: str
    operands: tuple[Var | None, ...]
    results: tuple[Var, ...]
    cotangents: tuple[Var | None, ...]
    attrs: Mapping[str, Any]
    wants: tuple[bool, ...]

    @property
    def x(self) -> Var:
        """The first operand (unary ops)."""
        v = self.operands[0]
        assert v is not None
        return v

    @property
    def y(self) -> Var:
        return self.results[0]

    @property
    def g(self) -> Var:
        """The cotangent of the single result (the transform only calls a rule when one exists)."""
        v = self.cotangents[0]
        assert v is not None
        return v

    def refuse(self, index: int, why: str) -> NoVjpError:
        return NoVjpError(f"op '{self.op}': no gradient for operand {index}: {why}")


def _bare(exc: Exception) -> str:
    """An error's message without the hint lines `DifError` appends (so re-raising keeps one hint)."""
    return str(exc).split("\n  hint:")[0]


VjpRule = Callable[[VjpArgs], Sequence[Var | None]]

_RULES: dict[str, VjpRule] = {}
NON_DIFFERENTIABLE: set[str] = set()
"""Ops whose results carry no gradient (comparisons, `full`): differentiating through them gives zero."""


_CONSTANTS: dict[str, frozenset[int]] = {}


def register_vjp(op: str, rule: VjpRule, *, constants: Sequence[int] = ()) -> None:
    """`constants`: operand positions that never get a gradient by design (rope's tables); asking
    for one is a `NoVjpError`."""
    if op in _RULES and _RULES[op] is not rule:
        raise DifError(f"op '{op}' already has a VJP rule")
    _RULES[op] = rule
    _CONSTANTS[op] = frozenset(constants)


def vjp(op: str, *, constants: Sequence[int] = ()) -> Callable[[VjpRule], VjpRule]:
    """Decorator form of `register_vjp`."""

    def wrap(rule: VjpRule) -> VjpRule:
        register_vjp(op, rule, constants=constants)
        return rule

    return wrap


def non_differentiable(*ops: str) -> None:
    NON_DIFFERENTIABLE.update(ops)


def has_vjp(op: str) -> bool:
    _load_rules()
    return op in _RULES or op in NON_DIFFERENTIABLE


def vjp_rule(op: str) -> VjpRule:
    """The VJP rule of `op`; `NoVjpError` naming the op when it has none."""
    _load_rules()
    try:
        return _RULES[op]
    except KeyError:
        raise NoVjpError(
            f"op '{op}' has no VJP rule, so autodiff cannot pass through it",
            hint="register one with dif.autodiff.register_vjp, or mark the values it feeds as not differentiable",
        ) from None


def constant_operands(op: str) -> frozenset[int]:
    """Operand positions of `op` that take no gradient (empty for ops without a rule)."""
    _load_rules()
    return _CONSTANTS.get(op, frozenset())


def ops_with_vjp() -> list[str]:
    _load_rules()
    return sorted(_RULES)


def _load_rules() -> None:
    from dif.autodiff import rules  # noqa: F401  (registration)
