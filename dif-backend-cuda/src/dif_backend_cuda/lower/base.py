"""What every CUDA lowering shares (backend side, after planning): the device tensor at a fixed address,
the steps (kernel launches, device copies), the `LowerCtx` handing out kernels and metadata, argument
helpers, and the backend's `LoweringTable` that the `lower/<group>.py` modules register into.

Steps are plain callables `step(stream)`, so the executor can run them eagerly or capture them all into
one CUDA graph.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np
from attrs import frozen

from dif.dtypes import DType
from dif.errors import NotImplementedOnBackend
from dif.ir.program import Node
from dif.ir.types import TensorType
from dif.lowering import LoweringTable
from dif.ops.registry import OpTable
from dif.plan.plan import Buffer
from dif.strides import broadcast_strides, collapse, contiguous_strides

__all__ = ["broadcast_strides", "collapse", "contiguous_strides"]  # re-exported: the lowerings' index math

FLOATS = (DType.F32, DType.F16, DType.BF16)
INTS = (DType.I32, DType.I64)
THREADS = 256
ILP = 4  # items per thread per grid-stride trip (ILP in kernels/common.cuh)
TILE = 64  # output tile of the NVRTC GEMM and implicit-GEMM conv kernels (TBM / TBN in kernels/gemm_tile.cuh)
MAX_GRID_Z = 65535
DEFAULT_SHARED = 48 * 1024  # dynamic shared memory a launch may use without opting in


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
    """One kernel launch with fixed arguments. `fn` may be a `kernels.PendingKernel` until `resolve`."""

    kind = "kernel"

    def __init__(
        self, fn: Any, name: str, grid: tuple[int, ...], block: tuple[int, ...], args: list[Any], shared: int = 0
    ) -> None:
        self.fn, self.name, self.grid, self.block, self.args, self.shared = fn, name, grid, block, args, shared

    def resolve(self, meta_ptr: int) -> None:
        """Fix the metadata addresses and wait for the kernel (compiled meanwhile on the pool); dynamic
        shared memory that with the kernel's static shared memory (block reductions' scratch) exceeds the
        default 48 KiB is opted into here (the lowering checked the device's limit). Without the opt-in such
        a launch fails with CUDA_ERROR_INVALID_VALUE: klein 9B's fp8 glu_quant stages a 12,288-wide row,
        exactly 48 KiB, beside its reduction scratch."""
        from dif_backend_cuda.kernels import PendingKernel

        self.args = [np.uint64(meta_ptr + 8 * a.offset) if isinstance(a, MetaRef) else a for a in self.args]
        if isinstance(self.fn, PendingKernel):
            self.fn = self.fn.get()
        if self.shared and self.shared + self.fn.shared_size_bytes > DEFAULT_SHARED:
            self.fn.max_dynamic_shared_size_bytes = self.shared

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
        self._scratch: dict[Hashable, Any] = {}

    def shared_scratch(self, key: Hashable, nbytes: int) -> Any:
        """Device memory (a cupy Memory, outside the plan's arena) that every step asking for `key` shares:
        a program's steps run one after another on one stream, so one buffer serves all the nodes that
        only need it for the length of their own step."""
        import cupy

        held = self._scratch.get(key)
        if held is None or held.size < nbytes:
            held = self._scratch[key] = cupy.cuda.Memory(nbytes)
        return held

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


LOWERINGS = LoweringTable("cuda")
"""op -> lowering, filled by `lower/<group>.py` as `lower/__init__.py` imports them."""
lowering = LOWERINGS.register


PITCHED_ROWS = {
    "linear": 1,
    "glu": 1,
    "glu_quant": 1,
    "concat_glu_quant": 1,
    "glu_backward": 1,
    "sdpa": 2,
    "sdpa_fp8": 2,
    "sdpa_fp8_qk": 2,
    "rms_norm_rope": 2,
    "rms_norm_rope_quant": 2,
    "sdpa_stats": 2,
    "sdpa_backward": 2,
}
"""Ops whose lowerings address every operand and result as pitched rows spanning this many trailing
axes (`row_stride`); the backend declares them as `view:<op>:<axes>` (dif.plan.views). The attention
statistics of `sdpa_stats` / `sdpa_backward` are the exception: a view of them is refused."""


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


@frozen
class ChunkBroadcast:
    """A broadcasting elementwise op run over the output's 16-byte chunks (`kernels/common.cuh`
    `load_chunk`): `per` elements a chunk, `meta` the chunk grid with each operand's strides (in chunks for
    an operand spanning the innermost axis, in elements for one whose innermost axis is 1, read as one
    scalar per chunk), `scalars` the bit mask of the latter."""

    per: int
    meta: MetaRef
    scalars: int
    chunks: int


def chunk_broadcast(ctx: LowerCtx, ins: Sequence[DevTensor], out: DevTensor) -> ChunkBroadcast | None:
    """The chunked form of a broadcasting elementwise op, or None: the output contiguous, 16-byte aligned and
    a whole number of chunks per row; every operand contiguous, each spanning the output's innermost axis
    (16-byte aligned) or of innermost size 1. Outer strides of a spanning operand are multiples of its
    innermost axis, so whole chunks are only ever repeated."""
    per = CHUNK_BYTES // out.dtype.itemsize
    if not out.shape or out.shape[-1] % per or out.pitched or out.ptr % CHUNK_BYTES:
        return None
    strides: list[list[int]] = []
    scalars = 0
    for k, t in enumerate(ins):
        if t.pitched or not t.shape:
            return None
        element = broadcast_strides(t.shape, out.shape)
        if t.shape[-1] == out.shape[-1] and t.ptr % CHUNK_BYTES == 0:
            strides.append([*(st // per for st in element[:-1]), 1])
        elif t.shape[-1] == 1:
            strides.append([*element[:-1], 0])
            scalars |= 1 << k
        else:
            return None
    chunk_shape = (*out.shape[:-1], out.shape[-1] // per)
    return ChunkBroadcast(per, ctx.meta(strided_meta(chunk_shape, strides)), scalars, out.numel // per)


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


def bcast_meta(ctx: LowerCtx, ins: list[DevTensor], out: DevTensor) -> MetaRef:
    """Metadata of the broadcasting kernels: `ins` read as `out`'s shape, collapsed (`strided_meta`)."""
    return ctx.meta(strided_meta(out.shape, [broadcast_strides(t.shape, out.shape) for t in ins]))


def fill_steps(ctx: LowerCtx, y: DevTensor, scalar: np.ndarray) -> list[Any]:
    """Fill `y` with one value given as a 0-d array of y's storage dtype (bit pattern kept exactly)."""
    word = np.dtype(f"u{y.dtype.itemsize}")
    pattern = np.asarray(scalar).astype(y.dtype.np).reshape(1).view(word)[0]
    return [ctx.flat("layout", f"fill_u{bits(y)}", y.numel, [ptr(y), pattern, i64(y.numel)])]


def row_threads(length: int) -> int:
    """Threads per row block: about 4 elements per thread, a multiple of 32, at most 1024."""
    return int(min(1024, max(32, -(-length // 4 // 32) * 32)))
