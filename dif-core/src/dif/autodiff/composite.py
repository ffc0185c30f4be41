"""VJPs by decomposition: emit the chain of core ops an op stands for and backpropagate through it."""

from __future__ import annotations

from collections.abc import Callable

from dif.autodiff.backprop import Step, active_keys, backprop
from dif.autodiff.registry import VjpArgs
from dif.ir.builder import Var


def vjp_of_chain(a: VjpArgs, chain: Callable[..., Var]) -> list[Var | None]:
    """`chain(b, *operands, **attrs)` must emit the op's meaning from core ops and return its result."""
    b = a.b
    start = len(b._nodes)  # noqa: SLF001
    operands = [v for v in a.operands if v is not None]
    out = chain(b, *operands, **dict(a.attrs))
    steps = [
        Step(n.op, tuple(n.operands), tuple(r.name for r in n.results), n.attrs)
        for n in b._nodes[start:]  # noqa: SLF001
    ]
    env = {v.name: v for v in operands}
    for n in b._nodes[start:]:  # noqa: SLF001
        env.update((r.name, Var(b, r.name, r.type)) for r in n.results)
    sources = {v.name for v, want in zip(operands, a.wants, strict=False) if want}
    active = active_keys(steps, sources, lambda k: env[k].dtype.is_float)
    ct = backprop(b, steps, env, {out.name: a.g}, active)
    return [ct.get(v.name) if want else None for v, want in zip(operands, a.wants, strict=False)]
