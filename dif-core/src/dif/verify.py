"""The DiffIR verifier: run after every build, parse, load and pass; nothing downstream re-checks.

Invariants (checked in this order; the first broken one raises `VerifyError`):
  1. The program name is a str; meta is a str -> str mapping.
  2. Inputs and params are `Value`s with non-empty names that do not start with '%' (reserved for
     node results) and static shapes of positive dims (rank <= MAX_RANK, numel <= MAX_NUMEL).
  3. Single definition: every value name (input, param, node result) is defined exactly once.
  4. Node ids are 0..n-1 in program order.
  5. Every op is in the op table and gets an operand count its schema allows.
  6. Use after definition: operands name inputs, params or results of earlier nodes.
  7. Attributes are valid and complete: equal to `opdef.check_attrs(attrs)` (defaults filled).
  8. Result types equal the op's type rule (`opdef.infer_types`), in count and in each type.
  9. Outputs name defined values, each at most once.
 10. Provenance is keyed by ids of nodes in the program.
Unused params and unused node results are allowed (passes may leave them; the planner skips them).

Errors show the failing node as text between its neighbours, its provenance, and a fix hint.
"""

from __future__ import annotations

import math
from typing import Any

from dif.errors import DifError, VerifyError
from dif.ir.program import Node, Program, Value
from dif.ir.types import TensorType
from dif.ops.registry import OPS, OpTable

MAX_RANK = 16
MAX_NUMEL = 1 << 48
_VALUE_HINT = "values are Value(name, TensorType) with a non-empty str name"


def verify_program(program: Program, table: OpTable = OPS) -> None:
    """Raise `VerifyError` at the first broken invariant (see the module docstring)."""
    _check_meta(program)
    defined: dict[str, TensorType] = {}
    for kind, values in (("input", program.inputs), ("param", program.params)):
        for value in values:
            _check_decl(program, kind, value, defined)
            defined[value.name] = value.type
    for index, node in enumerate(program.nodes):
        _check_node(program, index, node, table, defined)
        defined.update((r.name, r.type) for r in node.results)
    seen: set[str] = set()
    for name in program.outputs:
        if not isinstance(name, str) or name not in defined:
            raise VerifyError(
                f"program '{program.name}': output {name!r} is not a defined value",
                hint="outputs must name an input, a param or a node result",
            )
        if name in seen:
            raise VerifyError(
                f"program '{program.name}': output '{name}' is listed twice", hint="list each output once"
            )
        seen.add(name)
    stray = sorted(k for k in program.provenance if not (isinstance(k, int) and 0 <= k < len(program.nodes)))
    if stray:
        raise VerifyError(
            f"program '{program.name}': provenance for node ids {stray[:5]} that are not in the program",
            hint="a pass that removes or renumbers nodes must remap program.provenance",
        )


# -- declarations ---------------------------------------------------------------------------------


def _check_meta(program: Program) -> None:
    if not isinstance(program.name, str):
        raise VerifyError(f"program name {program.name!r} is not a string", hint="name programs with a str")
    for key, val in program.meta.items():
        if not isinstance(key, str) or not isinstance(val, str):
            raise VerifyError(
                f"program '{program.name}': meta entry {key!r} = {val!r} is not str -> str",
                hint="meta holds strings only; encode other values (e.g. as JSON) first",
            )


def _shape_problem(t: object, *, positive: bool) -> str | None:
    if not isinstance(t, TensorType):
        return f"type {t!r} is not a TensorType"
    if len(t.shape) > MAX_RANK:
        return f"rank {len(t.shape)} exceeds {MAX_RANK}"
    low = 1 if positive else 0
    if any(d < low for d in t.shape):
        return f"shape {list(t.shape)} has a dim below {low}"
    if math.prod(t.shape) > MAX_NUMEL:
        return f"shape {list(t.shape)} has more than 2^48 elements"
    return None


def _check_decl(program: Program, kind: str, value: Value, defined: dict[str, TensorType]) -> None:
    if not isinstance(value, Value) or not isinstance(value.name, str) or not value.name:
        raise VerifyError(f"program '{program.name}': {kind} {value!r} is not a named Value", hint=_VALUE_HINT)
    where = f"program '{program.name}', {kind} {value.name!r}"
    if value.name.startswith("%"):
        raise VerifyError(f"{where}: names starting with '%' are reserved for node results", hint="rename the value")
    if value.name in defined:
        raise VerifyError(f"{where}: the name is defined twice", hint="give every input and param its own name")
    problem = _shape_problem(value.type, positive=True)
    if problem:
        raise VerifyError(f"{where}: {problem}", hint="inputs and params need static shapes with dims >= 1")


# -- nodes ----------------------------------------------------------------------------------------


