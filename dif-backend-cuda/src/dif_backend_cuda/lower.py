"""Lowering (backend side of the pipeline, after planning): one DiffIR node -> the device steps that
compute it over fixed addresses (arena slots, weights, input slots): NVRTC kernel launches, device
copies and library calls. Steps are plain callables `step(stream)`, so the executor can run them
eagerly or capture them all into one CUDA graph.

Elementwise and row-wise ops live here; data movement in `lower_layout`; matrix products, convolution
and attention in `lower_linalg`. An op or dtype without a lowering raises `NotImplementedOnBackend`.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from attrs import frozen

from dif.dtypes import DType
from dif.errors import NotImplementedOnBackend
from dif.ir.program import Node
from dif.ir.types import TensorType
from dif.ops.registry import OpTable
from dif.plan.plan import Buffer

FLOATS = (DType.F32, DType.F16, DType.BF16)
INTS = (DType.I32, DType.I64)
THREADS = 256
ILP = 4  # items per thread per grid-stride trip (ILP in kernels/common.cuh)
ROW_VPT = 8  # row values a thread keeps in registers (ROW_VPT in kernels/norm.cu)
GROUP_SPANS = (16384, 8192, 4096)  # values per slice of a split group_norm (a slice divides the spatial size)


@frozen
class DevTensor:
    """A tensor at a fixed device address, row-major. Contiguous unless `pitch` is set: then its elements
    come in rows of `row` contiguous elements whose starts are `pitch` elements apart (a view the plan
    placed inside a wider buffer: one part of a last-axis split or concat, `dif.plan.views`)."""

    ptr: int
    shape: tuple[int, ...]
    dtype: DType
    row: int = 0
    pitch: int = 0

    @property
    def pitched(self) -> bool:
        return self.pitch != 0 and self.pitch != self.row

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def at(self, elements: int) -> int:
        """Address of the element `elements` positions from the start."""
        return self.ptr + elements * self.dtype.itemsize


def arena_tensor(arena_ptr: int, buf: Buffer, t: TensorType) -> DevTensor:
    """The device tensor of a planned value: at its slot or view in the arena."""
    size = t.dtype.itemsize
    return DevTensor(arena_ptr + buf.offset, t.shape, t.dtype, buf.row_bytes // size, buf.pitch_bytes // size)


@frozen
class MetaRef:
    """Index (int64 elements) into the executable's metadata buffer; resolved to a pointer later."""

    offset: int


class Launch:
    """One kernel launch with fixed arguments."""

    kind = "kernel"

    def __init__(
        self, fn: Any, name: str, grid: tuple[int, ...], block: tuple[int, ...], args: list[Any], shared: int = 0
    ) -> None:
        self.fn, self.name, self.grid, self.block, self.args, self.shared = fn, name, grid, block, args, shared

    def resolve(self, meta_ptr: int) -> None:
        self.args = [np.uint64(meta_ptr + 8 * a.offset) if isinstance(a, MetaRef) else a for a in self.args]

    def __call__(self, stream: Any) -> None:
        self.fn(self.grid, self.block, tuple(self.args), shared_mem=self.shared, stream=stream)

    def __repr__(self) -> str:
        return f"Launch({self.name}, grid={self.grid}, block={self.block})"


class Copy:
    """A device-to-device copy (reshape, same-dtype cast)."""

    kind = "copy"

    def __init__(self, dst: int, src: int, nbytes: int) -> None:
        self.dst, self.src, self.nbytes = dst, src, nbytes

    def __call__(self, stream: Any) -> None:
        import cupy

        cupy.cuda.runtime.memcpyAsync(self.dst, self.src, self.nbytes, 3, stream.ptr)  # 3: device to device


