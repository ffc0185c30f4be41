"""The pass manager: runs a straight list of named passes over a verified program (the optimizer,
between verify and the planner) and collects every decision they make.

    program --rope_before_concat--> --fuse_norm_rope--> --fuse_norm_modulate--> --fuse_gated_residual-->
            --fuse_act_mul--> --fuse_group_norm_silu--> --fuse_linear_residual--> --reuse_attention_stats-->
            [plugin passes]
            --> planner

A pass is `fn(program, **options) -> Program`; the manager passes the options the function takes:
`ctx` (a `PassContext`: target, `supports(op)`, `record(...)`) and `target`. Every result is
verified. Core passes are built in (`CORE_PASSES`); third parties add theirs through the
`register_passes` hook. A plugin pass that raises or returns a program that does not verify is
skipped (recorded, never fatal); a core pass that does is a bug and raises.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from dif.env import DIF_PASSES
from dif.errors import DifError, UsageError
from dif.ir.program import Program
from dif.passes.attention_stats import reuse_attention_stats
from dif.passes.context import APPLIED, PassContext, PassDecision, log
from dif.passes.distribute import rope_before_concat
from dif.passes.fusions import (
    fuse_act_mul,
    fuse_gated_residual,
    fuse_linear_residual,
    fuse_norm_modulate,
    fuse_norm_rope,
)
from dif.passes.norm_act import fuse_group_norm_silu
from dif.passes.quantize import PASS_NAMES, quantize_fp8, quantize_fp8_attention, quantize_int4, quantize_int8
from dif.plan.plan import Decision
from dif.target import TargetProfile
from dif.verify import verify_program

PassFn = Callable[..., Program]

CORE_PASSES: dict[str, PassFn] = {
    "rope_before_concat": rope_before_concat,
    "fuse_norm_rope": fuse_norm_rope,
    "fuse_norm_modulate": fuse_norm_modulate,
    "fuse_gated_residual": fuse_gated_residual,
    "fuse_act_mul": fuse_act_mul,
    "fuse_group_norm_silu": fuse_group_norm_silu,
    "fuse_linear_residual": fuse_linear_residual,
    "reuse_attention_stats": reuse_attention_stats,
    # format passes (dif.passes.quantize): chosen by the format search or by name, never by default
    "quantize_fp8": quantize_fp8,
    "quantize_int8": quantize_int8,
    "quantize_int4": quantize_int4,
    "quantize_fp8_attention": quantize_fp8_attention,
}
DEFAULT_PASSES: tuple[str, ...] = tuple(n for n in CORE_PASSES if n not in PASS_NAMES)
"""The core pipeline, in `CORE_PASSES` order: `rope_before_concat` makes norm/rope pairs for `fuse_norm_rope`;
the fusions touch disjoint op pairs, so their order only fixes the log, except that `fuse_gated_residual` and
`fuse_linear_residual` both consume adds: an add of a product goes to the first (a gated residual), an add of a
linear's result to the second; and a product goes into a gated residual before `fuse_act_mul` sees it."""

NONE = "none"
DEFAULT = "default"


def plugin_passes() -> dict[str, PassFn]:
    """Passes registered by plugins (`register_passes`), minus names a core pass already has."""
    from dif.plugins import passes

    return {name: fn for name, fn in passes().items() if name not in CORE_PASSES}


def available_passes() -> dict[str, PassFn]:
    """Every pass by name: the core ones, then the plugins' (sorted by name)."""
    return {**CORE_PASSES, **dict(sorted(plugin_passes().items()))}


def default_pipeline() -> tuple[str, ...]:
    """`DEFAULT_PASSES` followed by every plugin pass (sorted by name)."""
    return (*DEFAULT_PASSES, *sorted(plugin_passes()))


def selected_passes() -> tuple[str, ...]:
    """The pipeline `DIF_PASSES` asks for: unset or `default` -> `default_pipeline()`; `none` or
    empty -> no pass; otherwise the comma-separated names in that order (`default` expands in place).
    Raises `UsageError` naming unknown passes."""
    names = DIF_PASSES.get_list()
    if names is None:
        return default_pipeline()
    if names in ([], [NONE]):
        return ()
    known = available_passes()
    hint = f"use '{NONE}', '{DEFAULT}' or comma-separated names from: {', '.join(known)}"
    if NONE in names:
        raise UsageError(f"{DIF_PASSES.name}: '{NONE}' cannot be combined with other passes", hint=hint)
    out: list[str] = []
    for name in names:
        out.extend(default_pipeline() if name == DEFAULT else [name])
    unknown = [n for n in out if n not in known]
    if unknown:
        raise UsageError(f"{DIF_PASSES.name}: unknown pass {', '.join(unknown)}", hint=hint)
    return tuple(dict.fromkeys(out))


