"""Reverse-mode autodiff as a DiffIR transform: forward program -> one program computing the loss
(or the forward outputs) and the gradients of the chosen inputs / parameters.

The result is an ordinary verified program (forward nodes, then each node's VJP in reverse order),
planned by the same planner. Only values that depend on a differentiable input get cotangents, so
frozen parameters cost no gradient buffers. With `checkpoint`, the forward nodes of each matching
provenance block are emitted a second time just before that block's backward, so its activations
need not live from the forward to the backward; each recompute is a recorded `Decision`.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from attrs import evolve, field, frozen

from dif.autodiff.backprop import Step, active_keys, backprop
from dif.autodiff.emit import const
from dif.autodiff.registry import NoVjpError, _bare
from dif.errors import DifError
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Program, Provenance
from dif.plan.plan import Decision, Plan
from dif.target import RuntimeBudget, TargetProfile

Extend = Callable[[ProgramBuilder, Mapping[str, Var], Mapping[str, Var]], Mapping[str, Var]]

TRANSFORM = "autodiff"
RECOMPUTE = "autodiff.recompute"
COTANGENT_PREFIX = "cotangent."


@frozen
class GradProgram:
    """The transformed program and how to read it. `gradients` maps each differentiated input /
    parameter name to the output value holding its gradient (same shape and dtype); `cotangents`
    maps each forward output to the input taking its cotangent (empty when a scalar loss seeds)."""

    program: Program
    loss: str | None
    outputs: tuple[str, ...]
    gradients: dict[str, str]
    cotangents: dict[str, str]
    decisions: tuple[Decision, ...]
    extra: dict[str, str] = field(factory=dict)

    def plan(self, profile: TargetProfile, budget: RuntimeBudget, **options: Any) -> Plan:
        """The program planned by the ordinary planner, the autodiff decisions (recomputes) recorded
        first; `Plan.peak_bytes` is the step's activation + gradient peak."""
        from dif.plan.planner import plan_program

        return plan_program(self.program, profile, budget, decisions=self.decisions, **options)


def _scope(b: ProgramBuilder, prov: Provenance | None):  # type: ignore[no-untyped-def]
    p = prov or Provenance()
    return b.scope(module=p.module, block=p.block, section=p.section, tensors=p.tensors)


