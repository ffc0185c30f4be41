"""The format passes (optimizer stage, after the fusions): rewrite a program's linears into one physical
format's quantized ops (`dif.ops.quant`). Not in the default pipeline: the format search
(`dif.passes.formats_search`, `dif opt --formats`) measures them, and a run asks for one by name
(`DIF_PASSES=default,quantize_fp8`).

- `quantize_fp8` / `quantize_int8` (W8A8): a `norm_modulate` or `glu` whose every user is a linear over a
  parameter weight becomes `norm_modulate_quant` / `glu_quant` (the producer emits the GEMM input quantized,
  one scale per row), and each of those linears `scaled_linear` over the weight quantized per output channel.
  A linear whose input comes from anything else stays as it is, with the reason recorded: quantizing its input
  would be a separate pass over the activations, which costs more than the fp8 GEMM saves.
- `quantize_int4` (weight-only): every linear over a parameter weight whose inputs divide into groups of 128
  (else 64) becomes `int4_linear`.

Weights are renamed `W@FORMAT.q` / `W@FORMAT.scale` and derived at load (`dif.weights.quantized`). Each
candidate linear gets a decision; a target that does not implement the format (`format:<name>` in its
capabilities) gets one skipped decision and the program unchanged.
"""

from __future__ import annotations

from attrs import evolve

from dif.dtypes import DType
from dif.ir.program import Node, Program, Value
from dif.ir.types import TensorType
from dif.passes.context import PassContext
from dif.weights.quantized import GROUP_FORMAT, ROW_FORMATS, derived_name

W8A8_PRODUCERS = ("norm_modulate", "glu")
"""Ops with a quantizing variant (`<op>_quant`) that the W8A8 passes put in their place."""
GROUPS = (128, 64)  # int4 group sizes, preferred first


def _implemented(ctx: PassContext, fmt: str) -> bool:
    target = ctx.target
    if target is None:
        return True
    if f"format:{fmt}" not in target.capabilities:
        ctx.skipped(f"target '{target.backend}' does not implement {fmt} (no 'format:{fmt}' capability)")
        return False
    # the storage dtypes must exist there (an fp8 kernel on a GPU without fp8 conversions would trap); the
    # matrix units are the format search's business (a backend may emulate the format without them)
    from dif.formats import FORMATS

    lacking = [d for d in FORMATS.get(fmt).requires_dtypes if d not in target.dtypes]
    if lacking:
        ctx.skipped(f"target '{target.backend}' lists no dtype {', '.join(lacking)}, which {fmt} stores")
        return False
    return True


def _param_weight(program: Program, node: Node) -> str | None:
    """The weight operand of linear `node` when it is a 2-D parameter, else None."""
    params = {p.name for p in program.params}
    w = node.operands[1]
    return w if w in params and program.types[w].rank == 2 else None


def _linears(program: Program) -> list[Node]:
    return [n for n in program.nodes if n.op == "linear"]


class _Rewrite:
    """Node replacements (by id, each a list of nodes) and new parameters, applied in one pass."""

    def __init__(self, program: Program) -> None:
        self.program = program
        self.replace: dict[int, list[Node]] = {}
        self.new_params: dict[str, TensorType] = {}
        self.retired: set[str] = set()

    def param(self, name: str, t: TensorType) -> str:
        self.new_params[name] = t
        return name

    def apply(self, pass_name: str) -> Program:
        if not self.replace:
            return self.program
        nodes: list[Node] = []
        provenance = {}
        for node in self.program.nodes:
            for new in self.replace.get(node.id, [node]):
                new_id = len(nodes)
                nodes.append(evolve(new, id=new_id))
                old = self.program.provenance.get(node.id)
                if old is not None:
                    provenance[new_id] = evolve(old, transforms=(*old.transforms, pass_name))
        used = {o for n in nodes for o in n.operands}
        params = [p for p in self.program.params if p.name in used or p.name not in self.retired]
        params += [Value(name, t) for name, t in self.new_params.items()]
        return Program(
            self.program.name,
            self.program.inputs,
            params,
            nodes,
            self.program.outputs,
            provenance,
            dict(self.program.meta),
        )


