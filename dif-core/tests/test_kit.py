"""The frontend kit's click-free parts: a diffusers scheduler config read into `dif.sched` numbers
(dif.kit.scheduler) and the one sampling loop (dif.kit.sampling)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dif.errors import CheckpointError
from dif.kit.sampling import sample
from dif.kit.scheduler import FlowMatchConfig, load_scheduler_config, parse_scheduler_config
from dif.sched import cfg_combine, euler_step, flow_match_schedule

KLEIN = {  # a published FLUX.2 [klein] scheduler_config.json
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": "0.37.0.dev0",
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "shift_terminal": None,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}


def _write(root: Path, data: dict) -> Path:
    (root / "scheduler").mkdir(parents=True, exist_ok=True)
    path = root / "scheduler" / "scheduler_config.json"
    path.write_text(json.dumps(data))
    return path


def test_a_published_config_reads_every_number(tmp_path: Path) -> None:
    _write(tmp_path, {**KLEIN, "num_train_timesteps": 500, "max_image_seq_len": 6400})
    cfg = load_scheduler_config(tmp_path)
    assert cfg == FlowMatchConfig(500, 3.0, True, 0.5, 1.15, 256, 6400, "exponential")
    assert cfg.mu_for(256) == pytest.approx(0.5) and cfg.mu_for(6400) == pytest.approx(1.15)
    got = cfg.schedule(4, mu=1.7)
    want = flow_match_schedule(4, mu=1.7, num_train_timesteps=500)
    np.testing.assert_array_equal(got.sigmas, want.sigmas)
    np.testing.assert_array_equal(got.timesteps, want.timesteps)  # 500 * sigma
    assert got.mu == 1.7


def test_sparse_config_keeps_the_defaults_and_static_shift_ignores_mu(tmp_path: Path) -> None:
    assert parse_scheduler_config({}, where="x") == FlowMatchConfig()  # diffusers' class defaults
    assert parse_scheduler_config({"shift": 2}, where="x") == FlowMatchConfig(shift=2.0)
    klein = FlowMatchConfig(shift=3.0, use_dynamic_shifting=True)
    assert load_scheduler_config(tmp_path, missing=klein) is klein  # no file: the model's published one
    with pytest.raises(CheckpointError, match="scheduler config not found"):
        load_scheduler_config(tmp_path)
    static = FlowMatchConfig(shift=3.0).schedule(3, mu=2.0)
    np.testing.assert_array_equal(static.sigmas, flow_match_schedule(3, shift=3.0).sigmas)
    assert static.mu is None
    linear = parse_scheduler_config({"use_dynamic_shifting": True, "time_shift_type": "linear"}, where="x")
    np.testing.assert_array_equal(
        linear.schedule(3, mu=0.8).sigmas, flow_match_schedule(3, mu=0.8, shift_type="linear").sigmas
    )


@pytest.mark.parametrize(
    ("change", "says"),
    [
        ({"use_karras_sigmas": True}, "'use_karras_sigmas' = True is not supported"),
        ({"shift_terminal": 0.02}, "'shift_terminal' = 0.02 is not supported"),
        ({"stochastic_sampling": True}, "'stochastic_sampling'"),
        ({"use_magic": 1}, "unknown scheduler key.*'use_magic'"),
        ({"_class_name": "DDIMScheduler"}, "'DDIMScheduler' is not supported"),
        ({"shift": "three"}, "'shift' = 'three' is not a float"),
        ({"num_train_timesteps": 0}, "'num_train_timesteps' = 0 is not a positive int"),
        ({"use_dynamic_shifting": "yes"}, "'use_dynamic_shifting' = 'yes' is not a bool"),
        ({"time_shift_type": "cubic"}, "'time_shift_type' = 'cubic' is not 'exponential' or 'linear'"),
        ({"max_image_seq_len": 256}, "equals 'base_image_seq_len'"),
    ],
)
def test_bad_config_is_an_error_naming_file_and_key(tmp_path: Path, change: dict, says: str) -> None:
    path = _write(tmp_path, {**KLEIN, **change})
    with pytest.raises(CheckpointError, match=says) as err:
        load_scheduler_config(tmp_path)
    assert str(err.value).startswith(str(path))


def test_dynamic_shift_needs_mu() -> None:
    with pytest.raises(CheckpointError, match="needs mu"):
        FlowMatchConfig(use_dynamic_shifting=True).schedule(4)


def _toy_predict(calls: list[str]):  # type: ignore[no-untyped-def]
    """velocity = latents * cond + t / 1000, so every input changes the result."""

    def predict(x: np.ndarray, t: np.float32, cond: float) -> np.ndarray:
        calls.append(f"{cond}@{float(t):.0f}")
        return (x * np.float32(cond) + t / np.float32(1000)).astype(x.dtype)

    return predict


def test_the_loop_steps_euler_and_hands_each_step_latents_to_the_callback() -> None:
    schedule = flow_match_schedule(3, mu=1.0)
    x0 = np.random.default_rng(0).standard_normal((1, 4, 2)).astype(np.float32)
    seen: list[tuple[int, int, np.ndarray]] = []
    calls: list[str] = []
    out = sample(x0, schedule, _toy_predict(calls), 0.5, on_step=lambda i, n, x: seen.append((i, n, x.copy())))
    x = x0
    for i, t in enumerate(schedule.timesteps):
        x = euler_step(x, x * np.float32(0.5) + t / np.float32(1000), schedule.dt(i))
        np.testing.assert_array_equal(seen[i][2], x)  # the latents after step i + 1
    assert [(i, n) for i, n, _ in seen] == [(1, 3), (2, 3), (3, 3)]
    np.testing.assert_array_equal(out, x)
    assert len(calls) == 3  # no CFG: one model call a step


@pytest.mark.parametrize("base", ["uncond", "cond"])
def test_cfg_calls_the_model_twice_and_combines_by_the_models_rule(base: str) -> None:
    schedule = flow_match_schedule(2, shift=1.0)
    x0 = np.full((1, 2, 2), 0.25, np.float32)
    calls: list[str] = []
    predict = _toy_predict(calls)
    out = sample(x0, schedule, predict, 2.0, uncond=-1.0, guidance=3.0, cfg_base=base)  # type: ignore[arg-type]
    x = x0
    for i, t in enumerate(schedule.timesteps):
        v = cfg_combine(predict(x, t, 2.0), predict(x, t, -1.0), 3.0, base=base)  # type: ignore[arg-type]
        x = euler_step(x, v, schedule.dt(i))
    np.testing.assert_array_equal(out, x)
    assert calls[:4] == ["2.0@1000", "-1.0@1000", "2.0@500", "-1.0@500"]