def grad_program(
    forward: Program,
    wrt: Sequence[str],
    *,
    loss: str | None = None,
    checkpoint: Sequence[str] = (),
    keep_outputs: bool = True,
    name: str | None = None,
    extend: Extend | None = None,
) -> GradProgram:
    """Differentiate `forward` with respect to `wrt` (names of its inputs or parameters, float).

    loss: a forward value with one element (usually the program's output) seeded with 1; without it,
    every float output takes a cotangent input `cotangent.<i>` (a vector-Jacobian product program).
    checkpoint: fnmatch patterns of provenance block names to recompute in the backward.
    Outputs: the loss (or the forward outputs, when keep_outputs) then one gradient per `wrt` name;
    with `extend(b, env, grads)` (forward values and gradients by name, as builder values), what it
    returns (label -> value) takes the gradients' place: an optimizer step is emitted in the same program.
    Raises `NoVjpError` naming the op and node when a needed op has no VJP rule."""
    types = forward.types
    declared = {v.name for v in (*forward.inputs, *forward.params)}
    for w in wrt:
        if w not in declared:
            raise DifError(f"autodiff of '{forward.name}': '{w}' is not an input or parameter of the program")
        if not types[w].dtype.is_float:
            raise DifError(f"autodiff of '{forward.name}': '{w}' is {types[w]}, only float values have gradients")
    if loss is not None and (loss not in types or types[loss].numel != 1):
        got = types.get(loss, "not a value of the program")
        raise DifError(f"autodiff of '{forward.name}': loss '{loss}' must be a one-element value ({got})")

    b = ProgramBuilder(name or f"{forward.name}.grad")
    b.meta.update(forward.meta)
    env: dict[str, Var] = {}
    for v in forward.inputs:
        env[v.name] = b.input(v.name, v.type.shape, v.type.dtype)
    for v in forward.params:
        env[v.name] = b.param(v.name, v.type.shape, v.type.dtype)
    steps: list[Step] = []
    for node in forward.nodes:
        prov = forward.provenance.get(node.id)
        with _scope(b, prov):
            res = b.emit_multi(node.op, *(env[o] for o in node.operands), **node.attrs)
        env.update((r.name, v) for r, v in zip(node.results, res, strict=True))
        where = f"node {node.id} ({node.op}) at {prov.describe() if prov else '<no provenance>'}"
        steps.append(Step(node.op, tuple(node.operands), tuple(r.name for r in node.results), node.attrs, where))
    n_forward = len(b._nodes)  # noqa: SLF001

    active = active_keys(steps, set(wrt), lambda k: types[k].dtype.is_float)
    seeds: dict[str, Var] = {}
    cotangents: dict[str, str] = {}
    if loss is not None:
        if loss in active:
            seeds[loss] = const(b, 1.0, types[loss].dtype, types[loss].shape)
    else:
        for i, out in enumerate(forward.outputs):
            if types[out].dtype.is_float:
                cname = f"{COTANGENT_PREFIX}{i}"
                cv = b.input(cname, types[out].shape, types[out].dtype)
                cotangents[out] = cname
                if out in active:
                    seeds[out] = cv

    blocks = _checkpointed_blocks(forward, checkpoint)
    decisions: list[Decision] = []
    recomputed: dict[str, dict[str, Var]] = {}
    recompute_nodes: set[int] = set()

    def views(i: int) -> dict[str, Var]:
        node = forward.nodes[i]
        block = _block_of(forward, node.id)
        if block not in blocks:
            return {}
        if block not in recomputed:
            recomputed[block] = _recompute(b, forward, blocks[block], env, recompute_nodes)
            decisions.append(
                Decision(
                    f"checkpoint: block {block} recomputed in the backward ({len(blocks[block])} nodes)",
                    f"matches {', '.join(checkpoint)}: its activations "
                    f"({_internal_bytes(forward, blocks[block])} B) are not kept from the forward to the backward",
                )
            )
        return recomputed[block]

    backward_of: dict[int, int] = {}
    try:
        ct = backprop(
            b, steps, env, seeds, active, views=views, on_emit=lambda i, start: backward_of.setdefault(start, i)
        )
    except NoVjpError as exc:
        raise NoVjpError(f"autodiff of '{forward.name}': {_bare(exc)}", hint=exc.hint) from None

    outputs: list[Var] = (
        [env[loss]] if loss is not None else ([env[o] for o in forward.outputs] if keep_outputs else [])
    )
    grads: dict[str, Var] = {}
    for w in wrt:
        g = ct.get(w)
        if g is None:  # requested but not connected to the loss: an honest zero
            g = const(b, 0.0, types[w].dtype, types[w].shape)
        grads[w] = g
    named = dict(grads) if extend is None else dict(extend(b, env, grads))
    n_lead = len(outputs)
    used = {v.name for v in outputs}
    labels: dict[str, str] = {}
    for label, g in named.items():
        if g.name in used or not g.name.startswith("%"):
            g = b.emit("scalar_affine", g, scale=1.0, bias=0.0)  # an output of its own
        used.add(g.name)
        labels[label] = g.name
        outputs.append(g)
    gradients = {w: labels[w] if extend is None else grads[w].name for w in wrt}
    b.output(*outputs)
    b.meta["gradients"] = json.dumps(gradients, sort_keys=True)
    if loss is not None:
        b.meta["loss"] = loss
    program = _tag_provenance(b.build(), n_forward, recompute_nodes)
    decisions.append(
        Decision(
            f"autodiff: {len(program.nodes) - n_forward} backward nodes for {len(wrt)} gradients",
            f"reverse mode over {len(forward.nodes)} forward nodes; "
            f"{len(forward.params) + len(forward.inputs) - len(wrt)} inputs/parameters are not differentiated "
            "and get no gradient buffers",
        )
    )
    return GradProgram(
        program, loss, tuple(v.name for v in outputs[:n_lead]), gradients, cotangents, tuple(decisions),
        {} if extend is None else labels,
    )  # fmt: skip


def _block_of(forward: Program, node_id: int) -> str:
    prov = forward.provenance.get(node_id)
    return prov.block if prov is not None else ""


def _checkpointed_blocks(forward: Program, patterns: Sequence[str]) -> dict[str, list[int]]:
    """Block name -> its node ids (forward order), for blocks matching any pattern."""
    out: dict[str, list[int]] = {}
    if not patterns:
        return out
    for node in forward.nodes:
        block = _block_of(forward, node.id)
        if block and any(fnmatch.fnmatchcase(block, p) for p in patterns):
            out.setdefault(block, []).append(node.id)
    return out


def _recompute(
    b: ProgramBuilder, forward: Program, node_ids: list[int], env: dict[str, Var], emitted: set[int]
) -> dict[str, Var]:
    """The block's nodes emitted again; operands from outside the block read the forward values."""
    local: dict[str, Var] = {}
    for nid in node_ids:
        node = forward.node_by_id[nid]
        with _scope(b, forward.provenance.get(nid)):
            start = len(b._nodes)  # noqa: SLF001
            res = b.emit_multi(node.op, *(local.get(o, env[o]) for o in node.operands), **node.attrs)
            emitted.update(range(start, len(b._nodes)))  # noqa: SLF001
        local.update((r.name, v) for r, v in zip(node.results, res, strict=True))
    return local


def _internal_bytes(forward: Program, node_ids: list[int]) -> int:
    inside = set(node_ids)
    total = 0
    for nid in node_ids:
        for r in forward.node_by_id[nid].results:
            users = forward.users.get(r.name, ())
            if all(u.id in inside for u in users):
                total += r.type.nbytes
    return total


def _tag_provenance(program: Program, n_forward: int, recompute: set[int]) -> Program:
    prov = dict(program.provenance)
    for node in program.nodes[n_forward:]:
        p = prov.get(node.id, Provenance())
        prov[node.id] = evolve(p, transforms=(*p.transforms, RECOMPUTE if node.id in recompute else TRANSFORM))
    return evolve(program, provenance=prov)