def _resolve(entry: str | PassFn) -> tuple[str, PassFn, bool]:
    """(name, function, is_core) for a pass name or a function."""
    if callable(entry):
        name = getattr(entry, "__name__", type(entry).__name__)
        return name, entry, CORE_PASSES.get(name) is entry
    if entry in CORE_PASSES:
        return entry, CORE_PASSES[entry], True
    plugins = plugin_passes()
    if entry in plugins:
        return entry, plugins[entry], False
    raise UsageError(f"unknown optimizer pass '{entry}'", hint=f"known passes: {', '.join(available_passes())}")


def _call(fn: PassFn, program: Program, ctx: PassContext) -> Any:
    """`fn(program, **options)` with the options its signature takes (all of them for **kwargs)."""
    options = {"ctx": ctx, "target": ctx.target}
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return fn(program, **options)
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return fn(program, **options)
    return fn(program, **{k: v for k, v in options.items() if k in params})


def optimize(
    program: Program,
    *,
    target: TargetProfile | None,
    passes: Sequence[str | PassFn] = DEFAULT_PASSES,
) -> tuple[Program, list[PassDecision]]:
    """Run `passes` in order over `program` for `target` (None: the reference interpreter, which runs
    every op). Returns the final program (the same object when nothing changed) and every decision.

    Each pass's result is verified (`dif.verify.verify_program`). Fusions apply only where
    `target` declares the fused op (`op:<name>` or `op:*` in its capabilities)."""
    decisions: list[PassDecision] = []
    for entry in passes:
        name, fn, core = _resolve(entry)
        ctx = PassContext(name, target, decisions)
        before = len(decisions)
        try:
            result = _call(fn, program, ctx)
            if not isinstance(result, Program):
                raise DifError(f"pass '{name}' returned {type(result).__name__}, not a Program")
            if result is not program:
                verify_program(result)
        except Exception as exc:
            if core:
                raise
            del decisions[before:]
            ctx.skipped(f"plugin pass failed, program left as it was: {type(exc).__name__}: {exc}")
            continue
        if len(decisions) == before and not core:  # a plugin pass that records nothing: say what it did
            if result is program:
                ctx.skipped("no change")
            else:
                ctx.applied(f"{len(program.nodes)} -> {len(result.nodes)} nodes")
        log.info("%s: %d nodes -> %d", name, len(program.nodes), len(result.nodes))
        program = result
    return program, decisions


def summarize(
    decisions: Sequence[PassDecision], pipeline: Sequence[str], *, source: str | None = None
) -> list[Decision]:
    """Plan decisions: the pipeline, then per pass one line per verdict and reason,
    naming the values where it happened (at most 6 each). A pass without candidates says so.
    `source` says where the pipeline came from (default: `DIF_PASSES` or the default pipeline)."""
    lines = [Decision(f"passes: {', '.join(pipeline) or 'none'}", source or _pipeline_reason(pipeline))]
    for name in pipeline:
        groups: dict[tuple[str, str], list[PassDecision]] = {}
        for d in decisions:
            if d.pass_name == name:
                groups.setdefault((d.verdict, d.reason), []).append(d)
        if not groups:
            lines.append(Decision(f"{name}: no candidates", "the pattern does not occur in this program"))
        for (verdict, reason), group in sorted(groups.items(), key=lambda kv: (kv[0][0] != APPLIED, kv[0][1])):
            where = [d.value for d in group if d.value]
            shown = ", ".join(where[:6]) + (f", … ({len(where) - 6} more)" if len(where) > 6 else "")
            lines.append(Decision(f"{name}: {verdict} {len(group)}" + (f" at {shown}" if shown else ""), reason))
    return lines


def _pipeline_reason(pipeline: Sequence[str]) -> str:
    value = DIF_PASSES.get()
    if value is None:
        return "default pipeline (core passes, then plugin passes); DIF_PASSES selects others"
    return f"{DIF_PASSES.name}={value!r}" + ("" if pipeline else ": optimizer passes disabled")
