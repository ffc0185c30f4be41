"""`ulysses`: a program split into per-rank programs for Ulysses sequence parallelism.

    program (single device) --ulysses(ranks=P, seq_inputs)--> P rank programs + ParallelPlan

Every rank holds 1/P of the sequence rows (the inputs named in `seq_inputs` are sliced to the rank's rows
inside its program; `dif.parallel.layout` says which, padding included) and computes every row-wise op on
them; attention needs all rows, so around each `sdpa` the rank programs exchange with `all_to_all`:
q, k, v [B, S/P, H, D] -> [B, S, H/P, D] (every row, 1/P of the heads), the padding rows dropped and the
rows put back in global order (so the attention sums exactly as on one device), then the output
[B, S, H/P, D] -> [B, S/P, H, D]. Values without a sequence axis (the timestep MLP, the modulation) are
computed whole on every rank. An op that would mix rows any other way is refused with its node named.
The decisions (degree, padding, each attention's exchange) are recorded as a pass records its own.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from attrs import evolve, frozen

from dif.errors import DifError
from dif.ir.builder import ProgramBuilder, Var
from dif.ir.program import Node, Program
from dif.parallel.collectives import parallel_table
from dif.parallel.layout import Block, Sharding, cut_at, single
from dif.passes.context import PassContext, PassDecision
from dif.verify import verify_program

PASS_NAME = "ulysses"
HEAD_AXIS, SEQ_AXIS = 2, 1  # sdpa's q/k/v are [B, S, H, D]
ROW_OPS = {"layer_norm", "rms_norm", "linear", "glu", "l2_normalize", "softmax", "group_norm"}
"""Ops that reduce or contract only over trailing axes given as attrs / the last axis (checked per node)."""
BROADCAST_OPS = {"modulate", "gated_residual"}
"""Elementwise with broadcasting, beyond the elementwise category."""


class ParallelError(DifError):
    """A program the sequence-parallel transform cannot split (the message names the node)."""


class _NeedCut(Exception):
    """The program slices input `name` at `row` inside one block: cut the block there and split again."""

    def __init__(self, name: str, row: int, node: Node) -> None:
        super().__init__(name, row)
        self.name, self.row, self.node = name, row, node


@frozen
class ParallelPlan:
    """What `ulysses` made: one program per rank, how sequence values are split, and why."""

    ranks: int
    programs: tuple[Program, ...]
    input_shardings: Mapping[str, Sharding]
    output_shardings: Mapping[str, Sharding | None]
    decisions: tuple[PassDecision, ...]


def _int(node: Node, key: str) -> int:
    """An integer attribute of `node` (attrs are typed loosely in the IR)."""
    value = node.attrs[key]
    assert isinstance(value, int), f"node {node.id}: attribute {key} is {value!r}"
    return value


Piece = tuple[str, int, int]  # ("rows", start, stop) of the source axis, or ("zeros", 0, n)


def _merge(pieces: Sequence[Piece]) -> list[Piece]:
    out: list[Piece] = []
    for p in pieces:
        if p[2] - p[1] <= 0:
            continue
        if out and out[-1][0] == p[0] and (p[0] == "zeros" or out[-1][2] == p[1]):
            last = out.pop()
            p = (p[0], last[1], last[2] + (p[2] - p[1])) if p[0] == "zeros" else (p[0], last[1], p[2])
        out.append(p)
    return out


class _Splitter:
    def __init__(self, program: Program, ranks: int, rank: int, ctx: PassContext | None) -> None:
        self.src, self.ranks, self.rank, self.ctx = program, ranks, rank, ctx
        self.b = ProgramBuilder(f"{program.name}.rank{rank}", table=parallel_table())
        self.b.meta.update(program.meta)
        self.b.meta.update({"parallel": "ulysses", "rank": str(rank), "ranks": str(ranks)})
        self.env: dict[str, tuple[Var, Sharding | None]] = {}
        self.prov: dict[int, Any] = {}
        self.count = 0
        self.current: Node | None = None

    # -- emission -----------------------------------------------------------------------------
    def emit(self, op: str, *operands: Var | None, **attrs: Any) -> tuple[Var, ...]:
        out = self.b.emit_multi(op, *operands, **attrs)
        if self.current is not None:
            prov = self.src.provenance.get(self.current.id)
            if prov is not None:
                self.prov[self.count] = evolve(prov, transforms=(*prov.transforms, PASS_NAME))
        self.count += 1
        return out

    def one(self, op: str, *operands: Var | None, **attrs: Any) -> Var:
        return self.emit(op, *operands, **attrs)[0]

    def gather_pieces(self, x: Var, axis: int, pieces: Sequence[Piece]) -> Var:
        """x's rows along `axis` as `pieces` (rows of x, or zero rows), concatenated."""
        parts = []
        for kind, lo, hi in _merge(pieces):
            if kind == "zeros":
                shape = list(x.shape)
                shape[axis] = hi - lo
                parts.append(self.one("full", shape=tuple(shape), value=0.0, dtype=x.dtype.value))
            elif lo == 0 and hi == x.shape[axis]:
                parts.append(x)
            else:
                parts.append(self.one("slice", x, axis=axis, start=lo, stop=hi))
        return parts[0] if len(parts) == 1 else self.one("concat", *parts, axis=axis)

    def rank_pieces(self, sharding: Sharding, rank: int) -> list[Piece]:
        """Rank `rank`'s local rows of `sharding`, as rows of the global axis (+ padding)."""
        out: list[Piece] = []
        for blk in sharding.blocks:
            lo, n, c = blk.first_row(rank, self.ranks), blk.valid(rank, self.ranks), blk.chunk(self.ranks)
            out += [("rows", lo, lo + n), ("zeros", 0, c - n)]
        return out

    def localize(self, x: Var, axis: int, sharding: Sharding) -> Var:
        """A whole (replicated) x -> this rank's rows along `axis`."""
        if x.shape[axis] != sharding.global_length:
            raise self.refuse(f"operand {x.name} has {x.shape[axis]} rows on axis {axis}, the sequence has "
                              f"{sharding.global_length}")  # fmt: skip
        return self.gather_pieces(x, axis, self.rank_pieces(sharding, self.rank))

    def refuse(self, why: str) -> ParallelError:
        node = self.current
        where = "" if node is None else f"node {node.id} ({node.op} -> {node.results[0].name})"
        prov = None if node is None else self.src.provenance.get(node.id)
        at = f" at {prov.describe()}" if prov is not None else ""
        return ParallelError(f"ulysses: {where}{at}: {why}", hint="only row-wise ops and sdpa split over sequence rows")

    # -- rules ----------------------------------------------------------------------------------
    def node(self, node: Node) -> None:
        self.current = node
        args = [self.env[o] for o in node.operands]
        shard = [s for _, s in args if s is not None]
        if not shard:
            outs = self.emit(node.op, *(v for v, _ in args), **node.attrs)
            self.bind(node, outs, None)
            return
        rule = getattr(self, f"rule_{node.op}", None)
        opdef = self.b._table.get(node.op)
        if rule is None and (opdef.category == "elementwise" or node.op in BROADCAST_OPS):
            rule = self.rule_broadcast
        elif rule is None and node.op in ROW_OPS:
            rule = self.rule_rows
        if rule is None:
            raise self.refuse(f"op '{node.op}' on a sequence-sharded operand has no split rule")
        rule(node, args)

    def bind(self, node: Node, outs: Sequence[Var], sharding: Sharding | None | Sequence[Sharding | None]) -> None:
        shardings = sharding if isinstance(sharding, list) else [sharding] * len(outs)
        for r, v, s in zip(node.results, outs, shardings, strict=True):
            self.env[r.name] = (v, s)

    def rule_broadcast(self, node: Node, args: list[tuple[Var, Sharding | None]]) -> None:
        rank_out = len(node.results[0].type.shape)
        placed = {(rank_out - v.type.rank + s.axis, s.blocks) for v, s in args if s is not None}
        if len(placed) != 1:
            raise self.refuse("operands are split differently along the sequence")
        ((axis, blocks),) = placed
        sharding = Sharding(axis, blocks)
        operands = []
        for v, s in args:
            a = axis - (rank_out - v.type.rank)
            if s is None and a >= 0 and v.shape[a] != 1:
                v = self.localize(v, a, sharding)  # a whole-sequence operand: this rank's rows of it
            operands.append(v)
        self.bind(node, self.emit(node.op, *operands, **node.attrs), sharding)

    def rule_rows(self, node: Node, args: list[tuple[Var, Sharding | None]]) -> None:
        (x, s), rest = args[0], args[1:]
        if s is None or any(r is not None for _, r in rest):
            raise self.refuse("only the first operand may be split along the sequence")
        axes = [_int(node, "axis")] if "axis" in node.attrs else [-1]
        if node.op == "group_norm":
            axes = list(range(1, x.type.rank))
        if any(a % x.type.rank == s.axis for a in axes):
            raise self.refuse(f"op '{node.op}' reduces over the split axis {s.axis}")
        self.bind(node, self.emit(node.op, x, *(v for v, _ in rest), **node.attrs), s)

    def rule_rope(self, node: Node, args: list[tuple[Var, Sharding | None]]) -> None:
        (x, s), (cos, cs), (sin, ss) = args
        if s is None or cs is not None or ss is not None:
            raise self.refuse("rope needs x split and its cos/sin tables whole")
        tables = [self.localize(t, 0, s.on_axis(0)) for t in (cos, sin)]  # the rank's rows of the tables
        self.bind(node, self.emit("rope", x, *tables, **node.attrs), s)

    def rule_reshape(self, node: Node, args: list[tuple[Var, Sharding | None]]) -> None:
        (x, s) = args[0]
        assert s is not None
        old, new = self.src.types[node.operands[0]].shape, node.results[0].type.shape
        before = math.prod(old[: s.axis])
        hits = [j for j in range(len(new)) if math.prod(new[:j]) == before and new[j] == old[s.axis]]
        if not hits:
            raise self.refuse(f"reshape {list(old)} -> {list(new)} merges or splits the sequence axis {s.axis}")
        j = hits[0]
        shape = list(new)
        shape[j] = s.local_length(self.ranks)
        self.bind(node, self.emit("reshape", x, shape=tuple(shape)), s.on_axis(j))

    def _select(self, s: Sharding, start: int, stop: int) -> tuple[int, int, Sharding]:
        """The whole blocks covering global rows [start, stop): (local start, local stop, their sharding)."""
        offsets = self.offsets(s)
        for edge in (start, stop):  # an edge inside a block that comes from an input: cut that input there
            for b in s.blocks:
                src = b.source_row(edge)
                if b.start < edge < b.start + b.length and src is not None and self.current is not None:
                    raise _NeedCut(src[0], src[1], self.current)
        picked = [i for i, b in enumerate(s.blocks) if start <= b.start and b.start + b.length <= stop]
        if sum(s.blocks[i].length for i in picked) != stop - start or picked != list(
            range(picked[0] if picked else 0, (picked[-1] + 1) if picked else 0)
        ):
            raise self.refuse(f"rows {start}..{stop} are not whole blocks of the split ({s.describe(self.ranks)})")
        lo = offsets[picked[0]]
        hi = offsets[picked[-1]] + s.blocks[picked[-1]].chunk(self.ranks)
        return lo, hi, Sharding(s.axis, tuple(s.blocks[i].shifted(-start) for i in picked))

    def offsets(self, s: Sharding) -> list[int]:
        return s.local_offsets(self.ranks)

    def rule_slice(self, node: Node, args: list[tuple[Var, Sharding | None]]) -> None:
        (x, s) = args[0]
        assert s is not None
        a = _int(node, "axis") % x.type.rank
        if a != s.axis:
            self.bind(node, self.emit("slice", x, **node.attrs), s)
            return
        if _int(node, "step") != 1:
            raise self.refuse("a strided slice of the sequence axis")
        lo, hi, sub = self._select(s, _int(node, "start"), min(_int(node, "stop"), s.global_length))
        self.bind(node, self.emit("slice", x, axis=a, start=lo, stop=hi, step=1), sub)

    def rule_split(self, node: Node, args: list[tuple[Var, Sharding | None]]) -> None:
        (x, s) = args[0]
        assert s is not None
        a = _int(node, "axis") % x.type.rank
        if a != s.axis:
            self.bind(node, self.emit("split", x, **node.attrs), [s] * len(node.results))
            return
        sizes, subs, at = [], [], 0
        sizes_attr = node.attrs["sizes"]
        assert isinstance(sizes_attr, tuple)
        for n in sizes_attr:
            lo, hi, sub = self._select(s, at, at + n)
            sizes.append(hi - lo)
            subs.append(sub)
            at += n
        self.bind(node, self.emit("split", x, axis=a, sizes=tuple(sizes)), subs)

    def rule_concat(self, node: Node, args: list[tuple[Var, Sharding | None]]) -> None:
        rank = args[0][0].type.rank
        a = _int(node, "axis") % rank
        axes = {s.axis for _, s in args if s is not None}
        if any(s is None for _, s in args) or len(axes) != 1:
            raise self.refuse("concat of split and whole operands")
        (axis,) = axes
        if a != axis:
            if len({s.blocks for _, s in args if s is not None}) != 1:
                raise self.refuse("concat of operands split differently")
            self.bind(node, self.emit("concat", *(v for v, _ in args), axis=a), args[0][1])
            return
        blocks, at = [], 0
        for _, s in args:
            assert s is not None
            blocks += [b.shifted(at) for b in s.blocks]
            at += s.global_length
        self.bind(node, self.emit("concat", *(v for v, _ in args), axis=a), Sharding(a, tuple(blocks)))

    def rule_sdpa(self, node: Node, args: list[tuple[Var, Sharding | None]]) -> None:
        (q, sq), (k, sk), (v, sv) = args[:3]
        mask = None
        if len(args) > 3:  # key_mask [B, Skv] over the keys in global order: whole on every rank, used as is
            mask, ms = args[3]
            if ms is not None:
                raise self.refuse("sdpa's key mask is split along the sequence; give it whole")
        if sq is None or sk is None or sv is None or sk != sv or sq.axis != SEQ_AXIS:
            raise self.refuse("sdpa needs q, k and v split along their sequence axis (k and v alike)")
        p = self.ranks
        for name, t in (("q", q), ("k", k), ("v", v)):
            if t.shape[HEAD_AXIS] % p:
                raise self.refuse(f"{name} has {t.shape[HEAD_AXIS]} heads, not divisible by {p} ranks")
        whole = []
        for t, s in ((q, sq), (k, sk), (v, sv)):
            g = self.one("all_to_all", t, ranks=p, split_axis=HEAD_AXIS, concat_axis=SEQ_AXIS)
            whole.append(self.gather_pieces(g, SEQ_AXIS, self.global_order(s)))
        o = self.one("sdpa", *whole, mask, **node.attrs)
        padded = [piece for r in range(p) for piece in self.rank_pieces(sq, r)]
        o = self.gather_pieces(o, SEQ_AXIS, padded)
        o = self.one("all_to_all", o, ranks=p, split_axis=SEQ_AXIS, concat_axis=HEAD_AXIS)
        self.bind(node, [o], sq)
        if self.ctx is not None:
            heads = q.shape[HEAD_AXIS]
            why = (
                f"heads {heads} -> {heads // p} per rank; all_to_all on q, k, v and the output; "
                f"{sq.padding(p)} padding rows of q, {sk.padding(p)} of k/v dropped before attention"
            )
            self.ctx.applied(why, (node.id,), node.results[0].name)

    def global_order(self, s: Sharding) -> list[Piece]:
        """Rows of the gathered [rank 0 | rank 1 | ...] local layouts, in global order, without padding."""
        local = s.local_length(self.ranks)
        offsets = self.offsets(s)
        order = sorted(range(len(s.blocks)), key=lambda i: s.blocks[i].start)
        pieces: list[Piece] = []
        for i in order:
            blk = s.blocks[i]
            for r in range(self.ranks):
                lo = r * local + offsets[i]
                pieces.append(("rows", lo, lo + blk.valid(r, self.ranks)))
        return pieces