class LowerCtx:
    """What lowering needs from the backend: kernels, device facts, options, the metadata buffer."""

    def __init__(self, backend: Any, table: OpTable) -> None:
        self.backend = backend
        self.kernels = backend.kernels
        self.sm_count = int(backend.props["sm_count"])
        self.table = table
        self.meta_chunks: list[np.ndarray] = []
        self.meta_len = 0
        self.choices: dict[int, str] = {}

    def meta(self, values: Sequence[int]) -> MetaRef:
        arr = np.asarray(values, dtype=np.int64)
        ref = MetaRef(self.meta_len)
        self.meta_chunks.append(arr)
        self.meta_len += arr.size
        return ref

    def kernel(
        self, module: str, name: str, grid: tuple[int, ...], block: tuple[int, ...], args: list[Any], shared: int = 0
    ) -> Launch:
        return Launch(self.kernels.function(module, name), name, grid, block, args, shared)

    def flat(self, module: str, name: str, n: int, args: list[Any]) -> Launch:
        """A grid-stride elementwise launch over `n` items (kernels take ILP items per thread per trip)."""
        blocks = max(1, min(-(-n // (THREADS * ILP)), self.sm_count * 16))
        return self.kernel(module, name, (blocks,), (THREADS,), args)


def ptr(t: DevTensor | None) -> np.uint64:
    return np.uint64(0 if t is None else t.ptr)


def i64(v: int) -> np.int64:
    return np.int64(v)


def f32(v: float) -> np.float32:
    return np.float32(v)


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    out, acc = [0] * len(shape), 1
    for i in reversed(range(len(shape))):
        out[i] = acc
        acc *= shape[i]
    return out


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> list[int]:
    """Element strides of a contiguous `shape` read as `out_shape` under numpy broadcasting (0 = repeat)."""
    base, pad = contiguous_strides(shape), len(out_shape) - len(shape)
    out = []
    for i, d in enumerate(out_shape):
        j = i - pad
        out.append(0 if j < 0 or (shape[j] == 1 and d != 1) else base[j])
    return out


def collapse(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 axes and merge neighbours that are contiguous for every operand (fewer index divisions)."""
    dims = [i for i, d in enumerate(shape) if d != 1]
    if not dims:
        return [1], [[0] for _ in strides]
    new_shape = [shape[dims[0]]]
    new_strides = [[s[dims[0]]] for s in strides]
    for i in dims[1:]:
        d = shape[i]
        if all(ns[-1] == s[i] * d for ns, s in zip(new_strides, strides, strict=True)):
            new_shape[-1] *= d
            for ns, s in zip(new_strides, strides, strict=True):
                ns[-1] = s[i]
        else:
            new_shape.append(d)
            for ns, s in zip(new_strides, strides, strict=True):
                ns.append(s[i])
    return new_shape, new_strides


def strided_meta(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> list[int]:
    cshape, cstrides = collapse(shape, strides)
    return [len(cshape), *cshape, *(s for st in cstrides for s in st)]


def unsupported(node: Node, detail: str) -> NotImplementedOnBackend:
    return NotImplementedOnBackend(node.op, "cuda", f"node {node.id}: {detail}")


def need(node: Node, dtype: DType, allowed: Sequence[DType]) -> str:
    if dtype not in allowed:
        raise unsupported(node, f"dtype {dtype.value} (supported: {', '.join(d.value for d in allowed)})")
    return dtype.value


def bits(t: DevTensor) -> int:
    return t.dtype.itemsize * 8


Attrs = dict[str, Any]
Ts = list[DevTensor]
Steps = list[Any]
Lowering = Callable[[LowerCtx, Node, Attrs, Ts, Ts], Steps]
LOWERINGS: dict[str, Lowering] = {}


def lowering(*ops: str) -> Callable[[Lowering], Lowering]:
    def wrap(fn: Lowering) -> Lowering:
        for op in ops:
            LOWERINGS[op] = fn
        return fn

    return wrap


PITCHED_ROWS = {"linear": 1, "glu": 1, "sdpa": 2, "rms_norm_rope": 2}
"""Ops whose lowerings address every operand and result as pitched rows spanning this many trailing
axes (`row_stride`); the backend declares them as `view:<op>:<axes>` (dif.plan.views)."""


IN_PLACE = ("reshape", "split", "concat")
"""Ops whose pitched operands or results can only be views already in place (they lower to nothing)."""


def row_stride(node: Node, t: DevTensor, axes: int) -> int:
    """Elements between consecutive rows of `t`, a row being its last `axes` axes."""
    row = math.prod(t.shape[len(t.shape) - axes :])
    if not t.pitched:
        return row
    if t.row != row:
        raise unsupported(node, f"a view with rows of {t.row} elements where {node.op} needs rows of {row}")
    return t.pitch


def lower_node(ctx: LowerCtx, node: Node, ins: list[DevTensor], outs: list[DevTensor]) -> list[Any]:
    """The steps computing `node` from `ins` into `outs` (results skipped when empty)."""
    import dif_backend_cuda.lower_fused  # noqa: F401  (registers the fused ops of dif.passes)
    import dif_backend_cuda.lower_layout  # noqa: F401  (registers the data-movement ops)
    import dif_backend_cuda.lower_linalg  # noqa: F401  (registers linear, matmul, conv2d, sdpa)

    fn = LOWERINGS.get(node.op)
    if fn is None:
        raise unsupported(node, "no CUDA lowering for this op")
    if node.op not in (*PITCHED_ROWS, *IN_PLACE) and any(t.pitched for t in (*ins, *outs)):
        raise unsupported(node, "an operand or result is a pitched view, which this lowering does not address")
    if all(o.numel == 0 for o in outs):
        return []
    attrs = ctx.table.get(node.op).check_attrs(node.attrs)
    return fn(ctx, node, attrs, ins, outs)


# -- elementwise -------------------------------------------------------------------------------

UNARY = (
    "neg",
    "abs",
    "exp",
    "log",
    "sqrt",
    "rsqrt",
    "sin",
    "cos",
    "tanh",
    "sigmoid",
    "silu",
    "relu",
    "reciprocal",
    "square",
    "gelu",
    "clamp",
    "scalar_affine",
)


CHUNK_BYTES = 16  # the unit of the `*_vec` / `*_rows` / `*_warp<N>` fast paths (C16 in kernels/common.cuh)


def aligned(elements: int, *tensors: DevTensor) -> bool:
    """Every tensor starts on a multiple of `elements` items (vector loads of that width are legal)."""
    return all(t.ptr % (elements * t.dtype.itemsize) == 0 for t in tensors)


def chunk_elements(*tensors: DevTensor) -> int:
    """Elements per 16-byte chunk when every tensor is contiguous, starts 16-byte aligned and holds whole
    chunks (the elementwise fast paths), else 0."""
    per = CHUNK_BYTES // tensors[0].dtype.itemsize
    ok = all(not t.pitched and t.ptr % CHUNK_BYTES == 0 and t.numel % per == 0 for t in tensors)
    return per if ok else 0


def row_groups(gate: tuple[int, ...], out: tuple[int, ...]) -> int:
    """G when `gate`, left-padded to out's rank, is [out[:k]..., 1, ..., 1, d] (one gate row per group of
    consecutive output rows); 0 when it is not of that form."""
    if not out or not gate or gate[-1] != out[-1]:
        return 0
    padded = (1,) * (len(out) - len(gate)) + tuple(gate)
    k = 0
    while k < len(out) - 1 and padded[k] == out[k] and padded[k] != 1:
        k += 1
    if any(p != 1 for p in padded[k:-1]) or any(padded[i] != out[i] for i in range(k)):
        return 0
    return math.prod(padded[:k])


@lowering(*UNARY)
def _unary(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    name = node.op
    p0 = p1 = 0.0
    if name == "gelu" and attrs["approximate"] == "tanh":
        name = "gelu_tanh"
    elif name == "clamp":
        p0, p1 = attrs["lo"], attrs["hi"]
    elif name == "scalar_affine":
        p0, p1 = attrs["scale"], attrs["bias"]
    dt = need(node, x.dtype, FLOATS)
    per = chunk_elements(x, y)
    if per:
        chunks = y.numel // per
        return [ctx.flat("elementwise", f"unary_vec_{name}_{dt}", chunks, [ptr(x), ptr(y), i64(chunks), f32(p0),
                                                                             f32(p1)])]  # fmt: skip
    return [ctx.flat("elementwise", f"unary_{name}_{dt}", y.numel, [ptr(x), ptr(y), i64(y.numel), f32(p0), f32(p1)])]


def _bcast(ctx: LowerCtx, ins: list[DevTensor], out: DevTensor) -> MetaRef:
    return ctx.meta(strided_meta(out.shape, [broadcast_strides(t.shape, out.shape) for t in ins]))


@lowering("add", "sub", "mul", "div", "maximum", "minimum", "pow")
def _binary(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (a, b), (y,) = ins, outs
    allowed = FLOATS + (INTS if node.op in ("add", "sub", "mul", "maximum", "minimum") else ())
    dt = need(node, a.dtype, allowed)
    per = chunk_elements(a, b, y) if a.shape == b.shape == y.shape and a.dtype in FLOATS else 0
    if per:
        chunks = y.numel // per
        return [ctx.flat("elementwise", f"binary_vec_{node.op}_{dt}", chunks, [ptr(a), ptr(b), ptr(y), i64(chunks)])]
    meta = _bcast(ctx, [a, b], y)
    return [ctx.flat("elementwise", f"binary_{node.op}_{dt}", y.numel, [ptr(a), ptr(b), ptr(y), meta, i64(y.numel)])]


@lowering("less", "greater", "equal")
def _compare(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (a, b), (y,) = ins, outs
    dt = need(node, a.dtype, FLOATS + INTS)
    meta = _bcast(ctx, [a, b], y)
    return [ctx.flat("elementwise", f"compare_{node.op}_{dt}", y.numel, [ptr(a), ptr(b), ptr(y), meta, i64(y.numel)])]


@lowering("where")
def _where(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (c, a, b), (y,) = ins, outs
    meta = _bcast(ctx, [c, a, b], y)
    args = [ptr(c), ptr(a), ptr(b), ptr(y), meta, i64(y.numel)]
    return [ctx.flat("elementwise", f"where_u{bits(y)}", y.numel, args)]


@lowering("modulate")
def _modulate(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x, s, t), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    groups = row_groups(s.shape, y.shape) if s.shape == t.shape and x.shape == y.shape else 0
    per = chunk_elements(x, s, t, y) if groups else 0
    if per and y.shape[-1] % per == 0:
        chunks, dc = y.numel // per, y.shape[-1] // per
        rows_per_g = y.numel // y.shape[-1] // groups
        args = [ptr(x), ptr(s), ptr(t), ptr(y), i64(chunks), i64(dc), i64(rows_per_g)]
        return [ctx.flat("elementwise", f"modulate_rows_{dt}", chunks, args)]
    meta = _bcast(ctx, [x, s, t], y)
    args = [ptr(x), ptr(s), ptr(t), ptr(y), meta, i64(y.numel)]
    return [ctx.flat("elementwise", f"modulate_{dt}", y.numel, args)]


@lowering("glu")
def _glu(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    h = y.shape[-1]
    rows = y.numel // h
    xp, yp = row_stride(node, x, 1), row_stride(node, y, 1)
    first = np.int32(1 if attrs["gated_half"] == "first" else 0)
    args = [ptr(x), ptr(y), i64(rows), i64(h), first, i64(xp), i64(yp)]
    size = x.dtype.itemsize
    if h % 8 == 0 and xp % 4 == 0 and yp % 4 == 0 and x.ptr % (4 * size) == 0 and y.ptr % (4 * size) == 0:
        grid = (-(-h // (8 * THREADS)), max(1, min(rows, 65535)))
        return [ctx.kernel("elementwise", f"glu_vec_{attrs['act']}_{dt}", grid, (THREADS,), args)]
    grid = (max(1, min(-(-h // (THREADS * ILP)), 64)), max(1, min(rows, 65535)))
    return [ctx.kernel("elementwise", f"glu_{attrs['act']}_{dt}", grid, (THREADS,), args)]


@lowering("cast")
def _cast(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    if x.dtype == y.dtype:
        return [Copy(y.ptr, x.ptr, y.nbytes)]
    if ctx.backend.props["major"] * 10 + ctx.backend.props["minor"] < 89 and {x.dtype, y.dtype} & {
        DType.F8E4M3,
        DType.F8E5M2,
    }:
        raise unsupported(node, "fp8 conversion needs compute capability 8.9+")
    return [ctx.flat("elementwise", f"cast_{x.dtype.value}_{y.dtype.value}", y.numel, [ptr(x), ptr(y), i64(y.numel)])]


def fill_steps(ctx: LowerCtx, y: DevTensor, scalar: np.ndarray) -> list[Any]:
    """Fill `y` with one value given as a 0-d array of y's storage dtype (bit pattern kept exactly)."""
    word = np.dtype(f"u{y.dtype.itemsize}")
    pattern = np.asarray(scalar).astype(y.dtype.np).reshape(1).view(word)[0]
    return [ctx.flat("layout", f"fill_u{bits(y)}", y.numel, [ptr(y), pattern, i64(y.numel)])]


@lowering("full")
def _full(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (y,) = outs
    value = ctx.table.get("full").run_reference([], attrs)[0]  # the op's own meaning of `value`
    return fill_steps(ctx, y, np.asarray(value).reshape(-1)[:1])


# -- rows and reductions -----------------------------------------------------------------------


def row_threads(length: int) -> int:
    """Threads per row block: about 4 elements per thread, a multiple of 32, at most 1024."""
    return int(min(1024, max(32, -(-length // 4 // 32) * 32)))


def _norm_launch(length: int, rows: int) -> tuple[tuple[int], tuple[int], np.int32]:
    """(grid, block, warp_rows): a warp per row for short rows, else a block per row sized so each
    thread holds at most ROW_VPT values."""
    if length <= ROW_VPT * 32:
        per_block = THREADS // 32
        return (-(-rows // per_block),), (THREADS,), np.int32(per_block)
    threads = int(min(1024, max(32, -(-length // ROW_VPT // 32) * 32)))
    return (rows,), (threads,), np.int32(0)


@lowering("rms_norm")
def _rms(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    x, w = ins[0], (ins[1] if len(ins) > 1 else None)
    (y,) = outs
    dt = need(node, x.dtype, FLOATS)
    wt = need(node, w.dtype, FLOATS) if w is not None else dt
    length = x.shape[-1]
    rows = x.numel // length
    grid, block, warp_rows = _norm_launch(length, rows)
    align = 4 * x.dtype.itemsize
    vec4 = bool(warp_rows) and length % 128 == 0 and x.ptr % align == 0 and y.ptr % align == 0
    args = [
        ptr(x),
        ptr(w),
        ptr(y),
        i64(rows),
        i64(length),
        f32(attrs["eps"]),
        f32(attrs["offset"]),
        np.int32(attrs["round_before_weight"]),
        warp_rows,
        np.int32(vec4),
    ]
    return [ctx.kernel("norm", f"rms_norm_{dt}_{wt}", grid, block, args)]


@lowering("layer_norm")
def _layer(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    x = ins[0]
    w = ins[1] if len(ins) > 1 else None
    b = ins[2] if len(ins) > 2 else None
    (y,) = outs
    dt = need(node, x.dtype, FLOATS)
    if w is not None and b is not None and w.dtype != b.dtype:
        raise unsupported(node, f"weight {w.dtype.value} and bias {b.dtype.value} differ in dtype")
    p = w if w is not None else b
    wt = need(node, p.dtype, FLOATS) if p is not None else dt
    length = x.shape[-1]
    rows = x.numel // length
    grid, block, warp_rows = _norm_launch(length, rows)
    args = [ptr(x), ptr(w), ptr(b), ptr(y), i64(rows), i64(length), f32(attrs["eps"]), warp_rows]
    return [ctx.kernel("norm", f"layer_norm_{dt}_{wt}", grid, block, args)]


@lowering("group_norm")
def _group(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x, w, b), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    if w.dtype != b.dtype:
        raise unsupported(node, f"weight {w.dtype.value} and bias {b.dtype.value} differ in dtype")
    wt = need(node, w.dtype, FLOATS)
    n, c = x.shape[:2]
    spatial = math.prod(x.shape[2:])
    g = attrs["groups"]
    span = next((v for v in GROUP_SPANS if spatial % v == 0), 0)
    if span and n * g < 4 * ctx.sm_count and c // g * spatial >= 2 * span and chunk_elements(x, y):
        # too few groups to fill the GPU with a block each: slices of `span` values, two passes
        import cupy

        slices = c // g * spatial // span
        part = cupy.cuda.Memory(n * g * slices * 2 * 4)  # (mean, M2) per slice, owned by the stats step
        grid = (n * g, slices)
        stats = ctx.kernel("norm", f"group_norm_stats_{dt}", grid, (THREADS,), [ptr(x), np.uint64(part.ptr), i64(span)])
        stats.scratch = part
        args = [ptr(x), ptr(w), ptr(b), np.uint64(part.ptr), ptr(y), i64(c), i64(spatial), i64(g), i64(span)]
        return [stats, ctx.kernel("norm", f"group_norm_apply_{dt}_{wt}", grid, (THREADS,), [*args, f32(attrs["eps"])])]
    args = [ptr(x), ptr(w), ptr(b), ptr(y), i64(c), i64(spatial), i64(g), f32(attrs["eps"])]
    return [ctx.kernel("norm", f"group_norm_{dt}_{wt}", (n * g,), (row_threads(c // g * spatial),), args)]


def _axis_rows(x: DevTensor, axis: int) -> tuple[int, int, int]:
    a = axis % len(x.shape)
    return math.prod(x.shape[:a]), x.shape[a], math.prod(x.shape[a + 1 :])


@lowering("softmax")
def _softmax(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    outer, length, inner = _axis_rows(x, attrs["axis"])
    args = [ptr(x), ptr(y), i64(length), i64(inner)]
    return [ctx.kernel("norm", f"softmax_{dt}", (outer * inner,), (row_threads(length),), args)]


@lowering("l2_normalize")
def _l2(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    outer, length, inner = _axis_rows(x, attrs["axis"])
    args = [ptr(x), ptr(y), i64(length), i64(inner), f32(attrs["eps"])]
    return [ctx.kernel("norm", f"l2_normalize_{dt}", (outer * inner,), (row_threads(length),), args)]


@lowering("rope")
def _rope(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x, c, s), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    if c.dtype != s.dtype:
        raise unsupported(node, f"cos {c.dtype.value} and sin {s.dtype.value} differ in dtype")
    ct = need(node, c.dtype, FLOATS)
    _b, seq, heads, dim = x.shape
    rows = y.numel // dim
    tx = min(THREADS, -(-((dim + 1) // 2) // 32) * 32)  # threads over channel pairs
    ty = max(1, THREADS // tx)  # rows per block
    grid = (max(1, min(-(-rows // ty), ctx.sm_count * 32)),)
    pairs = np.int32(attrs["mode"] == "pairs")
    args = [ptr(x), ptr(c), ptr(s), ptr(y), i64(rows), i64(seq), i64(heads), i64(dim), i64(c.shape[1]), pairs]
    return [ctx.kernel("norm", f"rope_{dt}_{ct}", grid, (tx, ty), args)]


@lowering("reduce_sum", "reduce_mean", "reduce_max")
def _reduce(ctx: LowerCtx, node: Node, attrs: Attrs, ins: Ts, outs: Ts) -> Steps:
    (x,), (y,) = ins, outs
    dt = need(node, x.dtype, FLOATS)
    axes = {a % len(x.shape) for a in attrs["axes"]}
    xs = contiguous_strides(x.shape)
    kept = [i for i in range(len(x.shape)) if i not in axes]
    red = sorted(axes)
    kshape, (kstr,) = collapse([x.shape[i] for i in kept], [[xs[i] for i in kept]])
    rshape, (rstr,) = collapse([x.shape[i] for i in red], [[xs[i] for i in red]])
    n_red = math.prod(rshape)
    meta = ctx.meta([len(kshape), *kshape, *kstr, len(rshape), *rshape, *rstr])
    kind = "max" if node.op == "reduce_max" else "sum"
    divisor = float(n_red) if node.op == "reduce_mean" else 1.0
    warps = THREADS // 32
    args = [ptr(x), ptr(y), meta, i64(y.numel), i64(n_red), f32(divisor)]
    return [ctx.kernel("norm", f"reduce_{kind}_{dt}", (-(-y.numel // warps),), (THREADS,), args)]
