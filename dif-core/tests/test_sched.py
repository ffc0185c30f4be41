"""dif.sched: flow-match sigmas, time shifts, Euler step and CFG arithmetic (plus diffusers/torch parity)."""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import pytest

from dif.errors import DifError
from dif.sched import (
    cfg_combine,
    euler_step,
    flow_match_schedule,
    linear_sigmas,
    shift_static,
    time_shift_exponential,
)

BF16 = np.dtype(ml_dtypes.bfloat16)
# compute_empirical_mu(4096, 4) of the FLUX.2 pipelines (1024x1024, 4 steps)
MU_1024_4 = 2.2911706


def test_linear_sigmas() -> None:
    s = linear_sigmas(4)
    assert s.dtype == np.float32
    np.testing.assert_array_equal(s, np.array([1.0, 0.75, 0.5, 0.25], np.float32))
    with pytest.raises(DifError):
        linear_sigmas(0)


def test_klein_schedule_matches_published_values() -> None:
    sched = flow_match_schedule(4, mu=MU_1024_4)
    np.testing.assert_allclose(sched.sigmas, [1.0, 0.96738, 0.90814, 0.76720, 0.0], atol=1e-5)
    assert sched.sigmas.dtype == np.float32 and sched.timesteps.dtype == np.float32
    np.testing.assert_array_equal(sched.timesteps, sched.sigmas[:-1] * np.float32(1000))
    assert sched.num_steps == 4 and sched.dt(3) == -sched.sigmas[3]


def test_shift_formulas() -> None:
    s = np.array([0.25, 0.5, 0.75], np.float32)
    e = math.exp(1.3)
    np.testing.assert_allclose(time_shift_exponential(s, 1.3), e / (e + (1 / s - 1)), rtol=1e-6)
    np.testing.assert_allclose(shift_static(s, 3.0), 3 * s / (1 + 2 * s), rtol=1e-6)
    assert time_shift_exponential(np.array([1.0], np.float32), 0.5)[0] == 1.0
    with pytest.raises(DifError, match="unknown time shift"):
        flow_match_schedule(4, mu=1.0, shift_type="cubic")


def test_euler_step_f32_and_bf16_dtypes() -> None:
    rng = np.random.default_rng(0)
    x = rng.standard_normal(64).astype(np.float32)
    v = rng.standard_normal(64).astype(np.float32)
    out = euler_step(x, v, -0.25)
    np.testing.assert_array_equal(out, x + np.float32(-0.25) * v)
    out16 = euler_step(x.astype(BF16), v.astype(BF16), -0.0326)
    assert out16.dtype == BF16
    np.testing.assert_allclose(out16.astype(np.float32), x - 0.0326 * v, atol=0.05)


def test_cfg_combine() -> None:
    c = np.array([1.0, 2.0], np.float32)
    u = np.array([0.5, -1.0], np.float32)
    np.testing.assert_array_equal(cfg_combine(c, u, 4.0), u + 4 * (c - u))
    np.testing.assert_array_equal(cfg_combine(c, u, 4.0, base="cond"), c + 4 * (c - u))  # Krea 2
    cb, ub = c.astype(BF16), u.astype(BF16)
    got = cfg_combine(cb, ub, 4.5, base="cond")
    assert got.dtype == BF16
    diff = (cb.astype(np.float32) - ub.astype(np.float32)).astype(BF16)  # each step rounded to bf16
    scaled = (np.float32(4.5) * diff.astype(np.float32)).astype(BF16)
    np.testing.assert_array_equal(got, (cb.astype(np.float32) + scaled.astype(np.float32)).astype(BF16))
    with pytest.raises(DifError, match="unknown CFG base"):
        cfg_combine(c, u, 1.0, base="both")  # type: ignore[arg-type]


def test_schedule_dt_feeds_euler_step_as_float32() -> None:
    sched = flow_match_schedule(3, mu=1.0)
    dt = sched.dt(0)
    assert isinstance(dt, np.float32) and dt < 0
    x = np.ones(4, np.float32)
    np.testing.assert_array_equal(euler_step(x, x, dt), euler_step(x, x, float(dt)))


@pytest.mark.oracle
def test_schedule_matches_diffusers_scheduler() -> None:
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    sched = diffusers.FlowMatchEulerDiscreteScheduler(use_dynamic_shifting=True, time_shift_type="exponential")
    for n, seq in ((4, 4096), (50, 1024), (7, 300)):
        a1, b1, a2, b2 = 8.73809524e-05, 1.89833333, 0.00016927, 0.45666666
        m200, m10 = a2 * seq + b2, a1 * seq + b1
        mu = (m200 - m10) / 190.0 * n + (m200 - 200.0 * (m200 - m10) / 190.0)
        base = np.linspace(1.0, 1 / n, n)
        sched.set_timesteps(n, sigmas=base, mu=mu)
        ours = flow_match_schedule(n, mu=mu)
        np.testing.assert_array_equal(ours.sigmas, sched.sigmas.numpy())
        np.testing.assert_array_equal(ours.timesteps, sched.timesteps.numpy())
        # one Euler step per dtype, bit for bit
        for tdtype, ndtype in ((torch.float32, np.float32), (torch.bfloat16, BF16)):
            g = torch.Generator().manual_seed(n)
            x = torch.randn(2, 16, 8, generator=g).to(tdtype)
            v = torch.randn(2, 16, 8, generator=g).to(tdtype)
            sched._step_index = 1
            ref = sched.step(v, sched.timesteps[1], x, return_dict=False)[0]
            got = euler_step(x.float().numpy().astype(ndtype), v.float().numpy().astype(ndtype), ours.dt(1))
            assert got.dtype == ndtype
            np.testing.assert_array_equal(got.astype(np.float32), ref.float().numpy())


@pytest.mark.oracle
def test_cfg_bf16_matches_torch() -> None:
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(0)
    c = torch.randn(4096, generator=g).to(torch.bfloat16)
    u = torch.randn(4096, generator=g).to(torch.bfloat16)
    ref = (u + 3.5 * (c - u)).float().numpy()
    got = cfg_combine(c.float().numpy().astype(BF16), u.float().numpy().astype(BF16), 3.5)
    np.testing.assert_array_equal(got.astype(np.float32), ref)


def test_gaussian_noise_is_seeded_pcg64() -> None:
    from dif.noise import gaussian_noise

    a = gaussian_noise((2, 3, 4), 42)
    assert a.dtype == np.float32 and a.shape == (2, 3, 4)
    np.testing.assert_array_equal(a, np.random.Generator(np.random.PCG64(42)).standard_normal((2, 3, 4), np.float32))
    assert not np.array_equal(a, gaussian_noise((2, 3, 4), 43))
    assert gaussian_noise((4,), 1, "bf16").dtype == BF16
    with pytest.raises(DifError, match="out of range"):
        gaussian_noise((1,), -1)
