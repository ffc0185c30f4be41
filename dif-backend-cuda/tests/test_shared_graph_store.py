"""`CudnnContext.shared_graph` without a GPU (a fake build, a real tuning store): a problem cuDNN refused is
refused by a later process from the store without building again, except while tuning (which retries
everything); one refused problem does not touch another's entry."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from dif.errors import BackendError
from dif_backend_cuda.sdpa import LARGE_HEADROOM_BYTES, LARGE_WORKSPACE_BYTES, CudnnContext, LargeWorkspace
from dif_backend_cuda.tuning import Choices

DEVICE = {"device": "NVIDIA H200", "arch": "sm_90", "driver": "13000", "runtime": "13000"}
KEY = ("sdpa", "bf16", 1, 512, 512, 32, 8, 128, 0.088, True, True, 1, 4096, 1024, 1024, 4096)


def context(root: Path, mode: str) -> CudnnContext:
    ctx = CudnnContext.__new__(CudnnContext)  # no cuDNN here: only what shared_graph reads
    ctx.lib = ctx.handle = ctx.stream = None
    ctx.choices = Choices("cudnn", "cudnn 91900", DEVICE, mode, root)
    ctx._graphs = {}
    ctx.workspace_bytes, ctx._workspace, ctx._large = 256 << 20, None, LargeWorkspace()
    ctx.free_bytes = lambda: 80 << 30  # an H100 with its programs prepared
    return ctx


class Refusing:
    def __init__(self) -> None:
        self.limits: list[int | None] = []

    @property
    def calls(self) -> int:
        """Problems tried: each within the large workspace, then without a limit."""
        assert len(self.limits) % 2 == 0
        assert all(self.limits[i] == LARGE_WORKSPACE_BYTES for i in range(0, len(self.limits), 2))
        assert all(limit is None for limit in self.limits[1::2])
        return len(self.limits) // 2

    def __call__(self, limit: int | None) -> Any:
        self.limits.append(limit)
        raise RuntimeError("CUDNN_STATUS_NOT_SUPPORTED: no engine for this bias broadcast")


def test_a_refusal_is_remembered_across_processes_but_retried_while_tuning(tmp_path: Path) -> None:
    build = Refusing()
    first = context(tmp_path, "cached")
    for _ in range(2):  # a second node of the same problem: refused from memory
        with pytest.raises(RuntimeError, match="NOT_SUPPORTED"):
            first.shared_graph(KEY, build, {"q": 1})
    assert build.calls == 1
    with pytest.raises(BackendError, match="refused it before: RuntimeError: CUDNN_STATUS_NOT_SUPPORTED"):
        context(tmp_path, "cached").shared_graph(KEY, build, {"q": 1})
    assert build.calls == 1  # the later process did not build
    with pytest.raises(RuntimeError, match="NOT_SUPPORTED"):
        context(tmp_path, "on").shared_graph(KEY, build, {"q": 1})
    assert build.calls == 2
    other = (*KEY[:-1], 8192)
    with pytest.raises(RuntimeError):
        context(tmp_path, "cached").shared_graph(other, build, {"q": 1})
    assert build.calls == 3  # another problem is not refused on the first one's account


class FakeMemory:
    """cupy.cuda.Memory without a GPU: its size, at a made-up address."""

    allocated: list[int] = []

    def __init__(self, nbytes: int) -> None:
        self.nbytes, self.ptr = nbytes, 1 << 40 | len(self.allocated) << 32
        self.allocated.append(nbytes)


@pytest.fixture
def fake_cupy(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    import types

    FakeMemory.allocated = []
    module = types.SimpleNamespace(cuda=types.SimpleNamespace(Memory=FakeMemory))
    monkeypatch.setitem(sys.modules, "cupy", module)
    return FakeMemory.allocated


def test_plans_beyond_the_shared_workspace_share_one_buffer_of_the_largest_need(
    tmp_path: Path, fake_cupy: list[int]
) -> None:
    ctx = context(tmp_path, "cached")
    mib = 1 << 20
    needs = (257 * mib, 512 * mib, 1024 * mib)  # a VAE decoder's convolutions, in program order
    spaces = [ctx.workspace(n) for n in needs]
    assert all(s is spaces[0] for s in spaces) and not fake_cupy  # nothing allocated while the program lowers
    address = spaces[0].ptr  # its first execution
    assert fake_cupy == [1024 * mib] and spaces[0].ptr == address
    assert ctx.workspace(600 * mib) is spaces[0]  # a later program's need that fits: the same buffer
    bigger = ctx.workspace(1536 * mib)  # one that does not: a new buffer; the graphs given the old one keep it
    assert bigger is not spaces[0] and bigger.ptr != address and fake_cupy == [1024 * mib, 1536 * mib]
    own = ctx.workspace(LARGE_WORKSPACE_BYTES + 1)  # beyond the large workspace: a buffer of its own
    assert own.nbytes == LARGE_WORKSPACE_BYTES + 1 and ctx.workspace(64 * mib).nbytes == 256 * mib


def test_the_large_workspace_is_offered_only_where_the_device_has_room_for_it(tmp_path: Path) -> None:
    ctx = context(tmp_path, "cached")
    room = LARGE_WORKSPACE_BYTES + LARGE_HEADROOM_BYTES
    ctx.free_bytes = lambda: room
    assert ctx.workspace_limit() == LARGE_WORKSPACE_BYTES
    ctx._large.reserve(1 << 30)  # reserved by an earlier graph and not yet allocated: not free any more
    assert ctx.workspace_limit() == 256 << 20
    ctx.free_bytes = lambda: room + (1 << 30)
    assert ctx.workspace_limit() == LARGE_WORKSPACE_BYTES


def test_the_limit_keys_the_store_but_not_the_problem(tmp_path: Path) -> None:
    """A refusal stored under the large limit is not read back under the shared one (another plan list), and a
    second node of the problem in the same process gets the first one's outcome whatever memory is free then."""
    build = Refusing()
    first = context(tmp_path, "cached")
    with pytest.raises(RuntimeError):
        first.shared_graph(KEY, build, {"q": 1})
    first.free_bytes = lambda: 1 << 30
    with pytest.raises(RuntimeError):
        first.shared_graph(KEY, build, {"q": 1})
    assert build.calls == 1
    tight = context(tmp_path, "cached")
    tight.free_bytes = lambda: 1 << 30
    with pytest.raises(RuntimeError, match="NOT_SUPPORTED"):  # built (and refused) again, not read back
        tight.shared_graph(KEY, build, {"q": 1})
    assert build.limits[-2:] == [256 << 20, None]
