"""A device allocation the OpenCL driver refuses is a `DeviceMemoryError` naming the program, the bytes
asked for and what the device had free, with the --vram-budget hint (issue 14). The allocator is made
to fail by monkeypatching `pyopencl.Buffer` (PoCL would otherwise hand out host memory lazily)."""

from __future__ import annotations

import numpy as np
import pytest

from dif.errors import DeviceMemoryError
from dif.ir.builder import ProgramBuilder
from dif.runtime import prepare


@pytest.mark.parametrize("failure", ["cl", "python"])
def test_a_refused_buffer_names_program_bytes_and_free_memory(
    ocl: object, monkeypatch: pytest.MonkeyPatch, failure: str
) -> None:
    import pyopencl as cl  # `ocl` skips the test where no OpenCL platform exists

    from dif_backend_opencl.device import OpenCLBackend

    backend = OpenCLBackend(host_eval_max_bytes=0)  # a fresh pool: every buffer is a new allocation
    b = ProgramBuilder("ocl_oom_probe")
    x = b.input("x", (4, 8), "f32")
    b.output(b.emit("exp", b.emit("exp", x)))
    program = b.build()
    exe, _ = prepare(program, {}, backend=backend)  # it fits when the driver says yes
    np.testing.assert_allclose(exe.run({"x": np.zeros((4, 8), np.float32)})[program.outputs[0]], np.e, rtol=1e-5)

    def refuse(*args: object, **kwargs: object) -> None:
        if failure == "cl":
            raise cl.MemoryError("clCreateBuffer failed: MEM_OBJECT_ALLOCATION_FAILURE")
        raise MemoryError

    monkeypatch.setattr(cl, "Buffer", refuse)
    fresh = OpenCLBackend(host_eval_max_bytes=0)
    with pytest.raises(DeviceMemoryError) as info:
        prepare(program, {}, backend=fresh)
    text = str(info.value)
    assert "opencl backend: program 'ocl_oom_probe' could not allocate " in text
    assert " B for its device buffer (" in text
    assert f"({fresh.budget().free_memory_bytes} B free)" in text and "--vram-budget" in text
    assert ("MEM_OBJECT_ALLOCATION_FAILURE" in text) == (failure == "cl")


def test_a_driver_failing_on_first_use_names_the_program_too(ocl: object) -> None:
    import pyopencl as cl

    from dif_backend_opencl.device import OpenCLBackend

    b = ProgramBuilder("ocl_lazy_oom_probe")
    x = b.input("x", (4, 8), "f32")
    b.output(b.emit("exp", b.emit("exp", x)))
    program = b.build()
    backend = OpenCLBackend(host_eval_max_bytes=0)
    exe, _ = prepare(program, {}, backend=backend)

    class Refused:
        node_id = -1

        def enqueue(self, queue: object) -> None:
            raise cl.MemoryError("clEnqueueNDRangeKernel failed: MEM_OBJECT_ALLOCATION_FAILURE")

    exe.steps.insert(0, Refused())  # type: ignore[attr-defined]
    with pytest.raises(DeviceMemoryError) as info:
        exe.run({"x": np.zeros((4, 8), np.float32)})
    text = str(info.value)
    held = sum(int(buf.size) for buf in exe.owned)  # type: ignore[attr-defined]
    assert f"opencl backend: program 'ocl_lazy_oom_probe' could not allocate {held} B for its device buffers" in text
    assert "MEM_OBJECT_ALLOCATION_FAILURE" in text and "--vram-budget" in text
