"""Buffer views: values the planner places inside another value's slot instead of giving them one of
their own (a planner step, between lifetimes and arena packing).

Three ops only move bytes, and an executor that can address parts of a buffer need not run them:
- `reshape`: the result is its operand's bytes (capability `alias:reshape`);
- `split`: each result is a part of its operand (`alias:split`);
- `concat`: each operand's producer writes straight into its part of the result (`alias:concat`).

A part along axis `a` of a row-major tensor is contiguous when every axis before `a` has extent 1
(the token axis of a batch-1 activation). Otherwise it is *pitched*: rows of `row` contiguous bytes
(axes `a` to the last) whose starts are `pitch` bytes apart (a last-axis part of [tokens, features]).
A pitched view is made only when every op that reads or writes it declares it can address such
rows: `view:<op>:<r>`, where r counts the trailing axes a row spans (1 for a last-axis part of
[.., F]; 2 after a reshape to [.., heads, head_dim]). Contiguous views need nothing from the ops.

A view is a `Buffer` with `alias_of` = its root, `offset` relative to the root until the arena is
packed (then absolute), and `row_bytes`/`pitch_bytes` (0 for contiguous). Roots grow their
lifetimes over their views'. Views start on `VIEW_ALIGNMENT` bytes (vector loads, cuBLASLt, cuDNN).
"""

from __future__ import annotations

import math
from collections.abc import Collection

from attrs import evolve, frozen

from dif.errors import PlanError
from dif.ir.program import Node, Program
from dif.plan.plan import ALIAS_CAPABILITY, VIEW_ALIGNMENT, Buffer, Plan
from dif.strides import contiguous_strides

SPLIT_CAPABILITY = "alias:split"
CONCAT_CAPABILITY = "alias:concat"
ANY_VIEW_CAPABILITY = "view:*"
"""Every op reads and writes pitched views of any row length (an executor over strided arrays)."""
VIEW_OPS = ("reshape", "split")
"""Ops whose results, when views, are already in place: an executor does not run them."""


@frozen
class Loc:
    """Where a value's bytes are: `offset` bytes into `root`'s slot, contiguous or pitched rows."""

    root: str
    offset: int = 0
    row: int = 0
    pitch: int = 0

    @property
    def pitched(self) -> bool:
        return self.pitch != 0


def view_capability(op: str, row_axes: int) -> str:
    return f"view:{op}:{row_axes}"


def part_loc(root: str, shape: tuple[int, ...], axis: int, start: int, size: int, itemsize: int) -> Loc:
    """The location of `[..., start:start+size, ...]` along `axis` of a contiguous `shape` in `root`."""
    inner = math.prod(shape[axis + 1 :]) * itemsize
    offset = start * inner
    if math.prod(shape[:axis]) == 1 or size == shape[axis]:
        return Loc(root, offset)
    return Loc(root, offset, size * inner, shape[axis] * inner)


def byte_strides(shape: tuple[int, ...], itemsize: int, row_bytes: int = 0, pitch_bytes: int = 0) -> tuple[int, ...]:
    """Byte strides of a value of `shape` laid out contiguously, or as rows of `row_bytes` every
    `pitch_bytes` (the axes a row spans are contiguous; the axes before step over rows)."""
    split = len(shape) - row_axes(shape, row_bytes, itemsize) if pitch_bytes else 0
    rows, within = contiguous_strides(shape[:split]), contiguous_strides(shape[split:])
    return tuple([s * pitch_bytes for s in rows] + [s * itemsize for s in within])


def row_axes(shape: tuple[int, ...], row_bytes: int, itemsize: int) -> int:
    """How many trailing axes of `shape` one row of `row_bytes` spans exactly (0: it spans none)."""
    acc = itemsize
    for r, d in enumerate(reversed(shape), start=1):
        acc *= d
        if acc == row_bytes:
            return r
        if acc > row_bytes:
            break
    return 0


