"""Samplers (euler, heun, dpm++2m) and sigma schedules (simple, karras, exponential, beta) against the
diffusers schedulers of the same name over whole loops with a fixed fake velocity model; latents
compared after every step (rel-L2 <= 1e-5 in float32 and float64)."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dif.errors import UsageError
from dif.kit.sampling import sample
from dif.sched import SAMPLERS, SCHEDULERS, FlowMatchSchedule, flow_match_schedule, with_sampling
from dif.sched.sigmas import beta_ppf

TOL = 1e-5
SHAPE = (1, 24, 8)  # (batch, tokens, channels), packed latents


def _weights(dtype: np.dtype) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(11)
    return rng.standard_normal(SHAPE[-1]).astype(dtype), rng.standard_normal(SHAPE[-1]).astype(dtype)


def fake_velocity_np(x: np.ndarray, t: np.floating, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A fixed nonlinear "model": tanh(a x + b t/1000) - 0.3 x, in x's dtype."""
    dt = x.dtype.type
    return (np.tanh(a * x + b * (dt(t) / dt(1000))) - dt(0.3) * x).astype(x.dtype)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    a64, b64 = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.linalg.norm(a64 - b64) / max(np.linalg.norm(b64), 1e-30))


def _ours(schedule: FlowMatchSchedule, x0: np.ndarray, a: np.ndarray, b: np.ndarray) -> list[np.ndarray]:
    steps: list[np.ndarray] = []
    sample(
        x0,
        schedule,
        lambda x, t, _c: fake_velocity_np(x, t, a, b),
        None,
        on_step=lambda _i, _n, x: steps.append(x.copy()),
    )
    return steps


def _theirs(torch, scheduler, x0: np.ndarray, a: np.ndarray, b: np.ndarray, float_t) -> list[np.ndarray]:  # noqa: ANN001
    """The diffusers loop: for t in scheduler.timesteps: x = scheduler.step(model(x, t), t, x). `float_t(k, t)`
    is the float timestep the model sees at call k (DPM's own timesteps are integers)."""
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    x = torch.from_numpy(x0.copy())
    out: list[np.ndarray] = []
    scheduler.set_begin_index(0)
    for k, t in enumerate(scheduler.timesteps):
        tf = float_t(k, t).to(x.dtype)
        v = torch.tanh(ta * x + tb * (tf / 1000)) - 0.3 * x
        x = scheduler.step(v, t, x, return_dict=False)[0]
        out.append(x.numpy().copy())
    return out


def _start(dtype: np.dtype) -> np.ndarray:
    return np.random.default_rng(5).standard_normal(SHAPE).astype(dtype)


MU = 1.7


@pytest.mark.oracle
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("scheduler", SCHEDULERS)
@pytest.mark.parametrize("dynamic", [True, False])
def test_euler_schedules_match_flow_match_euler(dtype: type, scheduler: str, dynamic: bool) -> None:
    """Euler under each schedule vs FlowMatchEulerDiscreteScheduler(use_karras/exponential/beta_sigmas),
    the FLUX.2 way: sigmas linspace(1, 1/n, n) passed in, with dynamic (mu) or static (shift 3) shifting."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    if scheduler == "beta":
        pytest.importorskip("scipy")
    n = 9
    flags = {f"use_{scheduler}_sigmas": True} if scheduler != "simple" else {}
    theirs_sched = diffusers.FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=dynamic, **flags)
    theirs_sched.set_timesteps(sigmas=np.linspace(1.0, 1 / n, n).tolist(), mu=MU if dynamic else None)
    base = flow_match_schedule(n, mu=MU) if dynamic else flow_match_schedule(n, shift=3.0)
    ours_sched = with_sampling(base, sampler="euler", scheduler=scheduler)
    np.testing.assert_allclose(ours_sched.sigmas, theirs_sched.sigmas.numpy(), rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(ours_sched.timesteps, theirs_sched.timesteps.numpy(), rtol=1e-6)
    a, b = _weights(np.dtype(dtype))
    x0 = _start(np.dtype(dtype))
    ours = _ours(ours_sched, x0, a, b)
    theirs = _theirs(torch, theirs_sched, x0, a, b, lambda _k, t: t)
    assert len(ours) == len(theirs) == n
    worst = max(_rel(o, t) for o, t in zip(ours, theirs, strict=True))
    assert worst <= TOL, f"{scheduler}: per-step rel-L2 {worst:.2e}"


def _heun_layout(torch, sched: FlowMatchSchedule):  # noqa: ANN001, ANN202
    """diffusers' Heun sigma / timestep layout of a schedule: s0, s1, s1, ..., s_{n-1}, s_{n-1}, 0."""
    s, t = torch.from_numpy(sched.sigmas), torch.from_numpy(sched.timesteps)
    sigmas = torch.cat([s[:1], s[1:-1].repeat_interleave(2), s[-1:]])
    return sigmas, torch.cat([t[:1], t[1:].repeat_interleave(2)])