def quantize_w8a8(program: Program, ctx: PassContext, fmt: str) -> Program:
    """`program` with its eligible linears in W8A8 format `fmt` ("fp8-e4m3" or "int8"), see the module doc."""
    if not _implemented(ctx, fmt):
        return program
    qdtype = ROW_FORMATS[fmt]
    rw = _Rewrite(program)
    by_producer: dict[int, list[Node]] = {}
    for node in _linears(program):
        value = node.results[0].name
        producer = program.producers.get(node.operands[0])
        w = _param_weight(program, node)
        if w is None:
            ctx.skipped("the weight is not a 2-D parameter", (node.id,), value)
        elif producer is None or producer.op not in W8A8_PRODUCERS:
            origin = "a program input" if producer is None else producer.op
            ctx.skipped(
                f"its input comes from {origin}, which has no quantizing variant; a separate quantization pass "
                "over the activations costs more than the W8A8 GEMM saves",
                (node.id,),
                value,
            )
        else:
            by_producer.setdefault(producer.id, []).append(node)
    for pid, users in by_producer.items():
        producer = program.node_by_id[pid]
        y = producer.results[0].name
        all_users = program.users.get(y, ())
        problem = None
        if y in program.outputs:
            problem = f"{y} is a program output"
        elif len(all_users) != len(users) or any(u.operands.count(y) != 1 for u in all_users):
            others = sorted({u.op for u in all_users if u not in users})
            problem = f"{y} is also read by {', '.join(others) or 'a node twice'}, which needs it unquantized"
        if problem is None and not ctx.supports(f"{producer.op}_quant"):
            problem = ctx.lacks(f"{producer.op}_quant")
        if problem is None and not ctx.supports("scaled_linear"):
            problem = ctx.lacks("scaled_linear")
        if problem is not None:
            for u in users:
                ctx.skipped(problem, (pid, u.id), u.results[0].name)
            continue
        yt = program.types[y]
        q = Value(f"{y}@{fmt}.q", TensorType(yt.shape, DType(qdtype)))
        s = Value(f"{y}@{fmt}.scale", TensorType((*yt.shape[:-1], 1), DType.F32))
        attrs = {**producer.attrs, "dtype": qdtype}
        rw.replace[pid] = [Node(pid, f"{producer.op}_quant", producer.operands, (q, s), attrs)]
        for u in users:
            w = u.operands[1]
            wt = program.types[w]
            wq = rw.param(derived_name(w, fmt, "q"), TensorType(wt.shape, DType(qdtype)))
            ws = rw.param(derived_name(w, fmt, "scale"), TensorType((wt.shape[0],), DType.F32))
            rw.retired.add(w)
            out = u.results[0]
            operands = (q.name, s.name, wq, ws, *u.operands[2:])
            rw.replace[u.id] = [Node(u.id, "scaled_linear", operands, (out,), {"out_dtype": out.type.dtype.value})]
            ctx.applied(f"{producer.op} + linear -> {producer.op}_quant + scaled_linear ({fmt})", (pid, u.id), out.name)
    return rw.apply(ctx.pass_name)


def quantize_int4(program: Program, *, ctx: PassContext) -> Program:
    """`program` with every linear over a 2-D parameter weight as `int4_linear` (weight-only int4 groups of
    128 inputs, else 64); a linear whose inputs divide by neither stays, with the reason recorded."""
    if not _implemented(ctx, GROUP_FORMAT):
        return program
    rw = _Rewrite(program)
    for node in _linears(program):
        value = node.results[0].name
        w = _param_weight(program, node)
        if w is None:
            ctx.skipped("the weight is not a 2-D parameter", (node.id,), value)
            continue
        n, k = program.types[w].shape
        group = next((g for g in GROUPS if k % g == 0), 0)
        if not group:
            ctx.skipped(
                f"{k} input features do not divide into groups of {' or '.join(map(str, GROUPS))}", (node.id,), value
            )
            continue
        if not ctx.supports("int4_linear"):
            ctx.skipped(ctx.lacks("int4_linear"), (node.id,), value)
            continue
        wq = rw.param(derived_name(w, GROUP_FORMAT, "q", group), TensorType((n, k // 2), DType.U8))
        ws = rw.param(derived_name(w, GROUP_FORMAT, "scale", group), TensorType((n, k // group), DType.F16))
        rw.retired.add(w)
        operands = (node.operands[0], wq, ws, *node.operands[2:])
        rw.replace[node.id] = [Node(node.id, "int4_linear", operands, node.results, {"group_size": group})]
        ctx.applied(f"linear -> int4_linear (groups of {group})", (node.id,), value)
    return rw.apply(ctx.pass_name)


def quantize_fp8(program: Program, *, ctx: PassContext) -> Program:
    """The fp8-e4m3 W8A8 format pass (`quantize_w8a8`)."""
    return quantize_w8a8(program, ctx, "fp8-e4m3")


def quantize_int8(program: Program, *, ctx: PassContext) -> Program:
    """The int8 W8A8 format pass (`quantize_w8a8`)."""
    return quantize_w8a8(program, ctx, "int8")


FORMAT_PASSES = {"fp8-e4m3": "quantize_fp8", "int8": "quantize_int8", "int4-group": "quantize_int4"}
"""Physical format -> the pass that rewrites a program into it."""
