"""Checkpoint access, step 5: scan tensors for NaN / infinite values, and per-tensor statistics.

`nonfinite_counts` is the load-time scan `bind_weights` runs on every tensor a program binds
(a checkpoint of NaNs would otherwise run to a black image), in chunks spread over threads, since
numpy's loops release the GIL; the arrays are memmap views of the page cache. It reads every byte of a
checkpoint on every load (30 GB for klein 9B), so the test is two read-only reductions over the raw bits
(`has_nonfinite`: no temporaries, each block still in cache for the second), and only a tensor found
to hold a non-finite value is counted exactly (`count_nonfinite`) for the error message.
`tensor_stats` is what `dif weights stats` prints: count, min, max, mean, non-finite per tensor.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import numpy as np
from attrs import frozen

from dif.weights.source import TensorSource

CHUNK = 1 << 23  # elements per task: large enough to amortise the thread hand-off, small enough to spread

# dtype name -> (unsigned view, mask, value with the mask set that means non-finite)
NONFINITE_BITS: dict[str, tuple[type[np.unsignedinteger], int, int]] = {
    "float64": (np.uint64, 0x7FF0000000000000, 0x7FF0000000000000),
    "float32": (np.uint32, 0x7F800000, 0x7F800000),
    "float16": (np.uint16, 0x7C00, 0x7C00),
    "bfloat16": (np.uint16, 0x7F80, 0x7F80),
    "float8_e5m2": (np.uint8, 0x7C, 0x7C),
    "float8_e4m3fn": (np.uint8, 0x7F, 0x7F),  # no infinities; NaN is S.1111.111
}

# dtype name -> (signed view, unsigned view, threshold): a value is NaN / infinite when its bits without
# the sign are at least the threshold (exponent all ones; float8_e4m3fn has only S.1111.111, its NaN)
_LIMITS: dict[str, tuple[type[np.signedinteger], type[np.unsignedinteger], int]] = {
    "float64": (np.int64, np.uint64, 0x7FF0000000000000),
    "float32": (np.int32, np.uint32, 0x7F800000),
    "float16": (np.int16, np.uint16, 0x7C00),
    "bfloat16": (np.int16, np.uint16, 0x7F80),
    "float8_e5m2": (np.int8, np.uint8, 0x7C),
    "float8_e4m3fn": (np.int8, np.uint8, 0x7F),
}
SCAN_BLOCK = 1 << 20  # elements per pair of reductions: the block stays in cache for the second

T = TypeVar("T")


@frozen
class TensorStats:
    """One tensor's values: count, min / max / mean over its finite values (None when it has none),
    nan and inf counts. dtype is the safetensors name."""

    name: str
    file: str
    dtype: str
    shape: tuple[int, ...]
    count: int
    min: float | None
    max: float | None
    mean: float | None
    nan: int
    inf: int

    @property
    def nonfinite(self) -> int:
        return self.nan + self.inf


def _chunks(array: np.ndarray) -> list[np.ndarray]:
    flat = array.reshape(-1)
    return [flat[i : i + CHUNK] for i in range(0, flat.size, CHUNK)] or [flat]


def _parallel(tasks: Sequence[Callable[[], T]], threads: int | None) -> list[T]:
    workers = max(1, min(threads or os.cpu_count() or 1, len(tasks)))
    if workers == 1:
        return [task() for task in tasks]
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dif-scan") as pool:
        return list(pool.map(lambda task: task(), tasks))


def count_nonfinite(array: np.ndarray) -> int:
    """NaN and infinite values in `array` (any shape): numpy's own floats by `np.isfinite`, ml_dtypes'
    (bfloat16, float8) by their exponent bits, several times faster than their `np.isfinite`."""
    chunk = np.ascontiguousarray(array).reshape(-1)
    if chunk.dtype.kind == "f":
        return int(chunk.size - np.count_nonzero(np.isfinite(chunk)))
    bits = NONFINITE_BITS.get(chunk.dtype.name)
    if bits is None:
        return 0 if chunk.dtype.kind in "iub" else int(chunk.size - np.count_nonzero(np.isfinite(chunk)))
    view, mask, value = bits
    return int(np.count_nonzero((chunk.view(view) & view(mask)) == view(value)))


def has_nonfinite(array: np.ndarray) -> bool:
    """Whether `array` holds a NaN or infinite value. For the float dtypes of `_LIMITS`: a positive value
    is non-finite when its signed view is at least the threshold (negative ones are below zero there), a
    negative one when its unsigned view is at least sign | threshold (positive ones are below the sign
    bit); so the maxima of the two views decide, block by block."""
    flat = np.ascontiguousarray(array).reshape(-1)
    limits = _LIMITS.get(flat.dtype.name)
    if limits is None:
        return bool(count_nonfinite(flat))
    signed, unsigned, threshold = limits
    low, high = flat.view(signed), flat.view(unsigned)
    negative = threshold | (1 << (8 * flat.dtype.itemsize - 1))
    for start in range(0, flat.size, SCAN_BLOCK):
        stop = start + SCAN_BLOCK
        if low[start:stop].max() >= threshold or high[start:stop].max() >= negative:
            return True
    return False


def nonfinite_counts(source: TensorSource, names: Iterable[str], *, threads: int | None = None) -> dict[str, int]:
    """Tensor name -> number of NaN / infinite values, for the tensors of `names` that have any."""
    arrays = {name: np.asarray(source[name]) for name in names}
    tasks = [(name, chunk) for name, array in arrays.items() for chunk in _chunks(array)]
    hits = _parallel([functools.partial(has_nonfinite, chunk) for _, chunk in tasks], threads)
    flagged = list(dict.fromkeys(name for (name, _), hit in zip(tasks, hits, strict=True) if hit))
    counts = _parallel([functools.partial(count_nonfinite, arrays[name]) for name in flagged], threads)
    return {name: count for name, count in zip(flagged, counts, strict=True) if count}


def _chunk_stats(chunk: np.ndarray) -> tuple[int, int, float, float, float, int]:
    """(nan, inf, min, max, sum, finite count) of one chunk, in float64 (sum) / float32."""
    x = np.asarray(chunk, dtype=np.float64 if chunk.dtype == np.float64 else np.float32)
    finite = np.isfinite(x)
    nan = int(np.isnan(x).sum())
    inf = int(x.size - finite.sum()) - nan
    good = x[finite] if nan or inf else x
    if good.size == 0:
        return nan, inf, np.inf, -np.inf, 0.0, 0
    return nan, inf, float(good.min()), float(good.max()), float(good.sum(dtype=np.float64)), int(good.size)


def tensor_stats(
    source: TensorSource, names: Iterable[str] | None = None, *, threads: int | None = None
) -> list[TensorStats]:
    """Statistics of each tensor of `names` (default: all of `source`, in its order)."""
    picked = list(source.names() if names is None else names)
    tasks = [(name, chunk) for name in picked for chunk in _chunks(np.asarray(source[name]))]
    parts = _parallel([functools.partial(_chunk_stats, chunk) for _, chunk in tasks], threads)
    merged: dict[str, list[float]] = {name: [0.0, 0.0, np.inf, -np.inf, 0.0, 0.0] for name in picked}
    for (name, _), part in zip(tasks, parts, strict=True):
        acc, (nan, inf, lo, hi, total, n) = merged[name], part
        acc[:] = [acc[0] + nan, acc[1] + inf, min(acc[2], lo), max(acc[3], hi), acc[4] + total, acc[5] + n]
    out = []
    for name in picked:
        nan_count, inf_count, low, high, sum_, finite = merged[name]
        info = source.info(name)
        out.append(
            TensorStats(
                name,
                source.file_of(name),
                info.dtype,
                tuple(info.shape),
                int(np.prod(info.shape, dtype=np.int64)),
                float(low) if finite else None,
                float(high) if finite else None,
                float(sum_ / finite) if finite else None,
                int(nan_count),
                int(inf_count),
            )
        )
    return out


def describe_nonfinite(found: Mapping[str, int], source: TensorSource, limit: int = 8) -> str:
    """One clause per tensor: "'NAME' in FILE (N of M values)", the first `limit` of them."""
    items = []
    for name, count in list(found.items())[:limit]:
        size = int(np.prod(source.info(name).shape, dtype=np.int64))
        items.append(f"'{name}' in {source.file_of(name)} ({count} of {size} values)")
    more = f" and {len(found) - limit} more" if len(found) > limit else ""
    return "; ".join(items) + more
