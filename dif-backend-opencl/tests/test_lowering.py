"""Pure helpers of the lowering and the buffer pool (no device needed)."""

from __future__ import annotations

import pytest

from dif.errors import NotImplementedOnBackend
from dif_backend_opencl.lower import broadcast_strides, collapse, contiguous_strides, vec8
from dif_backend_opencl.memory import BufferPool, bucket


def test_contiguous_and_broadcast_strides() -> None:
    assert contiguous_strides((2, 3, 4)) == [12, 4, 1]
    assert broadcast_strides((3, 1), (2, 3, 4)) == [0, 1, 0]
    assert broadcast_strides((4,), (2, 3, 4)) == [0, 0, 1]


def test_collapse_merges_contiguous_dims_and_drops_ones() -> None:
    shape, (a, b) = collapse((2, 1, 3, 4), [(12, 12, 4, 1), (0, 0, 0, 1)])
    assert shape == [6, 4] and a == [4, 1] and b == [0, 1]
    shape, (t,) = collapse((2, 3, 4), [(1, 8, 2)])  # the last two dims are contiguous with each other
    assert shape == [2, 12] and t == [1, 2]
    shape, (t,) = collapse((2, 3, 4), [(1, 2, 6)])  # a fully reversed view stays 3-d
    assert shape == [2, 3, 4] and t == [1, 2, 6]


def test_views_beyond_rank_8_are_unsupported_not_wrong() -> None:
    pytest.importorskip("pyopencl")
    with pytest.raises(NotImplementedOnBackend, match="rank 9"):
        vec8(list(range(2, 11)), 1)


@pytest.mark.parametrize("n", [0, 1, 255, 256, 257, 1000, 4097, 10**6, 3 * 2**30 + 5])
def test_bucket_rounds_up_by_at_most_an_eighth(n: int) -> None:
    b = bucket(n)
    assert b >= max(n, 256)
    assert b <= max(256, n + n // 8 + 1) or n <= 256
    assert bucket(b) == b


class _Buf:
    released = 0

    def __init__(self, size: int) -> None:
        self.size = size

    def release(self) -> None:
        _Buf.released += 1


def test_pool_reuses_and_caps_idle_bytes(monkeypatch: pytest.MonkeyPatch) -> None:
    cl = pytest.importorskip("pyopencl")
    monkeypatch.setattr(cl, "Buffer", lambda ctx, flags, size: _Buf(size))
    pool = BufferPool(context=None, max_alloc_bytes=1 << 20, idle_limit_bytes=4096)
    a = pool.acquire(1000)
    pool.release(a)
    assert pool.acquire(1000) is a and pool.allocations == 1
    big = pool.acquire(8192)
    pool.release(big)  # over the idle limit: goes straight back to the driver
    assert pool.idle_bytes == 0 and _Buf.released == 1
    pool.release(a)
    assert pool.trim() == bucket(1000) and pool.idle_bytes == 0
    from dif.errors import BackendError

    with pytest.raises(BackendError, match="largest allocation"):
        pool.acquire(2 << 20)