class ViewPlanner:
    """Decides the views of one program (see the module docstring); `buffers` are unplaced roots."""

    def __init__(self, program: Program, buffers: list[Buffer], capabilities: Collection[str]) -> None:
        self.program = program
        self.caps = frozenset(capabilities)
        self.by_name = {b.name: b for b in buffers}
        self.order = [b.name for b in buffers]
        self.loc: dict[str, Loc] = {b.name: Loc(b.name) for b in buffers}
        self.users = program.users
        self.producers = program.producers
        self.types = program.types
        self.outputs = set(program.outputs)

    def run(self) -> list[Buffer]:
        for node in self.program.nodes:  # program order is the schedule: operands are settled first
            if node.op == "reshape" and ALIAS_CAPABILITY in self.caps:
                self._reshape(node)
            elif node.op == "split" and SPLIT_CAPABILITY in self.caps:
                self._split(node)
        if CONCAT_CAPABILITY in self.caps:
            for node in self.program.nodes:
                if node.op == "concat":
                    self._concat(node)
        return self._buffers()

    # -- reshape and split: results are (parts of) their operand -----------------------------------

    def _reshape(self, node: Node) -> None:
        src = self.loc.get(node.operands[0])
        (r,) = node.results
        if src is None:  # an input or parameter: outside the arena
            return
        if src.pitched and not row_axes(r.type.shape, src.row, r.type.dtype.itemsize):
            return  # the reshape regroups elements across rows: it must copy
        self.loc[r.name] = src

    def _split(self, node: Node) -> None:
        src = self.loc.get(node.operands[0])
        if src is None or src.pitched:
            return
        t = self.types[node.operands[0]]
        axis = node.attrs["axis"] % len(t.shape)
        start = 0
        for r in node.results:
            size = r.type.shape[axis]
            part = part_loc(src.root, t.shape, axis, start, size, t.dtype.itemsize)
            part = evolve(part, offset=part.offset + src.offset)
            start += size
            if self._placeable(part) and (not part.pitched or self._readers_accept(r.name, part)):
                self.loc[r.name] = part

    # -- concat: operands are written in place -----------------------------------------------------

    def _concat(self, node: Node) -> None:
        (out,) = node.results
        if self.loc[out.name].root != out.name or self._hosts_views(out.name) is None:
            return  # the result is itself a view, or already hosts parts: no nesting
        axis = node.attrs["axis"] % len(out.type.shape)
        start = 0
        for name in node.operands:
            size = self.types[name].shape[axis]
            part = part_loc(out.name, out.type.shape, axis, start, size, out.type.dtype.itemsize)
            start += size
            if node.operands.count(name) == 1:
                self._move_into(name, part, node)

    def _move_into(self, name: str, part: Loc, concat: Node) -> None:
        """Make the family of `name` (its root and the root's reshape views) a view at `part`."""
        loc = self.loc.get(name)
        if loc is None or loc.offset or loc.pitched or not self._placeable(part):
            return
        root = loc.root
        family = self._hosts_views(root)
        if family is None or root in self.outputs or root == concat.results[0].name:
            return
        if self.producers[root].op in VIEW_OPS:  # executors skip those when their results are views
            return
        if part.pitched:
            writer = self.producers[root]
            if not self._can_view(writer.op, self._axes(root, part)):
                return
            if not all(self._readers_accept(n, part, skip=concat.id) for n in family):
                return
        for n in family:
            self.loc[n] = part

    # -- checks -------------------------------------------------------------------------------------

    def _can_view(self, op: str, axes: int) -> bool:
        return axes > 0 and (ANY_VIEW_CAPABILITY in self.caps or view_capability(op, axes) in self.caps)

    def _placeable(self, part: Loc) -> bool:
        return part.offset % VIEW_ALIGNMENT == 0 and part.pitch % VIEW_ALIGNMENT == 0

    def _hosts_views(self, root: str) -> list[str] | None:
        """The names located in `root` when all of them are whole-root aliases (reshapes), else None."""
        family = [n for n, lc in self.loc.items() if lc.root == root]
        if any(self.loc[n] != Loc(root) for n in family):
            return None
        return family

    def _axes(self, name: str, part: Loc) -> int:
        t = self.types[name]
        return row_axes(t.shape, part.row, t.dtype.itemsize)

    def _readers_accept(self, name: str, part: Loc, skip: int | None = None) -> bool:
        """Whether every reader of `name` (through row-keeping reshapes) can read it as pitched rows."""
        if name in self.outputs:
            return False
        axes = self._axes(name, part)
        if not axes:
            return False
        for user in self.users.get(name, ()):
            if user.id == skip:
                continue
            if user.op == "reshape" and ALIAS_CAPABILITY in self.caps:
                (r,) = user.results
                if not row_axes(r.type.shape, part.row, r.type.dtype.itemsize):
                    return False
                if not self._readers_accept(r.name, part, skip):
                    return False
            elif not self._can_view(user.op, axes):
                return False
        return True

    # -- result ---------------------------------------------------------------------------------------

    def _buffers(self) -> list[Buffer]:
        """Buffers with views marked and every root's lifetime stretched over its views'."""
        span = {name: (b.first_use, b.last_use) for name, b in self.by_name.items()}
        for name, lc in self.loc.items():
            if lc.root != name:
                lo, hi = span[lc.root]
                b = self.by_name[name]
                span[lc.root] = (min(lo, b.first_use), max(hi, b.last_use))
        out = []
        for name in self.order:
            b, lc = self.by_name[name], self.loc[name]
            if lc.root == name:
                out.append(evolve(b, first_use=span[name][0], last_use=span[name][1]))
            else:
                out.append(evolve(b, offset=lc.offset, alias_of=lc.root, row_bytes=lc.row, pitch_bytes=lc.pitch))
        return out