def _input_sharding(program: Program, name: str, spec: int | Sharding) -> Sharding:
    types = program.types
    if name not in types or name not in {v.name for v in program.inputs}:
        raise ParallelError(f"ulysses: '{name}' is not an input of program '{program.name}'")
    if isinstance(spec, Sharding):
        return Sharding(spec.axis, tuple(Block(b.start, b.length, (name, b.start)) for b in spec.blocks))
    return single(spec % types[name].rank, types[name].shape[spec], origin=name)


def ulysses(program: Program, ranks: int, seq_inputs: Mapping[str, int | Sharding]) -> ParallelPlan:
    """Split `program` for `ranks`-way Ulysses sequence parallelism.

    `seq_inputs`: input name -> its sequence axis (split evenly, one block) or a `Sharding` (several blocks).
    Every other input is whole on every rank; the rank programs take the same inputs as `program` (each
    slices its rows out) and return their rows of each sequence output (`ParallelPlan.output_shardings`;
    `dif.parallel.local.gather` joins them). Where the program slices an input's rows apart (H3's
    conditioning and target video rows), that input's block is cut there, so each part is split on its own.
    `ParallelError` names the first node it cannot split."""
    if ranks < 1:
        raise ParallelError(f"ulysses: ranks must be >= 1, got {ranks}")
    shardings = {n: _input_sharding(program, n, s) for n, s in seq_inputs.items()}
    cuts: list[str] = []
    for _ in range(1 + sum(program.types[n].shape[s.axis] for n, s in shardings.items())):
        try:
            return _split(program, ranks, shardings, cuts)
        except _NeedCut as need:
            shardings[need.name] = cut_at(shardings[need.name], need.row)
            node = f"node {need.node.id} ({need.node.op})"
            cuts.append(f"input {need.name} cut at row {need.row}: {node} takes its rows apart there")
    raise AssertionError("unreachable: every cut splits a block")


