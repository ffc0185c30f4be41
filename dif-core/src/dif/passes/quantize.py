"""The format passes (optimizer stage, after the fusions): rewrite a program's linears into one physical
format's quantized ops (`dif.ops.quant`). Not in the default pipeline: the format search
(`dif.passes.formats_search`, `dif opt --formats`) measures them, and a run asks for one by name
(`DIF_PASSES=default,quantize_fp8`).

- `quantize_fp8` / `quantize_int8` (W8A8): a `norm_modulate` or `glu` whose every user is a linear over a
  parameter weight becomes `norm_modulate_quant` / `glu_quant` (the producer emits the GEMM input quantized,
  one scale per row), and each of those linears `scaled_linear` over the weight quantized per output channel.
  A linear whose input comes from anything else (an attention output, a gate) gets a `quantize_rows` of its
  input when it has at least `ROWS_PASS_MIN_OUT` output features, shared by every such linear reading the same
  input: that pass reads the input once (2 bytes per element in, 1 out), while the GEMM saves about
  2 x N x (1/bf16 - 1/fp8 rate) per input element, some five times more at N = 4096 on Hopper. When that input
  is `concat(prefix, glu(...))` (a parallel block's output projection: attention beside the MLP), one
  `concat_glu_quant` replaces the concat and the GLU instead, so the GLU's value is never written unquantized;
  when it is `act_mul(g, u)` or `mul(act(g), u)`, act a silu or sigmoid read by the mul alone (Krea 2's SwiGLU
  from two GEMMs, its attention output times a sigmoid gate), `act_mul_quant(g, u)` replaces them; when it is
  `rms_norm_modulate(x, w, scale, shift)` or `modulate(rms_norm(x, w), scale, shift)` (Krea 2's adaptive norms,
  whose RMS norm has a weight), `rms_norm_modulate_quant` replaces them.
  Narrower linears stay as they are, with the reason recorded; so do a linear whose result is a program output
  (nothing after it dilutes its rounding) and one of fewer than `MIN_ROWS` input rows. A scaled_linear whose
  product only a `gated_residual(x, gate, ·)` reads (a DiT block's attention and MLP outputs) and the residual
  become one `scaled_linear_gated_residual`, the gate and x in the GEMM's epilogue.
- `quantize_int4` (weight-only): every linear over a parameter weight whose inputs divide into groups of 128
  (else 64) becomes `int4_linear`.
- `quantize_fp8_attention`: every f16 / bf16 `sdpa` becomes `sdpa_fp8` (both products on fp8 matrix units), a
  candidate of its own (`fp8-e4m3+attention` in the format search, `candidate_passes`).

A `linear_add` (`fuse_linear_residual`, earlier in the default pipeline) is split back into its linear and add
first, so its linear is a candidate like any other; the ones that stay linears are fused again afterwards.

A linear of a block `DIF_FORMAT_KEEP` names stays as it is (`held_blocks`; the format search's per-block
candidates), and a pipeline runs the format passes only over the programs of the stages `DIF_FORMAT_STAGES`
names (`scoped_to_stage`; default: the denoiser).

Weights are renamed `W@FORMAT.q` / `W@FORMAT.scale` and derived at load (`dif.weights.quantized`). Each
candidate linear gets a decision; a target that does not implement the format (`format:<name>` in its
capabilities) gets one skipped decision and the program unchanged.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from fnmatch import fnmatchcase

from attrs import evolve

from dif.dtypes import DType
from dif.ir.program import Node, Program, Value
from dif.ir.types import TensorType
from dif.ops.fused import ACT_MUL_ACTS
from dif.ops.quant import MAX_SHARED_NORMS
from dif.passes.context import PassContext
from dif.passes.rewrite import Fusion, apply_fusions, fused_type_problem, producer_of, sole_use
from dif.plan.plan import Decision
from dif.weights.quantized import GROUP_FORMAT, ROW_FORMATS, derived_name

W8A8_PRODUCERS = ("norm_modulate", "glu")
"""Ops with a quantizing variant (`<op>_quant`) that the W8A8 passes put in their place."""
MIN_ROWS = 16
"""Fewer input rows than this (the timestep / guidance projections of a DiT: one row per image) stay in the
run dtype: such a GEMM is bound by reading its weights, so W8A8 saves little, and its result (AdaLN scales and
shifts) multiplies every token, so its rounding error reaches all of them."""
ROWS_PASS_MIN_OUT = 1024
"""The fewest output features for which a linear's input is quantized in a pass of its own (`quantize_rows`):
per input element the pass moves ~3 bytes and the fp8 GEMM saves the difference between 2 x N flops at the bf16
and at the fp8 rate. On an H200 (3.5 TB/s, bf16 ~750 vs fp8 ~1,300 TFLOP/s) they break even near N = 760: at
1024 the GEMM gains more than the pass costs, and the DiTs' wide projections (3,072 outputs and more) gain 4-5
times it."""
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


def held_blocks() -> tuple[str, ...]:
    """The block patterns whose linears the format passes leave in the run dtype (`DIF_FORMAT_KEEP`)."""
    from dif.env import DIF_FORMAT_KEEP

    return tuple(DIF_FORMAT_KEEP.get_list() or ())


def _held(program: Program, node: Node, patterns: Sequence[str]) -> str | None:
    """Why `node` stays as it is when its provenance block matches one of `patterns`; None otherwise."""
    prov = program.provenance.get(node.id)
    block = prov.block if prov is not None else ""
    if block and any(fnmatchcase(block, p) for p in patterns):
        return f"block {block} is held in the run dtype (DIF_FORMAT_KEEP)"
    return None


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


LINEAR_ADD = "linear_add"


def _split_linear_adds(program: Program) -> tuple[Program, dict[str, str]]:
    """`program` with every `linear_add(x, w, r, bias?)` as `linear(x, w, bias?)` -> `NAME@linear`, then
    `add(r, NAME@linear)` -> NAME (provenance kept), and {NAME: NAME@linear} to fuse back the ones that stay."""
    if not any(n.op == LINEAR_ADD for n in program.nodes):
        return program, {}
    nodes: list[Node] = []
    provenance = {}
    split: dict[str, str] = {}
    for node in program.nodes:
        new = [node]
        if node.op == LINEAR_ADD:
            x, w, r, *bias = node.operands
            out = node.results[0]
            mid = Value(f"{out.name}@linear", out.type)
            split[out.name] = mid.name
            new = [Node(0, "linear", (x, w, *bias), (mid,)), Node(0, "add", (r, mid.name), (out,))]
        for n in new:
            if node.id in program.provenance:
                provenance[len(nodes)] = program.provenance[node.id]
            nodes.append(evolve(n, id=len(nodes)))
    meta = dict(program.meta)
    return Program(program.name, program.inputs, program.params, nodes, program.outputs, provenance, meta), split


def _fuse_back(program: Program, split: dict[str, str], pass_name: str) -> Program:
    """The split `linear_add`s whose linear the format pass left a linear, fused again."""
    fusions = []
    for out, mid in split.items():
        lin, add = program.producers[mid], program.producers[out]
        if lin.op == "linear":
            fusions.append(Fusion(add, (lin,), LINEAR_ADD, (*lin.operands[:2], add.operands[0], *lin.operands[2:])))
    return apply_fusions(program, fusions, pass_name)


def quantize_w8a8(program: Program, ctx: PassContext, fmt: str) -> Program:
    """`program` with its eligible linears in W8A8 format `fmt` ("fp8-e4m3" or "int8"), see the module doc."""
    if not _implemented(ctx, fmt):
        return program
    program, split = _split_linear_adds(program)
    qdtype = ROW_FORMATS[fmt]
    rw = _Rewrite(program)
    by_producer: dict[int, list[Node]] = {}
    by_input: dict[str, list[Node]] = {}  # linears whose input gets a `quantize_rows` of its own
    held = held_blocks()
    for node in _linears(program):
        value = node.results[0].name
        producer = program.producers.get(node.operands[0])
        w = _param_weight(program, node)
        xt = program.types[node.operands[0]]
        rows = xt.numel // max(1, xt.shape[-1])
        if w is None:
            ctx.skipped("the weight is not a 2-D parameter", (node.id,), value)
        elif (why := _held(program, node, held)) is not None:
            ctx.skipped(why, (node.id,), value)
        elif value in program.outputs:
            ctx.skipped(
                f"{value} is a program output: its rounding would be the output's, undiluted", (node.id,), value
            )
        elif rows < MIN_ROWS:
            ctx.skipped(
                f"{rows} input rows: a matrix-vector product, bound by reading the weight, and its result "
                "conditions every token (AdaLN)",
                (node.id,),
                value,
            )
        elif producer is None or producer.op not in W8A8_PRODUCERS:
            by_input.setdefault(node.operands[0], []).append(node)
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
        q, s = _quantized_pair(program, y, fmt)
        rw.replace[pid] = [
            Node(pid, f"{producer.op}_quant", producer.operands, (q, s), {**producer.attrs, "dtype": qdtype})
        ]
        for u in users:
            rw.replace[u.id] = [_scaled_linear(program, rw, u, q.name, s.name, fmt)]
            ctx.applied(
                f"{producer.op} + linear -> {producer.op}_quant + scaled_linear ({fmt})", (pid, u.id), u.results[0].name
            )
    for x, users in by_input.items():
        origin = "a program input" if x not in program.producers else program.producers[x].op
        wide = [u for u in users if program.types[u.operands[1]].shape[0] >= ROWS_PASS_MIN_OUT]
        problem = None if ctx.supports("quantize_rows") else ctx.lacks("quantize_rows")
        problem = problem or (None if ctx.supports("scaled_linear") else ctx.lacks("scaled_linear"))
        for u in users:
            if problem is not None or u not in wide:
                why = problem or (
                    f"its input comes from {origin}, which has no quantizing variant, and its "
                    f"{program.types[u.operands[1]].shape[0]} outputs (< {ROWS_PASS_MIN_OUT}) would not pay for a "
                    "quantization pass over the activations"
                )
                ctx.skipped(why, (u.id,), u.results[0].name)
        if problem is not None or not wide:
            continue
        q, s = _quantized_pair(program, x, fmt)
        joined = _concat_of_glu(program, ctx, x, wide)
        gated = None if joined is not None else _act_of_mul(program, ctx, x, wide)
        normed = None if joined is not None or gated is not None else _rms_norm_of_modulate(program, ctx, x, wide)
        if joined is not None:  # the concat and its GLU become the quantizing producer
            concat, glu = joined
            attrs = {"act": glu.attrs["act"], "gated_half": glu.attrs["gated_half"], "dtype": qdtype}
            operands = (concat.operands[0], glu.operands[0])
            rw.replace[glu.id] = []
            rw.replace[concat.id] = [Node(concat.id, "concat_glu_quant", operands, (q, s), attrs)]
            made = "concat + glu + linear -> concat_glu_quant + scaled_linear"
        elif gated is not None:  # the mul and its gate's activation (or their act_mul) become the quantizing producer
            mul, absorbed, operands, act = gated
            for act_node in absorbed:
                rw.replace[act_node.id] = []
            rw.replace[mul.id] = [Node(mul.id, "act_mul_quant", operands, (q, s), {"act": act, "dtype": qdtype})]
            made = f"{act} + mul + linear -> act_mul_quant + scaled_linear"
        elif normed is not None:  # the weighted RMS norm and its modulation become the quantizing producer
            *absorbed, place = normed
            if absorbed:  # modulate(rms_norm(x0, w), scale, shift)
                operands, norm_attrs = (*absorbed[0].operands, *place.operands[1:]), absorbed[0].attrs
                rw.replace[absorbed[0].id] = []
            else:  # rms_norm_modulate(x0, w, scale, shift)
                operands, norm_attrs = place.operands, place.attrs
            attrs = {"eps": norm_attrs["eps"], "offset": norm_attrs["offset"], "dtype": qdtype}
            rw.replace[place.id] = [Node(place.id, "rms_norm_modulate_quant", operands, (q, s), attrs)]
            made = "rms_norm + modulate + linear -> rms_norm_modulate_quant + scaled_linear"
        else:
            first = wide[0]  # nodes are in topological order: the first reader comes after x and before the others
            rw.replace[first.id] = [Node(first.id, "quantize_rows", (x,), (q, s), {"dtype": qdtype})]
            made = f"{origin} -> quantize_rows + scaled_linear"
        for u in wide:
            rw.replace[u.id] = [*rw.replace.get(u.id, []), _scaled_linear(program, rw, u, q.name, s.name, fmt)]
            ctx.applied(f"{made} ({fmt})", (u.id,), u.results[0].name)
    return _gated_residuals_into_gemms(_fuse_back(rw.apply(ctx.pass_name), split, ctx.pass_name), ctx)


def _gated_residuals_into_gemms(program: Program, ctx: PassContext) -> Program:
    """Every `gated_residual(x, gate, scaled_linear(..))` whose product has no other reader ->
    `scaled_linear_gated_residual(x, gate, ..)`: the gate and the residual go into the GEMM's epilogue, so its
    product is neither written nor read again (a DiT block's attention and MLP outputs)."""
    fused = "scaled_linear_gated_residual"
    fusions = []
    for node in program.nodes:
        linear = producer_of(program, node.operands[2], ("scaled_linear",)) if node.op == "gated_residual" else None
        if linear is None:
            continue
        fusion = Fusion(node, (linear,), fused, (*node.operands[:2], *linear.operands))
        problem = sole_use(program, linear.results[0].name, node) or fused_type_problem(program, fusion)
        problem = problem or (None if ctx.supports(fused) else ctx.lacks(fused))
        if problem is None:
            fusions.append(fusion)
            ctx.applied(f"scaled_linear + gated_residual -> {fused}", (linear.id, node.id), node.results[0].name)
        else:
            ctx.skipped(problem, (linear.id, node.id), node.results[0].name)
    return apply_fusions(program, fusions, ctx.pass_name)


def _sole_producer(program: Program, x: str, readers: list[Node], op: str) -> Node | None:
    """`x`'s producer when it is an `op`, `x` is no program output and `readers` alone read it: the producer a
    quantizing op may replace."""
    node = program.producers.get(x)
    if node is None or node.op != op or x in program.outputs:
        return None
    return node if {u.id for u in program.users.get(x, ())} == {u.id for u in readers} else None


def _read_by_alone(program: Program, value: str, node: Node) -> bool:
    """`value` is no program output and `node` alone reads it: fused into `node`, it need not be written."""
    return value not in program.outputs and [u.id for u in program.users.get(value, ())] == [node.id]


def _concat_of_glu(program: Program, ctx: PassContext, x: str, readers: list[Node]) -> tuple[Node, Node] | None:
    """(concat, glu) when `x` = concat(prefix, glu(...)) along the last axis, read by `readers` alone, with the
    GLU read by the concat alone (a parallel DiT block's output projection input): one `concat_glu_quant` then
    makes the quantized input, and the GLU's value is never written unquantized. None otherwise."""
    concat = _sole_producer(program, x, readers, "concat")
    if concat is None or len(concat.operands) != 2 or concat.operands[0] == concat.operands[1]:
        return None
    if int(concat.attrs["axis"]) % program.types[x].rank != program.types[x].rank - 1:
        return None
    glu = program.producers.get(concat.operands[1])
    if glu is None or glu.op != "glu" or not _read_by_alone(program, glu.results[0].name, concat):
        return None
    return (concat, glu) if ctx.supports("concat_glu_quant") else None


def _act_of_mul(
    program: Program, ctx: PassContext, x: str, readers: list[Node]
) -> tuple[Node, tuple[Node, ...], tuple[str, str], str] | None:
    """(the node making `x`, the activation node it absorbs, (g, u), act) when `x` = act_mul(g, u; act)
    (`fuse_act_mul`), or mul(act(g), u) in either operand order with act one of `ACT_MUL_ACTS` read by the mul
    alone and g, u of one type, and `readers` alone read `x` (a SwiGLU or an attention gate computed apart from
    its value): one `act_mul_quant(g, u)` then makes the quantized input, the product never written unquantized.
    None otherwise."""
    if not ctx.supports("act_mul_quant"):
        return None
    fused = _sole_producer(program, x, readers, "act_mul")
    if fused is not None:
        return fused, (), (fused.operands[0], fused.operands[1]), str(fused.attrs["act"])
    mul = _sole_producer(program, x, readers, "mul")
    if mul is None or mul.operands[0] == mul.operands[1]:
        return None
    for side in (0, 1):
        act, u = program.producers.get(mul.operands[side]), mul.operands[1 - side]
        if act is None or act.op not in ACT_MUL_ACTS or not _read_by_alone(program, act.results[0].name, mul):
            continue
        if program.types[act.operands[0]] == program.types[u] == program.types[x]:
            return mul, (act,), (act.operands[0], u), act.op
    return None


def _rms_norm_of_modulate(program: Program, ctx: PassContext, x: str, readers: list[Node]) -> tuple[Node, ...] | None:
    """The nodes making `x` when it is rms_norm_modulate(x0, w, scale, shift) (`fuse_norm_modulate`), or
    modulate(rms_norm(x0, w), scale, shift) with the norm weighted, in torch.nn.RMSNorm's order
    (`round_before_weight` off) and read by the modulate alone; `x` read by `readers` alone (Krea 2's adaptive
    norms): one `rms_norm_modulate_quant` then makes the quantized input. Last the node whose place it takes
    (the fused node, or the modulate after its norm). None otherwise."""
    if not ctx.supports("rms_norm_modulate_quant"):
        return None
    fused = _sole_producer(program, x, readers, "rms_norm_modulate")
    if fused is not None:
        return (fused,)
    modulate = _sole_producer(program, x, readers, "modulate")
    norm = None if modulate is None else program.producers.get(modulate.operands[0])
    if norm is None or norm.op != "rms_norm" or len(norm.operands) != 2 or norm.attrs["round_before_weight"]:
        return None
    n = norm.results[0].name
    if not _read_by_alone(program, n, modulate) or program.types[n] != program.types[x]:  # not broadcast up
        return None
    return norm, modulate


def _quantized_pair(program: Program, y: str, fmt: str) -> tuple[Value, Value]:
    """The quantized form of activation `y`: values in the format's dtype, one f32 scale per row."""
    yt = program.types[y]
    q = Value(f"{y}@{fmt}.q", TensorType(yt.shape, DType(ROW_FORMATS[fmt])))
    return q, Value(f"{y}@{fmt}.scale", TensorType((*yt.shape[:-1], 1), DType.F32))


def _scaled_linear(program: Program, rw: _Rewrite, linear: Node, q: str, s: str, fmt: str) -> Node:
    """`linear` as a `scaled_linear` over the quantized input (q, s) and its weight's derived parameters."""
    w = linear.operands[1]
    wt = program.types[w]
    wq = rw.param(derived_name(w, fmt, "q"), TensorType(wt.shape, DType(ROW_FORMATS[fmt])))
    ws = rw.param(derived_name(w, fmt, "scale"), TensorType((wt.shape[0],), DType.F32))
    rw.retired.add(w)
    out = linear.results[0]
    operands = (q, s, wq, ws, *linear.operands[2:])
    return Node(linear.id, "scaled_linear", operands, (out,), {"out_dtype": out.type.dtype.value})


def quantize_int4(program: Program, *, ctx: PassContext) -> Program:
    """`program` with every linear over a 2-D parameter weight as `int4_linear` (weight-only int4 groups of
    128 inputs, else 64); a linear whose inputs divide by neither stays, with the reason recorded."""
    if not _implemented(ctx, GROUP_FORMAT):
        return program

    def group_of(w: str, k: int) -> tuple[int, str]:
        group = next((g for g in GROUPS if k % g == 0), 0)
        sizes = " or ".join(map(str, GROUPS))
        return group, "" if group else f"{k} input features do not divide into groups of {sizes}"

    return _int4_linears(program, ctx, group_of, held_blocks())


def keep_stored_int4(program: Program, stored: set[str], group: int, *, ctx: PassContext) -> Program:
    """`program` with each linear over a parameter of `stored` (weights a checkpoint keeps as 4-bit groups of
    `group`: GGUF Q4_0 blocks, `dif.weights.gguf_int4`) as `int4_linear`, whose derived weights are then read
    as stored; other linears untouched."""
    return _int4_linears(program, ctx, lambda w, k: (group, "") if w in stored else (0, None), ())


GroupOf = Callable[[str, int], tuple[int, str | None]]
"""(weight name, input features) -> (group size, 0 to leave the linear; the reason, None to record none)."""


def _int4_linears(program: Program, ctx: PassContext, group_of: GroupOf, held: Sequence[str]) -> Program:
    """Each linear over a 2-D parameter weight `w` [n, k] as `int4_linear` in the groups `group_of(w, k)` says,
    but those of the blocks `held` matches."""
    program, split = _split_linear_adds(program)
    rw = _Rewrite(program)
    for node in _linears(program):
        value = node.results[0].name
        w = _param_weight(program, node)
        if w is None:
            ctx.skipped("the weight is not a 2-D parameter", (node.id,), value)
            continue
        if (why := _held(program, node, held)) is not None:
            ctx.skipped(why, (node.id,), value)
            continue
        n, k = program.types[w].shape
        group, reason = group_of(w, k)
        if not group:
            if reason is not None:
                ctx.skipped(reason, (node.id,), value)
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
    return _fuse_back(rw.apply(ctx.pass_name), split, ctx.pass_name)


def quantize_fp8(program: Program, *, ctx: PassContext) -> Program:
    """The fp8-e4m3 W8A8 format pass (`quantize_w8a8`)."""
    return quantize_w8a8(program, ctx, "fp8-e4m3")


def quantize_int8(program: Program, *, ctx: PassContext) -> Program:
    """The int8 W8A8 format pass (`quantize_w8a8`)."""
    return quantize_w8a8(program, ctx, "int8")


def quantize_fp8_attention(program: Program, *, ctx: PassContext) -> Program:
    """`program` with each `sdpa` over f16 / bf16 operands as `sdpa_fp8` (dif.ops.attention): both attention
    products on fp8 matrix units, q, k, v and the softmax numerators rounded to e4m3 with one scale per tensor.
    A separate candidate from `quantize_fp8`, which converts the linears: attention's error is judged apart.
    Where q and k are each made by `rms_norm_rope` (or a concat of them along the sequence, one per stream) and
    read by the attention alone, those become `rms_norm_rope_quant`, whose scale is bounded by the norm weights
    before anything is computed, and the attention `sdpa_fp8_qk`: no pass over q and k finds their amax or
    writes their e4m3 copies. An attention of a block `DIF_FORMAT_KEEP` names stays as it is, with the reason
    recorded."""
    if not _implemented(ctx, "fp8-e4m3"):
        return program
    rw = _Rewrite(program)
    held = held_blocks()
    for node in program.nodes:
        if node.op != "sdpa":
            continue
        value = node.results[0].name
        dtype = program.types[node.operands[0]].dtype
        if dtype not in (DType.BF16, DType.F16):
            ctx.skipped(f"its operands are {dtype.value}: fp8 attention quantizes f16 / bf16 ones", (node.id,), value)
        elif (why := _held(program, node, held)) is not None:
            ctx.skipped(why, (node.id,), value)
        elif not ctx.supports("sdpa_fp8"):
            ctx.skipped(ctx.lacks("sdpa_fp8"), (node.id,), value)
        elif (normed := _normed_qk(program, ctx, node)) is not None:
            (q8, qs), (k8, ks) = (_quantized_norms(program, rw, parts, node.operands[i]) for i, parts in normed)
            operands = (q8, qs, k8, ks, *node.operands[2:])
            rw.replace[node.id] = [evolve(node, op="sdpa_fp8_qk", operands=operands)]
            ids = (*(p.id for _, parts in normed for p in parts), node.id)
            ctx.applied("rms_norm_rope + sdpa -> rms_norm_rope_quant + sdpa_fp8_qk (fp8-e4m3 attention, q and k "
                        "quantized by their norms at scales the norm weights bound)", ids, value)  # fmt: skip
        else:
            rw.replace[node.id] = [evolve(node, op="sdpa_fp8")]
            ctx.applied("sdpa -> sdpa_fp8 (fp8-e4m3 attention, per-tensor scales)", (node.id,), value)
    return rw.apply(ctx.pass_name)


def _normed_qk(program: Program, ctx: PassContext, sdpa: Node) -> tuple[tuple[int, list[Node]], ...] | None:
    """((0, q's rms_norm_ropes), (1, k's)) when each of q and k is made by `rms_norm_rope` nodes alone (one, or
    a concat of them along the sequence) that agree on the weights' type and offset, and the attention alone
    reads them; None otherwise, or where the target lacks the quantizing forms."""
    if not (ctx.supports("rms_norm_rope_quant") and ctx.supports("sdpa_fp8_qk")):
        return None
    found = []
    for i in (0, 1):
        x = sdpa.operands[i]
        if not _read_by_alone(program, x, sdpa) or sdpa.operands.count(x) != 1:
            return None
        node = program.producers.get(x)
        parts = [node] if node is not None and node.op == "rms_norm_rope" else None
        if node is not None and node.op == "concat" and int(node.attrs["axis"]) % 4 == 1:
            producers = [program.producers.get(o) for o in node.operands]
            normed = [p for p in producers if p is not None and p.op == "rms_norm_rope"]
            if len(normed) == len(set(node.operands)) == len(node.operands) and all(
                _read_by_alone(program, p.results[0].name, node) for p in normed
            ):
                parts = normed
        if not parts or len(parts) > MAX_SHARED_NORMS:
            return None
        if len({(program.types[p.operands[1]], float(p.attrs["offset"])) for p in parts}) != 1:
            return None
        found.append((i, parts))
    return tuple(found)


def _quantized_norms(program: Program, rw: _Rewrite, parts: list[Node], x: str) -> tuple[str, str]:
    """(values, scale) of sdpa operand `x` made by `parts`, each now an `rms_norm_rope_quant` bounded over every
    part's weight (the tensor has one scale); a concat of them joins their e4m3 values."""
    weights = [p.operands[1] for p in parts]
    made = []
    for p in parts:
        q, s = _quantized_pair(program, p.results[0].name, "fp8-e4m3")
        s = Value(s.name, TensorType((1,), DType.F32))  # one scale for the tensor
        bound = tuple(w for w in weights if w != p.operands[1])
        attrs = {**p.attrs, "dtype": ROW_FORMATS["fp8-e4m3"]}
        rw.replace[p.id] = [Node(p.id, "rms_norm_rope_quant", (*p.operands, *bound), (q, s), attrs)]
        made.append((q, s))
    if len(parts) == 1:
        return made[0][0].name, made[0][1].name
    concat = program.producers[x]
    q = Value(f"{x}@fp8-e4m3.q", TensorType(program.types[x].shape, DType(ROW_FORMATS["fp8-e4m3"])))
    rw.replace[concat.id] = [evolve(concat, operands=tuple(m[0].name for m in made), results=(q,))]
    return q.name, made[0][1].name  # every part computed the same scale: the first one's serves


FORMAT_PASSES = {"fp8-e4m3": "quantize_fp8", "int8": "quantize_int8", "int4-group": "quantize_int4"}
"""Physical format -> the pass that rewrites a program into it."""
ATTENTION_PASS = "quantize_fp8_attention"
"""The pass that puts attention on fp8 matrix units (`quantize_fp8_attention`), a candidate of its own."""
PASS_NAMES = (*FORMAT_PASSES.values(), ATTENTION_PASS)
"""Every format pass: none is in the default pipeline, and `DIF_FORMAT_STAGES` scopes them all."""
WITH_ATTENTION = "+attention"
"""The suffix of a format candidate that puts attention on fp8 matrix units as well: `fp8-e4m3+attention`."""


def split_candidate(spec: str) -> tuple[str, bool]:
    """(format, with fp8 attention) of a format search candidate: a format name, or `fp8-e4m3+attention`. Another
    format with the suffix is a `UsageError`: fp8 attention goes with the fp8 linears."""
    from dif.errors import UsageError

    fmt, attention = (spec[: -len(WITH_ATTENTION)], True) if spec.endswith(WITH_ATTENTION) else (spec, False)
    if attention and fmt != "fp8-e4m3":
        raise UsageError(f"format {spec}: {WITH_ATTENTION} goes with fp8-e4m3 only", hint="e.g. fp8-e4m3+attention")
    return fmt, attention


def candidate_passes(spec: str) -> tuple[str, ...]:
    """The format passes a candidate (`split_candidate`) appends to the pipeline."""
    fmt, attention = split_candidate(spec)
    return (FORMAT_PASSES[fmt], *((ATTENTION_PASS,) if attention else ()))


def format_stages(value: str | None = None) -> tuple[str, ...] | None:
    """The pipeline stages whose programs the format passes convert, from `value` (None: `DIF_FORMAT_STAGES`);
    None: all of them. An unknown stage is a `UsageError` naming the known ones."""
    from dif.env import DIF_FORMAT_STAGES
    from dif.errors import UsageError
    from dif.plan.pipeline import STAGES

    raw = DIF_FORMAT_STAGES.get() if value is None else value
    names = [n.strip() for n in (raw or "").split(",") if n.strip()] or [str(DIF_FORMAT_STAGES.default)]
    if names == ["all"]:
        return None
    unknown = [n for n in names if n not in STAGES]
    if unknown:
        raise UsageError(
            f"{DIF_FORMAT_STAGES.name}: unknown stage {', '.join(unknown)}",
            hint=f"use 'all' or comma-separated stages from: {', '.join(STAGES)}",
        )
    return tuple(names)


def scoped_to_stage(pipeline: Sequence[str], stage: str) -> tuple[tuple[str, ...], Decision | None]:
    """`pipeline` without its format passes when a pipeline stage's program of `stage` is outside
    `format_stages()`, and the plan decision saying so (None: nothing held back).

    The default scope is the denoiser: it runs once per step and holds the pipeline's compute, while a text
    encoder runs once per prompt, so its format would buy no time and add its rounding to the conditioning
    every step reads. Measured on the klein 9B pipeline (random weights, H200): per-step rel-L2 against bf16
    0.0665 with the text encoder in fp8 too (stop 16), 0.0644 with the denoiser alone (stop 26): the encoder's
    share of the error is small, and the denoiser's own fp8 error on these weights is what the gate rejects."""
    from dif.env import DIF_FORMAT_STAGES

    stages = format_stages()
    formats = [p for p in pipeline if p in PASS_NAMES]
    if stages is None or stage in stages or not formats:
        return tuple(pipeline), None
    why = f"{DIF_FORMAT_STAGES.name}={','.join(stages)}: a program of the {stage} stage runs in the run dtype"
    return tuple(p for p in pipeline if p not in formats), Decision(f"formats: {', '.join(formats)} not run", why)
