"""The load-time NaN / infinity test of uploaded weights, on the device (`nonfinite_check` of
`dif.backend.Backend.prepare`).

The host's scan read every checkpoint byte a second time (klein 9B: 30 GB, 1.4 s of each load); here one
grid-stride kernel per tensor (`any_masked_u{8,16,32,64}` of kernels/layout.cu) tests the uploaded bits
where they already are, with the patterns of `dif.weights.scan.NONFINITE_BITS` (a value is non-finite when
its exponent field is all ones), each setting its tensor's flag; the flags come back in one copy. (A CuPy
ReductionKernel reduces a whole tensor in ONE block: 2-6 s per program for the same bytes.)
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from dif.weights.scan import NONFINITE_BITS
from dif_backend_cuda.kernels import PendingKernel
from dif_backend_cuda.lower import DevTensor

THREADS = 256
PER_THREAD = 64  # elements each thread tests at least, so small tensors take few blocks


def nonfinite_tensors(tensors: Iterable[tuple[str, DevTensor]], kernels: Any, sm_count: int, stream: Any) -> set[str]:
    """Names of the device `tensors` holding a NaN or infinite value (integer tensors are skipped);
    `kernels`: the backend's `KernelCache`."""
    import cupy

    tested = []
    for name, t in tensors:
        bits = NONFINITE_BITS.get(np.dtype(t.dtype.np).name)
        count = int(np.prod(t.shape, dtype=np.int64))
        if bits is not None and count:
            tested.append((name, t.ptr, count, bits))
    if not tested:
        return set()
    flags = cupy.zeros(len(tested), dtype=np.int32)
    for i, (_name, ptr, count, (view, mask, _value)) in enumerate(tested):
        kernel = kernels.function("layout", f"any_masked_u{8 * np.dtype(view).itemsize}")
        if isinstance(kernel, PendingKernel):  # compiled (or read from the cubin cache) on first use
            kernel = kernel.get()
        blocks = max(1, min(-(-count // (THREADS * PER_THREAD)), sm_count * 8))
        args = (np.uint64(ptr), view(mask), np.int64(count), np.uint64(flags.data.ptr + 4 * i))
        kernel((blocks,), (THREADS,), args, stream=stream)
    found = np.empty(len(tested), np.int32)
    cupy.cuda.runtime.memcpyAsync(found.ctypes.data, flags.data.ptr, found.nbytes, 2, stream.ptr)  # 2: D2H
    stream.synchronize()
    return {name for (name, *_), flag in zip(tested, found, strict=True) if flag}