def _split(program: Program, ranks: int, shardings: dict[str, Sharding], cuts: Sequence[str]) -> ParallelPlan:
    ctx = PassContext(PASS_NAME)
    ctx.applied(f"sequence parallel over {ranks} ranks (Ulysses: all_to_all over heads around each sdpa)")
    for name, s in shardings.items():
        ctx.applied(f"input {name} split on {s.describe(ranks)}", value=name)
    for why in cuts:
        ctx.applied(why)
    programs: list[Program] = []
    outputs: dict[str, Sharding | None] = {}
    for rank in range(ranks):
        sp = _Splitter(program, ranks, rank, ctx if rank == 0 else None)
        for v in program.inputs:
            var = sp.b.input(v.name, v.type.shape, v.type.dtype)
            split = shardings.get(v.name)
            sp.env[v.name] = (var, None) if split is None else (sp.localize(var, split.axis, split), split)
        for p in program.params:
            sp.env[p.name] = (sp.b.param(p.name, p.type.shape, p.type.dtype), None)
        for node in program.nodes:
            sp.node(node)
        sp.current = None
        sp.b.output(*(sp.env[o][0] for o in program.outputs))
        built = evolve(sp.b.build(verify=False), provenance=sp.prov)
        verify_program(built, table=parallel_table())
        programs.append(built)
        outputs = {o: sp.env[o][1] for o in program.outputs}
    for name, out in outputs.items():
        if out is not None:
            ctx.applied(f"output {name} stays split ({out.describe(ranks)}); gathered by the runner", value=name)
    return ParallelPlan(ranks, tuple(programs), shardings, outputs, tuple(ctx.decisions))
