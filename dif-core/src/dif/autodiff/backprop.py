"""Reverse accumulation over a list of forward steps: the core both the program transform
(`dif.autodiff.transform`) and composite rules (`dif.autodiff.composite`) run.

Values are named by keys (the forward program's value names); `env` maps a key to the builder value
that holds it, and `views` may swap in recomputed values for a step (activation checkpointing).
Cotangents are accumulated per key in the key's own dtype.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import frozen

from dif.autodiff.registry import NON_DIFFERENTIABLE, NoVjpError, VjpArgs, _bare, vjp_rule
from dif.ir.builder import ProgramBuilder, Var


@frozen
class Step:
    """One forward node by keys: `operands[i]` is None for an omitted optional operand."""

    op: str
    operands: tuple[str | None, ...]
    results: tuple[str, ...]
    attrs: Mapping[str, Any]
    where: str = ""


def active_keys(steps: Sequence[Step], sources: set[str], is_float: Callable[[str], bool]) -> set[str]:
    """Keys that depend on `sources` through differentiable ops (float values only)."""
    active = {s for s in sources if is_float(s)}
    for st in steps:
        if st.op in NON_DIFFERENTIABLE:
            continue
        if any(o is not None and o in active for o in st.operands):
            active.update(r for r in st.results if is_float(r))
    return active


def backprop(
    b: ProgramBuilder,
    steps: Sequence[Step],
    env: Mapping[str, Var],
    seeds: Mapping[str, Var],
    active: set[str],
    *,
    views: Callable[[int], Mapping[str, Var]] | None = None,
    on_emit: Callable[[int, int], None] | None = None,
) -> dict[str, Var]:
    """Cotangents of every active key reached from `seeds` (key -> cotangent value).

    `views(i)`: values to use instead of `env` for step i's operands and results (recomputed
    ones); called once per differentiated step, in reverse order. `on_emit(i, first_node_id)`:
    told which builder nodes a step's backward emitted from (for provenance)."""
    ct: dict[str, Var] = dict(seeds)
    for i in range(len(steps) - 1, -1, -1):
        st = steps[i]
        if not any(r in ct for r in st.results) or st.op in NON_DIFFERENTIABLE:
            continue
        wants = tuple(o is not None and o in active for o in st.operands)
        if not any(wants):
            continue
        view = views(i) if views is not None else {}

        def value(key: str | None, view: Mapping[str, Var] = view) -> Var | None:
            return None if key is None else view.get(key, env[key])

        start = len(b._nodes)  # noqa: SLF001  (the builder's node count: where this step's backward begins)
        try:
            rule = vjp_rule(st.op)
            grads = rule(
                VjpArgs(
                    b, st.op, tuple(value(o) for o in st.operands), tuple(value(r) for r in st.results),  # type: ignore[misc]
                    tuple(ct.get(r) for r in st.results), st.attrs, wants,
                )
            )  # fmt: skip
        except NoVjpError as exc:
            raise NoVjpError(f"{_bare(exc)} (differentiating {st.where or st.op})", hint=exc.hint) from None
        if on_emit is not None:
            on_emit(i, start)
        for key, want, grad in zip(st.operands, wants, grads, strict=False):
            if key is None or not want or grad is None:
                continue
            target = env[key]
            if grad.dtype != target.dtype:
                grad = b.emit("cast", grad, dtype=target.dtype.value)
            if grad.shape != target.shape:
                raise NoVjpError(f"op '{st.op}': VJP gave {grad.type} for operand {key} of type {target.type}")
            ct[key] = b.emit("add", ct[key], grad) if key in ct else grad
    return ct