@pytest.mark.oracle
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("source", ["diffusers", "klein-karras"])
def test_heun_matches_flow_match_heun(dtype: type, source: str) -> None:
    """Heun vs FlowMatchHeunDiscreteScheduler over a whole loop (2n - 1 model calls): on the scheduler's
    own sigmas (shift 3), and on a mu-shifted Karras schedule put into its sigma layout."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    n = 7
    theirs_sched = diffusers.FlowMatchHeunDiscreteScheduler(shift=3.0)
    theirs_sched.set_timesteps(n)
    if source == "diffusers":
        sig = theirs_sched.sigmas.numpy()
        unique = np.concatenate([sig[:1], sig[1:-1:2], sig[-1:]]).astype(np.float32)
        ours_sched = FlowMatchSchedule(unique, (unique[:-1] * np.float32(1000)).astype(np.float32), sampler="heun")
    else:
        ours_sched = with_sampling(flow_match_schedule(n, mu=MU), sampler="heun", scheduler="karras")
        theirs_sched.sigmas, theirs_sched.timesteps = _heun_layout(torch, ours_sched)
    a, b = _weights(np.dtype(dtype))
    x0 = _start(np.dtype(dtype))
    calls: list[int] = []
    ours = _ours(ours_sched, x0, a, b)
    theirs_all = _theirs(torch, theirs_sched, x0, a, b, lambda k, t: calls.append(k) or t)
    assert len(calls) == 2 * n - 1
    theirs = [*theirs_all[1::2], theirs_all[-1]]  # after each full step: each corrector, then the last Euler step
    assert len(ours) == len(theirs) == n
    worst = max(_rel(o, t) for o, t in zip(ours, theirs, strict=True))
    assert worst <= TOL, f"heun ({source}): per-step rel-L2 {worst:.2e}"


@pytest.mark.oracle
@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # diffusers' own np.array call
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("source", ["diffusers", "klein", "klein-beta"])
def test_dpmpp_2m_matches_dpm_solver_multistep(dtype: type, source: str) -> None:
    """DPM++ 2M vs DPMSolverMultistepScheduler(use_flow_sigmas, flow_prediction; dpmsolver++, order 2,
    midpoint, final sigma 0): on its own flow sigmas (flow_shift 3), and on the klein mu schedule (sigma_0
    = 1) and a beta-respaced one set as its sigmas."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    n = 8
    theirs_sched = diffusers.DPMSolverMultistepScheduler(
        use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0
    )
    theirs_sched.set_timesteps(n)
    if source == "diffusers":
        sig = theirs_sched.sigmas.numpy().astype(np.float32)
        ours_sched = FlowMatchSchedule(sig, (sig[:-1] * np.float32(1000)).astype(np.float32), sampler="dpm++2m")
    else:
        kind = "beta" if source == "klein-beta" else "simple"
        ours_sched = with_sampling(flow_match_schedule(n, mu=MU), sampler="dpm++2m", scheduler=kind)
        theirs_sched.sigmas = torch.from_numpy(ours_sched.sigmas.copy())
    a, b = _weights(np.dtype(dtype))
    x0 = _start(np.dtype(dtype))
    ours = _ours(ours_sched, x0, a, b)
    theirs = _theirs(torch, theirs_sched, x0, a, b, lambda k, _t: theirs_sched.sigmas[k] * 1000)
    assert len(ours) == len(theirs) == n
    worst = max(_rel(o, t) for o, t in zip(ours, theirs, strict=True))
    assert worst <= TOL, f"dpm++2m ({source}): per-step rel-L2 {worst:.2e}"


def test_samplers_differ_and_converge_on_a_linear_field() -> None:
    """On v = (x - c) / sigma (the exact velocity when x0 = c: x = sigma * noise + (1 - sigma) c) every
    sampler lands on c: each step follows the straight line, DPM++ 2M's data prediction is c itself."""
    c = np.full(SHAPE, 0.25, np.float32)
    x0 = _start(np.dtype(np.float32))
    for sampler in SAMPLERS:
        sched = with_sampling(flow_match_schedule(6, mu=MU), sampler=sampler, scheduler="karras")
        out = sample(x0, sched, lambda x, t, _c: (x - c) / (t / np.float32(1000)), None)
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, c, atol=2e-6, err_msg=sampler)


def test_heun_counts_model_calls_and_steps() -> None:
    calls: list[float] = []
    steps: list[int] = []
    sched = with_sampling(flow_match_schedule(5, shift=2.0), sampler="heun")

    def predict(x: np.ndarray, t: np.float32, _c: object) -> np.ndarray:
        calls.append(float(t))
        return np.zeros_like(x)

    sample(_start(np.dtype(np.float32)), sched, predict, None, on_step=lambda i, _n, _x: steps.append(i))
    assert len(calls) == 2 * 5 - 1 and steps == [1, 2, 3, 4, 5]
    assert calls[1] == calls[2] == float(sched.timesteps[1])  # the corrector runs at the next timestep


def test_unknown_sampler_and_scheduler_are_usage_errors() -> None:
    base = flow_match_schedule(4, shift=1.0)
    with pytest.raises(UsageError, match="(?s)sampling method 'lms'.*euler, heun, dpm"):
        with_sampling(base, sampler="lms")
    with pytest.raises(UsageError, match="(?s)scheduler 'ays'.*simple, karras"):
        with_sampling(base, scheduler="ays")


