"""An arena the host cannot hold is a `DeviceMemoryError` naming the program, the bytes asked for and
what was free, with the --vram-budget hint (issue 14), not a numpy MemoryError traceback."""

from __future__ import annotations

import numpy as np
import pytest
from attrs import evolve

from dif.errors import DeviceMemoryError, DifError
from dif.ir.builder import ProgramBuilder
from dif.plan.planner import plan_program
from dif_backend_cpu import ArenaExecutable, CpuBackend


def test_an_arena_numpy_cannot_allocate_is_a_dif_error() -> None:
    b = ProgramBuilder("oom_probe")
    x = b.input("x", (2, 3), "f32")
    b.output(b.emit("exp", b.emit("exp", x)))
    program = b.build()
    backend = CpuBackend()
    plan = plan_program(program, backend.profile(), backend.budget())
    assert backend.prepare(program, plan, {}).run({"x": np.zeros((2, 3), np.float32)})  # the plan itself is fine
    huge = evolve(plan, arena_bytes=1 << 60)  # 1 EiB: numpy raises MemoryError at once
    with pytest.raises(DeviceMemoryError) as info:
        ArenaExecutable.create(program, huge, {}, table=backend.table, backend="cpu", check=False)
    text = str(info.value)
    assert isinstance(info.value, DifError)
    assert f"cpu backend: program 'oom_probe' could not allocate {1 << 60} B for its plan arena (" in text
    assert " B free)" in text and "--vram-budget" in text


def test_a_kernel_running_out_of_memory_names_the_op_and_the_bytes() -> None:
    b = ProgramBuilder("oom_kernel_probe")
    x = b.input("x", (2, 3), "f32")
    b.output(b.emit("exp", x))
    program = b.build()
    backend = CpuBackend()
    exe = backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), {})
    (node,) = program.nodes

    def scores_too_large(operands: object, attrs: object) -> object:
        return np.empty((1 << 20, 1 << 20), np.float32)  # 4 TiB: like the reference sdpa's scores at 16384^2

    exe.kernels[node.id] = scores_too_large
    with pytest.raises(DeviceMemoryError) as info:
        exe.run({"x": np.zeros((2, 3), np.float32)})
    text = str(info.value)
    assert f"program 'oom_kernel_probe' could not allocate {1 << 42} B for its op 'exp' (node {node.id})" in text
    assert "Unable to allocate" in text and "--vram-budget" in text
