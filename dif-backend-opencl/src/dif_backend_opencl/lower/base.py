"""What every OpenCL lowering shares (backend side, after planning): tensor handles (`Ref`: a symbolic
buffer `Slot` + element offset + type), the steps (`Launch`, `Copy`, `Upload`), the `LowerCtx` that makes
steps and hands out per-node scratch, argument helpers, and the backend's `LoweringTable`.

Lowerings return the steps of a node; the executor appends them. Slots are resolved to real
`cl.Buffer`s only after every node is lowered (the arena, inputs, weights and the per-node scratch area
are known by then), and each launch gets its own `cl.Kernel` with arguments set once, so `run` only
enqueues.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from attrs import define, field, frozen

from dif.dtypes import DType
from dif.errors import NotImplementedOnBackend
from dif.ir.types import TensorType
from dif.lowering import LoweringTable
from dif.strides import broadcast_strides, collapse, contiguous_strides

__all__ = ["broadcast_strides", "collapse", "contiguous_strides"]  # re-exported: the lowerings' index math

BACKEND = "opencl"


SCRATCH_ALIGN = 256


GROUP_1D = 256  # global sizes of 1-d launches are rounded up to this (kernels guard with `n`)


DT_CODE: dict[DType, int] = {
    DType.F32: 0,
    DType.F16: 1,
    DType.BF16: 2,
    DType.I32: 3,
    DType.I64: 4,
    DType.I8: 5,
    DType.U8: 6,
    DType.BOOL: 7,
    DType.F8E4M3: 8,  # uchar bits, converted by kernels/common.cl (no OpenCL fp8 type)
}


FLOATS = frozenset({DType.F32, DType.F16, DType.BF16})


@frozen
class Slot:
    """A device buffer named before it exists: 'arena', 'scratch', 'in:x', 'w:p', 'host:v', 'val:v', 'stream'."""

    key: str


@frozen
class Ref:
    """A tensor on the device: `offset` elements of `type.dtype` into the buffer behind `slot`."""

    slot: Slot
    offset: int
    type: TensorType

    @property
    def dtype(self) -> DType:
        return self.type.dtype

    @property
    def code(self) -> np.int32:
        try:
            return np.int32(DT_CODE[self.type.dtype])
        except KeyError:
            raise NotImplementedOnBackend(
                "*", BACKEND, f"dtype {self.type.dtype.value} has no OpenCL storage"
            ) from None

    @property
    def numel(self) -> int:
        return self.type.numel

    def full(self) -> tuple[Any, ...]:
        """(buffer, element offset, dtype code): how most kernels take a tensor."""
        return (self.slot, np.int64(self.offset), self.code)

    def ptr(self) -> tuple[Any, ...]:
        """(buffer, element offset): for kernels typed by element size (layout) or fp32 scratch."""
        return (self.slot, np.int64(self.offset))

    def view(self, offset: int = 0, shape: Sequence[int] | None = None) -> Ref:
        """Same buffer, `offset` more elements in, optionally another shape."""
        return Ref(self.slot, self.offset + offset, TensorType(self.type.shape if shape is None else shape, self.dtype))

    @property
    def byte_offset(self) -> int:
        return self.offset * self.type.dtype.itemsize


@define
class Launch:
    """One kernel launch with its arguments; `bind` makes the `cl.Kernel` with them set."""

    node_id: int
    program: str
    kernel: str
    gsize: tuple[int, ...]
    lsize: tuple[int, ...] | None
    args: tuple[Any, ...]
    defines: dict[str, int] = field(factory=dict)
    bound: Any = None

    def bind(self, library: Any, resolve: Callable[[Slot], Any]) -> None:
        k = library.kernel(self.program, self.kernel, self.defines)
        k.set_args(*(resolve(a) if isinstance(a, Slot) else a for a in self.args))
        self.bound = k

    def enqueue(self, queue: Any) -> Any:
        import pyopencl as cl

        return cl.enqueue_nd_range_kernel(queue, self.bound, self.gsize, self.lsize)


@define
class Copy:
    """Device-to-device copy of `nbytes` (reshape, identity cast)."""

    node_id: int
    dst: Ref
    src: Ref
    nbytes: int
    bound: Any = None

    def bind(self, library: Any, resolve: Callable[[Slot], Any]) -> None:
        self.bound = (resolve(self.dst.slot), resolve(self.src.slot))

    def enqueue(self, queue: Any) -> Any:
        import pyopencl as cl

        dst, src = self.bound
        return cl.enqueue_copy(
            queue, dst, src, byte_count=self.nbytes, src_offset=self.src.byte_offset, dst_offset=self.dst.byte_offset
        )


@define
class Upload:
    """Host array -> device inside the step list (streamed weights, before their first consumer)."""

    node_id: int
    dst: Ref
    host: np.ndarray
    bound: Any = None

    def bind(self, library: Any, resolve: Any) -> None:
        self.bound = resolve(self.dst.slot)

    def enqueue(self, queue: Any) -> Any:
        import pyopencl as cl

        return cl.enqueue_copy(queue, self.bound, self.host, dst_offset=self.dst.byte_offset, is_blocking=False)


Step = Launch | Copy | Upload


@frozen
class LowerOptions:
    """Knobs of the lowering (tests flip them to reach every path)."""

    fused_attention_max_dim: int = 128  # head dims above this use two GEMMs + softmax
    conv3x3_direct: bool = True  # 3x3 stride-1 convs use the direct kernel, not im2col + GEMM
    scratch_cap_bytes: int = 64 << 20  # im2col chunks / attention score blocks stay under this


class LowerCtx:
    """Makes steps while lowering and hands out per-node scratch (reused by the next node, which is safe
    because launches run in order on one in-order queue). `steps` is the executor's list: it appends
    what each lowering returns (and its weight uploads) there."""

    def __init__(self, *, row_group: int, max_group: int, options: LowerOptions) -> None:
        self.row_group = row_group
        self.max_group = max_group
        self.options = options
        self.steps: list[Step] = []
        self.node_id = -1
        self.scratch_bytes = 0
        self._cursor = 0

    def begin(self, node_id: int) -> None:
        self.node_id = node_id
        self._cursor = 0

    def scratch(self, shape: Sequence[int], dtype: DType = DType.F32) -> Ref:
        t = TensorType(shape, dtype)
        start = -(-self._cursor // SCRATCH_ALIGN) * SCRATCH_ALIGN
        self._cursor = start + max(t.nbytes, 1)
        self.scratch_bytes = max(self.scratch_bytes, self._cursor)
        return Ref(Slot("scratch"), start // dtype.itemsize, t)

    def launch(
        self,
        program: str,
        kernel: str,
        gsize: Sequence[int],
        lsize: Sequence[int] | None,
        *args: Any,
        defines: dict[str, int] | None = None,
    ) -> list[Step]:
        """One launch of `kernel` from `kernels/<program>.cl` (none when the grid is empty)."""
        if any(g == 0 for g in gsize):
            return []
        return [
            Launch(
                self.node_id,
                program,
                kernel,
                tuple(gsize),
                None if lsize is None else tuple(lsize),
                args,
                defines or {},
            )
        ]

    def launch_1d(self, program: str, kernel: str, n: int, *args: Any) -> list[Step]:
        """One work-item per element; the kernel's `n` argument guards the rounded-up tail."""
        return self.launch(program, kernel, (-(-n // GROUP_1D) * GROUP_1D,), None, *args)

    def launch_rows(self, program: str, kernel: str, rows: int, *args: Any) -> list[Step]:
        """One work-group of `row_group` work-items per row."""
        return self.launch(program, kernel, (rows * self.row_group,), (self.row_group,), *args)

    def copy(self, dst: Ref, src: Ref) -> list[Step]:
        return [Copy(self.node_id, dst, src, dst.type.nbytes)] if dst.type.nbytes else []


Attrs = dict[str, Any]
Refs = list[Ref]
Steps = list[Step]
LOWERINGS = LoweringTable(BACKEND)
"""op -> lowering, filled by `lower/<group>.py` as `lower/__init__.py` imports them."""
lowers = LOWERINGS.register


def i32s(*values: int) -> tuple[np.int32, ...]:
    return tuple(np.int32(v) for v in values)


def i64s(*values: int) -> tuple[np.int64, ...]:
    return tuple(np.int64(v) for v in values)


MAX_RANK = 8


def vec8(values: Sequence[int], fill: int) -> Any:
    """An OpenCL int8 argument, padded in front with `fill` (rank <= 8)."""
    import pyopencl.cltypes as ct

    if len(values) > MAX_RANK:
        raise NotImplementedOnBackend("*", BACKEND, f"views of rank {len(values)} > {MAX_RANK} after collapsing")
    vals = [fill] * (MAX_RANK - len(values)) + [int(v) for v in values]
    if any(abs(v) >= 2**31 for v in vals):
        raise NotImplementedOnBackend("*", BACKEND, "a tensor dimension or stride exceeds 2^31 elements")
    return ct.make_int8(*vals)  # type: ignore[attr-defined]


def strided_args(out_shape: Sequence[int], *strides: Sequence[int]) -> tuple[Any, ...]:
    """(shape int8, stride int8 per operand..., flat bitmask) for the broadcasting kernels."""
    shape, sts = collapse(out_shape, [contiguous_strides(out_shape), *strides])
    contig, rest = sts[0], sts[1:]
    flat = sum(1 << k for k, st in enumerate(rest) if st == contig)
    return (vec8(shape, 1), *(vec8(st, 0) for st in rest), np.int32(flat))


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def fill_bits(value: float | np.ndarray, dtype: DType) -> tuple[int, np.uint64]:
    """(element size, raw bits) of `value` stored as `dtype`, converted the way numpy does."""
    arr = np.asarray(value).astype(dtype.np).reshape(1)
    size = dtype.itemsize
    raw = arr.view({1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}[size])[0]
    return size, np.uint64(int(raw))


def fill(ctx: LowerCtx, y: Ref, bits: tuple[int, np.uint64]) -> Steps:
    """`y` set to one value given as (element size, raw bits): the fill kernels of `kernels/layout.cl`."""
    size, raw = bits
    n = y.numel
    return ctx.launch_1d("layout", f"fill{size}", n, *y.ptr(), np.int64(n), raw)