def test_respaced_schedules_keep_the_end_points() -> None:
    base = flow_match_schedule(10, mu=MU)
    for kind in SCHEDULERS:
        s = with_sampling(base, scheduler=kind).sigmas
        assert s[0] == base.sigmas[0] and s[-1] == 0.0 and s.dtype == np.float32
        assert np.isclose(s[-2], base.sigmas[-2], rtol=1e-6) and np.all(np.diff(s) < 0), kind
    assert beta_ppf(0.5, 0.6, 0.6) == pytest.approx(0.5, abs=1e-15)


@pytest.mark.oracle
def test_beta_quantile_matches_scipy() -> None:
    stats = pytest.importorskip("scipy.stats")
    for a, b in ((0.6, 0.6), (2.5, 0.7), (0.3, 4.0)):
        for q in np.linspace(0, 1, 41):
            assert beta_ppf(float(q), a, b) == pytest.approx(stats.beta.ppf(q, a, b), abs=1e-13)


def test_frontend_settings_name_the_same_choices() -> None:
    """The CLI / API settings (`dif.frontend.SAMPLING`) list exactly the samplers, schedules and generators
    the code runs."""
    from dif.frontend import RNG, SAMPLER, SCHEDULER
    from dif.rng import RNGS

    assert SAMPLER.choices == SAMPLERS and SCHEDULER.choices == SCHEDULERS and RNG.choices == RNGS
    assert SAMPLER.flags == ("--sampling-method",)


@pytest.mark.oracle
@pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")
@pytest.mark.parametrize("sampler", SAMPLERS)
def test_bf16_loops_round_as_diffusers(sampler: str) -> None:
    """bf16 latents and model outputs (a float64 fake model rounded to bf16 in both): every step's latents
    equal diffusers' bit for bit (torch's roundings: scalar-first products round the scalar, bf16
    differences round, the sample is upcast where the scheduler upcasts)."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    bf16 = np.dtype(ml_dtypes.bfloat16)
    a, b = _weights(np.dtype(np.float64))
    x0 = _start(np.dtype(np.float32)).astype(bf16)

    def model_np(x: np.ndarray, t: np.floating) -> np.ndarray:
        x64 = x.astype(np.float64)
        return (np.tanh(a * x64 + b * (float(t) / 1000)) - 0.3 * x64).astype(bf16)

    n = 7
    if sampler == "euler":
        theirs_sched = diffusers.FlowMatchEulerDiscreteScheduler(
            shift=3.0, use_dynamic_shifting=True, use_karras_sigmas=True
        )
        theirs_sched.set_timesteps(sigmas=np.linspace(1.0, 1 / n, n).tolist(), mu=MU)
        ours_sched = with_sampling(flow_match_schedule(n, mu=MU), scheduler="karras")
    elif sampler == "heun":
        theirs_sched = diffusers.FlowMatchHeunDiscreteScheduler(shift=3.0)
        theirs_sched.set_timesteps(n)
        sig = theirs_sched.sigmas.numpy()
        unique = np.concatenate([sig[:1], sig[1:-1:2], sig[-1:]]).astype(np.float32)
        ours_sched = FlowMatchSchedule(unique, (unique[:-1] * np.float32(1000)).astype(np.float32), sampler="heun")
    else:
        theirs_sched = diffusers.DPMSolverMultistepScheduler(
            use_flow_sigmas=True, prediction_type="flow_prediction", flow_shift=3.0
        )
        theirs_sched.set_timesteps(n)
        sig = theirs_sched.sigmas.numpy().astype(np.float32)
        ours_sched = FlowMatchSchedule(sig, (sig[:-1] * np.float32(1000)).astype(np.float32), sampler="dpm++2m")
    ours: list[np.ndarray] = []
    sample(x0, ours_sched, lambda x, t, _c: model_np(x, t), None, on_step=lambda _i, _n, x: ours.append(x.copy()))
    ta, tb = torch.from_numpy(a), torch.from_numpy(b)
    x = torch.from_numpy(x0.astype(np.float32)).to(torch.bfloat16)
    theirs_all = []
    theirs_sched.set_begin_index(0)
    for k, t in enumerate(theirs_sched.timesteps):
        tf = float(theirs_sched.sigmas[k] * 1000) if sampler == "dpm++2m" else float(t)
        v = (torch.tanh(ta * x.double() + tb * (tf / 1000)) - 0.3 * x.double()).to(torch.bfloat16)
        x = theirs_sched.step(v, t, x, return_dict=False)[0]
        theirs_all.append(x.float().numpy())
    theirs = [*theirs_all[1::2], theirs_all[-1]] if sampler == "heun" else theirs_all
    assert len(ours) == len(theirs) == n and ours[-1].dtype == bf16
    for i, (o, t_) in enumerate(zip(ours, theirs, strict=True)):
        np.testing.assert_array_equal(o.astype(np.float32), t_, err_msg=f"{sampler} step {i + 1}")