def plan_views(program: Program, buffers: list[Buffer], capabilities: Collection[str]) -> list[Buffer]:
    """`buffers` (unplaced, in schedule order) with the views `capabilities` allow (module docstring)."""
    return ViewPlanner(program, buffers, capabilities).run()


def check_views(plan: Plan, program: Program) -> None:
    """`PlanError` unless every view of `plan` is where its op puts those bytes: a reshape result
    exactly where its operand is; a split result at its part of a contiguous operand; anything else
    a concat operand (or a value it reshapes) at its part of the concat's result. `check_arena`
    has already checked that each view lies inside its root and lifetime."""
    buffers = plan.buffer_by_name
    producers = program.producers

    def loc(name: str) -> Loc | None:
        b = buffers.get(name)
        if b is None:
            return None
        return Loc(b.alias_of or b.name, b.offset, b.row_bytes, b.pitch_bytes)

    claimed: set[str] = set()
    for node in program.nodes:
        if node.op != "concat" or buffers[node.results[0].name].is_alias:
            continue
        out = node.results[0]
        host, axis, start = buffers[out.name], node.attrs["axis"] % len(out.type.shape), 0
        for name in node.operands:
            size = program.types[name].shape[axis]
            part = part_loc(out.name, out.type.shape, axis, start, size, out.type.dtype.itemsize)
            part = evolve(part, offset=part.offset + host.offset)
            start += size
            while (got := loc(name)) is not None and got.root == out.name:
                if got != part or name in claimed:
                    raise PlanError(f"buffer '{name}' is not at its part of concat node {node.id}'s result")
                claimed.add(name)
                prev = producers[name]
                if prev.op not in VIEW_OPS:
                    break  # the producer writes the part
                name = prev.operands[0]
                if loc(name) != got:  # a reshape/split result is only ever in place over its operand
                    raise PlanError(f"{prev.op} node {prev.id} has a result inside concat node {node.id}'s result")
    for b in plan.buffers:
        if b.alias_of is None or b.name in claimed:
            continue
        node = producers[b.name]
        if node.op == "reshape" and loc(node.operands[0]) == loc(b.name):
            continue
        src = loc(node.operands[0]) if node.op == "split" else None
        if src is not None and not src.pitched and src.root == b.alias_of:
            t = program.types[node.operands[0]]
            axis = node.attrs["axis"] % len(t.shape)
            k = [r.name for r in node.results].index(b.name)
            start = sum(r.type.shape[axis] for r in node.results[:k])
            part = part_loc(src.root, t.shape, axis, start, node.results[k].type.shape[axis], t.dtype.itemsize)
            if evolve(part, offset=part.offset + src.offset) == loc(b.name):
                continue
        raise PlanError(
            f"buffer '{b.name}' is a view of '{b.alias_of}' but {node.op} node {node.id} does not put it there",
            hint="re-plan the program",
        )


def check_view_capabilities(plan: Plan, program: Program, capabilities: Collection[str]) -> None:
    """`PlanError` unless every view of `plan` is of a kind `capabilities` (the executor's target)
    declares: an executor must never be handed views it does not address."""
    caps = frozenset(capabilities)
    producers = program.producers
    for b in plan.buffers:
        if not b.is_alias:
            continue
        op = producers[b.name].op
        need = {"reshape": ALIAS_CAPABILITY, "split": SPLIT_CAPABILITY}.get(op, CONCAT_CAPABILITY)
        pitched_ok = not b.pitch_bytes or any(c.startswith("view:") for c in caps)
        if need not in caps or not pitched_ok:
            raise PlanError(
                f"buffer '{b.name}' is a {'pitched ' if b.pitch_bytes else ''}view ({op}) but the target does not "
                f"declare '{need if need not in caps else 'view:<op>:<rows>'}'",
                hint="re-plan the program for this backend",
            )
