"""The load-time NaN / infinity test of uploaded weights, on the device (`nonfinite_check` of
`dif.backend.Backend.prepare`).

The host's scan read every checkpoint byte a second time (klein 9B: 30 GB, 1.4 s of each load); here one
reduction per tensor tests the uploaded bits where they already are (about 10 ms for the same 30 GB on
an H200), with the bit patterns of `dif.weights.scan.NONFINITE_BITS`: a value is non-finite when its
exponent field is all ones. The flags come back in one copy.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import numpy as np

from dif.weights.scan import NONFINITE_BITS
from dif_backend_cuda.lower import DevTensor


@functools.cache
def _any_masked() -> Any:
    """`y = any((x & mask) == mask)` over a flat unsigned view, without a temporary (a CuPy reduction,
    compiled once per element width and kept in CuPy's kernel cache on disk)."""
    import cupy

    return cupy.ReductionKernel(
        "T x, T mask", "int32 y", "((x & mask) == mask) ? 1 : 0", "a | b", "y = a", "0", "dif_any_nonfinite"
    )


def nonfinite_tensors(tensors: Iterable[tuple[str, DevTensor]], stream: Any) -> set[str]:
    """Names of the device `tensors` holding a NaN or infinite value; integer tensors are skipped."""
    import cupy

    named: list[str] = []
    flags: list[Any] = []
    with stream:
        for name, t in tensors:
            bits = NONFINITE_BITS.get(np.dtype(t.dtype.np).name)
            count = int(np.prod(t.shape, dtype=np.int64))
            if bits is None or count == 0:
                continue
            view, mask, _value = bits
            memory = cupy.cuda.UnownedMemory(t.ptr, count * np.dtype(view).itemsize, owner=None)
            flat = cupy.ndarray((count,), dtype=view, memptr=cupy.cuda.MemoryPointer(memory, 0))
            flags.append(_any_masked()(flat, view(mask)))
            named.append(name)
        if not flags:
            return set()
        found = cupy.stack(flags).get()
    return {name for name, flag in zip(named, found, strict=True) if flag}
