"""`upload` (several lanes of pinned buffers and streams) without a GPU: a fake cupy whose memcpyAsync copies
at once into a host array standing in for device memory, so every byte's destination and the lanes' use of
their buffers can be checked exactly; on a GPU the same checks run against real device memory."""

from __future__ import annotations

import ctypes
import sys
import threading
import types

import numpy as np
import pytest

from dif_backend_cuda import upload as upload_module
from dif_backend_cuda.upload import Chunk, lane_count, upload, upload_chunks

from .conftest import cuda_skip_reason


def _fake_cupy(copies: list[tuple[int, int]]) -> types.ModuleType:
    lock = threading.Lock()

    class Stream:
        ptr = 0

        def __init__(self, non_blocking: bool = False) -> None:
            pass

        def synchronize(self) -> None:
            pass

    class Event:
        def record(self, stream: object) -> None:
            pass

        def synchronize(self) -> None:
            pass

    class Device:
        id = 0

        def __enter__(self) -> Device:
            return self

        def __exit__(self, *exc: object) -> None:
            pass

    def memcpy_async(dst: int, src: int, size: int, kind: int, stream: int) -> None:
        ctypes.memmove(dst, src, size)
        with lock:
            copies.append((dst, size))

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        Stream=Stream,
        Event=Event,
        Device=Device,
        runtime=types.SimpleNamespace(memcpyAsync=memcpy_async),
        alloc_pinned_memory=bytearray,  # any buffer stands in for page-locked memory
    )
    return cupy  # type: ignore[return-value]


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    copies: list[tuple[int, int]] = []
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(copies))
    monkeypatch.setattr(upload_module, "_LANES", {})
    monkeypatch.setattr(upload_module, "CHUNK_BYTES", 1000)
    return copies


def test_chunks_cover_every_byte_once_largest_first() -> None:
    arrays = [(0, np.zeros(10, np.uint8)), (4096, np.zeros(2500, np.uint8)), (9000, np.zeros(0, np.uint8))]
    chunks = upload_chunks(arrays, chunk_bytes=1000)
    assert chunks[:3] == [Chunk(1, 0, 1000, 4096), Chunk(1, 1000, 1000, 5096), Chunk(1, 2000, 500, 6096)]
    assert chunks[3:] == [Chunk(0, 0, 10, 0)]
    assert lane_count(0) == 1 and lane_count(10**12) <= upload_module.MAX_LANES


def test_upload_places_every_array_at_its_offset(fake: list[tuple[int, int]]) -> None:
    rng = np.random.default_rng(0)
    device = np.zeros(90_000, np.uint8)
    f32 = rng.standard_normal((70, 33), dtype=np.float32)  # 9240 B: ten chunks
    strided = rng.integers(0, 255, (40, 50), dtype=np.uint8)[:, ::2]  # not contiguous: flattened once
    ints = np.arange(7000, dtype=np.int64)  # 56000 B
    arrays = [(0, f32), (20_000, strided), (30_000, ints)]
    stream = types.SimpleNamespace(synchronize=lambda: None)
    seen: list[int] = []
    upload(device.ctypes.data, arrays, stream, on_bytes=seen.append)
    assert np.array_equal(device[: f32.nbytes].view(np.float32).reshape(f32.shape), f32)
    assert np.array_equal(device[20_000 : 20_000 + strided.size].reshape(strided.shape), strided)
    assert np.array_equal(device[30_000 : 30_000 + ints.nbytes].view(np.int64), ints)
    untouched = np.ones(device.size, bool)
    for offset, arr in arrays:
        untouched[offset : offset + arr.nbytes] = False
    assert not device[untouched].any()  # nothing written outside the arrays' slots
    assert sum(seen) == sum(int(a.nbytes) for _, a in arrays)
    assert sorted(size for _, size in fake) == sorted(c.size for c in upload_chunks(arrays, 1000))


def test_a_failing_source_is_raised_on_the_caller(fake: list[tuple[int, int]]) -> None:
    class Broken:
        nbytes = 5000

        def __array__(self, dtype: object = None, copy: object = None) -> np.ndarray:
            raise OSError("the file went away")

    device = np.zeros(8000, np.uint8)
    stream = types.SimpleNamespace(synchronize=lambda: None)
    with pytest.raises(OSError, match="went away"):
        upload(device.ctypes.data, [(0, Broken())], stream)


@pytest.mark.cuda
def test_upload_on_the_device() -> None:
    reason = cuda_skip_reason()
    if reason:
        pytest.skip(reason)
    import cupy

    rng = np.random.default_rng(1)
    arrays = [(0, rng.standard_normal(3_000_000, dtype=np.float32)), (16 << 20, rng.standard_normal(5, np.float32))]
    device = cupy.zeros((16 << 20) + 64, dtype=np.uint8)
    stream = cupy.cuda.Stream(non_blocking=True)
    upload(device.data.ptr, arrays, stream)
    host = cupy.asnumpy(device)
    for offset, arr in arrays:
        assert np.array_equal(host[offset : offset + arr.nbytes].view(np.float32), arr)
