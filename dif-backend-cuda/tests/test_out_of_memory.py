"""A device allocation CUDA refuses is a `DeviceMemoryError` naming the program, the bytes asked for and
what the device had free, with the --vram-budget hint (issue 14). Runs without a GPU: a fake cupy whose
`cuda.Memory` raises cupy's OutOfMemoryError, as test_upload.py fakes cupy for `upload`."""

from __future__ import annotations

import sys
import types

import pytest

from dif.errors import BackendError, DeviceMemoryError
from dif_backend_cuda import executor


class OutOfMemoryError(Exception):
    """Stands in for cupy.cuda.memory.OutOfMemoryError."""


def _fake_cupy(free: int | None) -> types.ModuleType:
    def memory(nbytes: int) -> object:
        if nbytes > 1000:
            raise OutOfMemoryError(f"Out of memory allocating {nbytes:,} bytes (allocated so far: 0 bytes).")
        return types.SimpleNamespace(ptr=0, size=nbytes)

    def mem_get_info() -> tuple[int, int]:
        if free is None:
            raise RuntimeError("cudaErrorLaunchFailure")  # a device past answering
        return free, 80 << 30

    cupy = types.ModuleType("cupy")
    cupy.cuda = types.SimpleNamespace(  # type: ignore[attr-defined]
        Memory=memory,
        memory=types.SimpleNamespace(OutOfMemoryError=OutOfMemoryError),
        runtime=types.SimpleNamespace(memGetInfo=mem_get_info),
    )
    return cupy


@pytest.mark.parametrize("free", [123456789, None])
def test_out_of_device_memory_names_program_bytes_and_free(monkeypatch: pytest.MonkeyPatch, free: int | None) -> None:
    monkeypatch.setitem(sys.modules, "cupy", _fake_cupy(free))
    assert executor._device_alloc(1000, "plan arena", "flux2_vae_decoder").size == 1000
    with pytest.raises(DeviceMemoryError) as info:
        executor._device_alloc(5 << 30, "plan arena", "flux2_vae_decoder")
    text = str(info.value)
    assert isinstance(info.value, BackendError)  # what callers caught before still catches it
    assert f"cuda backend: program 'flux2_vae_decoder' could not allocate {5 << 30} B for its plan arena" in text
    assert ("(123456789 B free)" if free else "(free memory unknown)") in text
    assert "Out of memory allocating 5,368,709,120 bytes" in text and "--vram-budget" in text
