"""Host -> device weight upload (CUDA backend, prepare step): host arrays (zero-copy mmap views of the
checkpoint's safetensors files, or arrays a dtype conversion made) into one device allocation at their
planned offsets, on several lanes at once.

One lane is one host thread with its own CUDA stream and two pinned staging buffers. The bytes are cut
into chunks of at most `CHUNK_BYTES` (`upload_chunks`); each lane takes the next chunk, copies it from
the source into a free staging buffer (numpy releases the GIL for the copy, so the page-cache reads of
all lanes run in parallel) and queues its H2D copy on the lane's stream; a buffer is refilled only after
the event recorded behind its last copy. One thread through two buffers moved 1.2 GB/s; the lanes are
what lets a warm page cache feed the copy engines. The pinned buffers are made once per process and
reused by every upload (pinning costs about as much as copying).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from attrs import frozen

CHUNK_BYTES = 32 << 20
MAX_LANES = 8
H2D = 1


@frozen
class Chunk:
    """Bytes `[start, start + size)` of source array `array` go to device offset `dst`."""

    array: int
    start: int
    size: int
    dst: int


def upload_chunks(arrays: Sequence[tuple[int, Any]], chunk_bytes: int = CHUNK_BYTES) -> list[Chunk]:
    """The chunks of `arrays` ((device offset, array) pairs), largest arrays first so the tail of the
    upload is many small chunks rather than one long one."""
    order = sorted(range(len(arrays)), key=lambda i: -int(arrays[i][1].nbytes))
    out = []
    for i in order:
        offset, arr = arrays[i]
        for start in range(0, int(arr.nbytes), chunk_bytes):
            out.append(Chunk(i, start, min(chunk_bytes, int(arr.nbytes) - start), offset + start))
    return out


def lane_count(total_bytes: int, chunk_bytes: int = CHUNK_BYTES) -> int:
    """Lanes worth starting: one per core up to `MAX_LANES`, never more than there are chunks."""
    chunks = -(-total_bytes // chunk_bytes)
    return max(1, min(MAX_LANES, os.cpu_count() or 1, chunks))


def empty_pinned(nbytes: int) -> np.ndarray:
    """A page-locked host buffer of `nbytes` bytes from CuPy's pinned pool (what `cupyx.empty_pinned` does;
    importing `cupyx` pulls in cupyx.linalg and scipy.sparse, 0.17 s of every fresh process on the H200).
    The array holds the pinned allocation alive."""
    import cupy

    return np.ndarray((nbytes,), dtype=np.uint8, buffer=cupy.cuda.alloc_pinned_memory(nbytes))


class _Lane:
    """A stream, two pinned buffers and their events (owned by one thread at a time)."""

    def __init__(self, chunk_bytes: int) -> None:
        import cupy

        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.buffers = [empty_pinned(chunk_bytes) for _ in range(2)]
        self.events = [cupy.cuda.Event(), cupy.cuda.Event()]
        self.used = [False, False]


_LANES: dict[tuple[int, int], list[_Lane]] = {}
_LANES_LOCK = threading.Lock()


def _lanes(count: int, chunk_bytes: int) -> list[_Lane]:
    """`count` lanes of the current device, made on first use and kept for the process."""
    import cupy

    key = (cupy.cuda.Device().id, chunk_bytes)
    with _LANES_LOCK:
        lanes = _LANES.setdefault(key, [])
        while len(lanes) < count:
            lanes.append(_Lane(chunk_bytes))
        return lanes[:count]


def _flat_bytes(arr: Any) -> np.ndarray:
    return np.ascontiguousarray(arr).reshape(-1).view(np.uint8)


def upload(
    dst_ptr: int,
    arrays: list[tuple[int, Any]],
    stream: Any,
    on_bytes: Callable[[int], None] | None = None,
) -> float:
    """Copy host `arrays` ((byte offset, array) pairs) to `dst_ptr + offset` and wait for them (every lane's
    stream, then `stream`, the backend's, is synchronized, so work queued on it afterwards sees the weights).
    `on_bytes(n)` is called (from lane threads) as each chunk of n bytes is queued; None: the open progress
    bar's, if any (`dif.progress.byte_callback`). Returns the seconds spent."""
    import cupy

    from dif.progress import byte_callback

    on_bytes = on_bytes if on_bytes is not None else byte_callback()
    t0 = time.perf_counter()
    chunks = upload_chunks(arrays, CHUNK_BYTES)
    if not chunks:
        return 0.0
    total = sum(c.size for c in chunks)
    lanes = _lanes(lane_count(total), CHUNK_BYTES)
    flats: dict[int, np.ndarray] = {}
    flats_lock = threading.Lock()
    next_chunk = iter(chunks)
    take_lock = threading.Lock()
    errors: list[BaseException] = []
    device = cupy.cuda.Device()

    def source(i: int) -> np.ndarray:
        # a non-contiguous or converting array is flattened once, by whichever lane needs it first
        with flats_lock:
            if i not in flats:
                flats[i] = _flat_bytes(arrays[i][1])
            return flats[i]

    def run(lane: _Lane) -> None:
        try:
            with device:
                turn = 0
                while True:
                    with take_lock:
                        chunk = next(next_chunk, None)
                    if chunk is None or errors:
                        break
                    if lane.used[turn]:
                        lane.events[turn].synchronize()
                    buf = lane.buffers[turn]
                    buf[: chunk.size] = source(chunk.array)[chunk.start : chunk.start + chunk.size]
                    cupy.cuda.runtime.memcpyAsync(
                        dst_ptr + chunk.dst, buf.ctypes.data, chunk.size, H2D, lane.stream.ptr
                    )
                    lane.events[turn].record(lane.stream)
                    lane.used[turn] = True
                    turn ^= 1
                    if on_bytes is not None:
                        on_bytes(chunk.size)
                lane.stream.synchronize()
        except BaseException as exc:  # re-raised on the calling thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(lane,), name=f"dif-upload-{i}") for i, lane in enumerate(lanes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    stream.synchronize()  # nothing later on the backend's stream may overtake an earlier copy on it
    return time.perf_counter() - t0
