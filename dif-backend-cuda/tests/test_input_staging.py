"""Input staging (`CudaExecutable.stage_inputs`, `upload_inputs`): an input that is the same frozen array as at the
previous run is copied neither into the pinned mirrors nor to the device again; anything that could have changed
is. The rules run anywhere; the runs need a GPU (marker `cuda`, skipped with the reason without one)."""

from __future__ import annotations

import numpy as np
import pytest

from dif.ir.builder import ProgramBuilder
from dif.kit.sampling import step_invariant
from dif_backend_cuda.executor import _frozen, copy_ranges

from .conftest import cuda_skip_reason


def test_frozen_means_nothing_can_change_the_values() -> None:
    owner = step_invariant(np.zeros(8, np.float32))
    assert _frozen(owner)
    assert _frozen(step_invariant(owner[2:]))  # a view of a frozen array
    assert not _frozen(np.zeros(8, np.float32))  # writeable
    writeable = np.zeros(8, np.float32)
    assert not _frozen(step_invariant(writeable[2:]))  # a read-only view changes through its writeable base
    assert not _frozen(step_invariant(np.frombuffer(bytearray(32), np.float32)))  # a buffer someone else may write


def test_the_slots_to_upload_are_copied_in_few_ranges() -> None:
    assert copy_ranges([]) == []
    assert copy_ranges([(512, 256), (0, 256)], gap=1024) == [(0, 768)]  # out of order, the bytes between copied
    assert copy_ranges([(0, 256), (1 << 20, 256)], gap=1024) == [(0, 256), (1 << 20, 256)]  # far apart: two copies
    assert copy_ranges([(0, 4096), (256, 256), (8192, 0)], gap=0) == [(0, 4096)]  # within another; empty ones none


@pytest.mark.cuda
def test_a_frozen_input_passed_again_is_not_restaged_and_a_changed_one_is() -> None:
    reason = cuda_skip_reason()
    if reason is not None:
        pytest.skip(f"no usable GPU: {reason}")
    from dif.plan.planner import plan_program
    from dif_backend_cuda.device import CudaBackend

    b = ProgramBuilder("staging")
    x, c = b.input("x", (4, 64), "f32"), b.input("c", (4, 64), "f32")
    b.output(b.emit("add", x, c))
    program = b.build()
    backend = CudaBackend()
    exe = backend.prepare(program, plan_program(program, backend.profile(), backend.budget()), {})
    rng = np.random.default_rng(0)
    const = step_invariant(rng.standard_normal((4, 64)).astype(np.float32))
    for _ in range(2):  # the frozen constant staged once, the writeable input every time
        x_in = rng.standard_normal((4, 64)).astype(np.float32)
        (got,) = exe.run({"x": x_in, "c": const}).values()
        np.testing.assert_allclose(got, x_in + const, rtol=1e-6)
        assert exe.staged == {"c": const}
    exe.in_host["c"][...] = np.nan
    (got,) = exe.run({"x": x_in, "c": const}).values()
    assert np.isnan(exe.in_host["c"]).all()  # not copied into the mirror again
    np.testing.assert_allclose(got, x_in + const, rtol=1e-6)  # nor the mirror to the device
    exe.in_host["c"][...] = const  # the mirror as the device slot still has it
    other = step_invariant(const.copy())  # equal values, another array: copied
    (got,) = exe.run({"x": x_in, "c": other}).values()
    np.testing.assert_allclose(got, x_in + const, rtol=1e-6)
    writeable = const.copy()
    exe.run({"x": x_in, "c": writeable})
    writeable += 1.0  # changed in place between runs: copied again
    (got,) = exe.run({"x": x_in, "c": writeable}).values()
    np.testing.assert_allclose(got, x_in + writeable, rtol=1e-6)
    assert "c" not in exe.staged