def _node_error(program: Program, index: int, message: str, hint: str | None) -> VerifyError:
    from dif.serialize.text import format_node

    def line(i: int) -> str:
        try:
            return format_node(program.nodes[i])
        except DifError:
            return repr(program.nodes[i])

    node = program.nodes[index]
    context = []
    if index > 0:
        context.append(f"      {line(index - 1)}")
    context.append(f"  --> {line(index)}")
    if index + 1 < len(program.nodes):
        context.append(f"      {line(index + 1)}")
    prov = program.provenance.get(node.id)
    where = prov.describe() if prov is not None else "<no provenance>"
    text = "\n".join(context)
    return VerifyError(
        f"program '{program.name}', node {node.id} ({node.op}): {message}\n{text}\n  provenance: {where}", hint=hint
    )


def _attr_same(a: Any, b: Any) -> bool:
    """Equal values, with bool kept apart from int and nan equal to nan (attrs must round-trip)."""
    if isinstance(a, tuple) or isinstance(b, tuple):
        return isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) and all(map(_attr_same, a, b))
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return type(a) in (int, float, str, type(None)) and a == b


def _check_node(program: Program, index: int, node: Node, table: OpTable, defined: dict[str, TensorType]) -> None:
    def fail(message: str, hint: str | None = None) -> VerifyError:
        return _node_error(program, index, message, hint)

    if node.id != index:
        raise fail(f"node id {node.id} at position {index}", hint="node ids must be 0..n-1 in program order")
    if node.op not in table:
        raise fail(f"unknown op '{node.op}'", hint="check the spelling, or load the plugin that registers the op")
    opdef = table.get(node.op)
    n = len(node.operands)
    if not opdef.min_operands <= n <= opdef.max_operands:
        raise fail(
            f"{n} operands, but op '{node.op}' takes ({', '.join(opdef.operands)})",
            hint="pass the operands in schema order; only trailing optional ones ('?') may be left out",
        )
    for name in node.operands:
        if not isinstance(name, str) or name not in defined:
            later = isinstance(name, str) and name in program.types
            raise fail(
                f"operand '{name}' is {'used before it is defined' if later else 'not defined'}",
                hint="keep nodes in topological order" if later else "declare it as an input/param or define it first",
            )
    try:
        full = opdef.check_attrs(node.attrs)
    except DifError as exc:
        raise fail(_message(exc), hint=exc.hint or "see the op's attributes in docs/ir.md") from None
    for key, want in full.items():
        if key not in node.attrs:
            raise fail(f"attribute '{key}' is missing", hint=f"store defaults explicitly ({key}={want!r})")
        if not _attr_same(node.attrs[key], _freeze(want)):
            raise fail(
                f"attribute {key}={node.attrs[key]!r} is not in canonical form {want!r}",
                hint="store attributes exactly as opdef.check_attrs returns them (ProgramBuilder does)",
            )
    try:
        want_types = opdef.infer_types([defined[o] for o in node.operands], full)
    except DifError as exc:
        raise fail(_message(exc), hint=exc.hint or "fix the operand shapes/dtypes or the attributes") from None
    except Exception as exc:  # noqa: BLE001  (a crashing type rule is a bug; report it with the node)
        raise fail(
            f"type rule of op '{node.op}' failed: {type(exc).__name__}: {exc}",
            hint="the type rule should raise TypeRuleError for these operands; report this as a bug in the op",
        ) from None
    if len(node.results) != len(want_types):
        raise fail(
            f"{len(node.results)} results, but the type rule gives {len(want_types)}",
            hint="declare exactly the results the type rule gives (ProgramBuilder.emit_multi does)",
        )
    for i, (res, want_t) in enumerate(zip(node.results, want_types, strict=True)):
        if not isinstance(res, Value) or not isinstance(res.name, str) or not res.name:
            raise fail(f"result {i} is not a named Value", hint=_VALUE_HINT)
        if res.name in defined or any(r.name == res.name for r in node.results[:i]):
            raise fail(f"result '{res.name}' is already defined", hint="every value name is defined exactly once")
        if res.type != want_t:
            raise fail(
                f"result '{res.name}' is declared {res.type} but the type rule gives {want_t}",
                hint="declare the inferred type (ProgramBuilder.emit does), or fix the operands/attributes",
            )
        problem = _shape_problem(res.type, positive=False)
        if problem:
            raise fail(f"result '{res.name}': {problem}", hint="split the computation into smaller tensors")


def _message(exc: DifError) -> str:
    """An error's message without the hint line DifError appends (the hint is passed on separately)."""
    text = str(exc)
    return text[: -len(f"\n  hint: {exc.hint}")] if exc.hint and text.endswith(f"\n  hint: {exc.hint}") else text


def _freeze(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    return value
