"""The two MiniMax-H3 schedules and the step rule against diffusers' MiniMaxH3Scheduler (bit-exact on
sigmas / timesteps for several step counts and both shifts; the step to 1e-7)."""

from __future__ import annotations

import numpy as np
import pytest

from dif.errors import UsageError
from dif_frontend_h3.schedule import H3Schedule

pytestmark = pytest.mark.oracle


@pytest.mark.parametrize("steps", [2, 3, 8, 50, 51, 1000])
@pytest.mark.parametrize("shift", [12.0, 3.0])
def test_sigmas_and_timesteps_exact(torch, steps: int, shift: float) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    ref = diffusers.MiniMaxH3Scheduler(shift=shift)
    ref.set_timesteps(steps)
    sched = H3Schedule.make(steps, shift)
    np.testing.assert_array_equal(sched.sigmas, ref.sigmas.numpy())
    np.testing.assert_array_equal(sched.timesteps, ref.timesteps.numpy())


def test_step_matches(torch) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    ref = diffusers.MiniMaxH3Scheduler(shift=12.0)
    ref.set_timesteps(6)
    sched = H3Schedule.make(6, 12.0)
    rng = np.random.default_rng(0)
    x = rng.standard_normal((7, 5)).astype(np.float32)
    y = x.copy()
    for i, t in enumerate(ref.timesteps):
        v = rng.standard_normal((7, 5)).astype(np.float32)
        x = ref.step(torch.from_numpy(v), t, torch.from_numpy(x), return_dict=False)[0].numpy()
        y = sched.step(i, v, y)
        np.testing.assert_allclose(y, x, rtol=1e-6, atol=1e-7)


def test_too_few_steps_refused() -> None:
    with pytest.raises(UsageError, match="at least 2"):
        H3Schedule.make(1, 12.0)
