"""A diffusers `FlowMatchEulerDiscreteScheduler` config (scheduler/scheduler_config.json) as the
numbers `dif.sched.flow_match_schedule` takes: one parser for every flow-match frontend.

Where it sits: a frontend's pipeline reads its checkpoint's scheduler config once, then asks
`FlowMatchConfig.schedule(steps, mu=...)` per run; the model's own mu rule (FLUX.2's empirical mu,
Krea 2 Turbo's fixed mu) stays in the frontend, `mu_for` is the scheduler's resolution line.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import fields, frozen

from dif.checkpoint import read_json_object
from dif.errors import CheckpointError
from dif.sched import FlowMatchSchedule, flow_match_schedule

SCHEDULER_CLASS = "FlowMatchEulerDiscreteScheduler"

# Options that change the sigmas in ways dif does not implement: an error when set, never ignored.
UNSUPPORTED_FLAGS = (
    "use_karras_sigmas",
    "use_exponential_sigmas",
    "use_beta_sigmas",
    "invert_sigmas",
    "stochastic_sampling",
    "shift_terminal",
)


@frozen
class FlowMatchConfig:
    """The fields of a FlowMatchEulerDiscreteScheduler config that change the numbers; the
    defaults are diffusers' class defaults, so a sparse config means the same here."""

    num_train_timesteps: int = 1000
    shift: float = 1.0
    use_dynamic_shifting: bool = False
    base_shift: float = 0.5
    max_shift: float = 1.15
    base_image_seq_len: int = 256
    max_image_seq_len: int = 4096
    time_shift_type: str = "exponential"

    def mu_for(self, image_seq_len: int) -> float:
        """The scheduler's resolution-dependent shift: the line through (base_image_seq_len,
        base_shift) and (max_image_seq_len, max_shift) at `image_seq_len` tokens, extrapolated."""
        slope = (self.max_shift - self.base_shift) / (self.max_image_seq_len - self.base_image_seq_len)
        return image_seq_len * slope + (self.base_shift - slope * self.base_image_seq_len)

    def schedule(self, steps: int, *, mu: float | None = None) -> FlowMatchSchedule:
        """Sigmas for `steps` Euler steps: under dynamic shifting the time shift of `time_shift_type`
        by `mu` (the model's rule; `mu_for(tokens)` when the model has none), otherwise the static
        `shift` (mu is then ignored, as diffusers ignores it)."""
        if not self.use_dynamic_shifting:
            return flow_match_schedule(steps, shift=self.shift, num_train_timesteps=self.num_train_timesteps)
        if mu is None:
            raise CheckpointError("a dynamically shifted schedule needs mu", hint="pass mu=config.mu_for(tokens)")
        return flow_match_schedule(
            steps, mu=mu, shift_type=self.time_shift_type, num_train_timesteps=self.num_train_timesteps
        )


_KINDS: dict[str, type] = {f.name: type(f.default) for f in fields(FlowMatchConfig)}  # defaults are typed
_SHIFT_TYPES = ("exponential", "linear")


def parse_scheduler_config(data: Mapping[str, Any], *, where: str) -> FlowMatchConfig:
    """`data` (a scheduler_config.json object) as a `FlowMatchConfig`; keys it lacks keep diffusers'
    class defaults, as diffusers reads it. `CheckpointError` naming `where` and the key for another
    scheduler class, a set unsupported option, an unknown key or a value of the wrong kind."""
    name = data.get("_class_name", SCHEDULER_CLASS)
    if name != SCHEDULER_CLASS:
        raise CheckpointError(f"{where}: _class_name {name!r} is not supported (dif runs {SCHEDULER_CLASS})")
    for key in UNSUPPORTED_FLAGS:
        if data.get(key) not in (None, False):
            raise CheckpointError(
                f"{where}: '{key}' = {data[key]!r} is not supported by dif", hint=f"remove '{key}' or set it false/null"
            )
    unknown = sorted(k for k in data if not k.startswith("_") and k not in _KINDS and k not in UNSUPPORTED_FLAGS)
    if unknown:
        raise CheckpointError(f"{where}: unknown scheduler key(s) {', '.join(repr(k) for k in unknown)}")
    values: dict[str, Any] = {}
    for key, kind in _KINDS.items():
        if key in data:
            values[key] = _value(where, key, data[key], kind)
    config = FlowMatchConfig(**values)
    if config.max_image_seq_len == config.base_image_seq_len:
        raise CheckpointError(f"{where}: 'max_image_seq_len' equals 'base_image_seq_len' (mu's line is undefined)")
    return config


def _finite_number(value: Any) -> bool:
    """A JSON number that is a finite float64 (not a boolean, NaN, Infinity or an integer past 1e308)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _value(where: str, key: str, value: Any, kind: type) -> Any:
    """`value` of `key` as `kind`; `CheckpointError` naming the file and key when it is not one."""
    number = _finite_number(value)
    if kind is bool:
        ok = isinstance(value, bool)
    elif kind is str:
        ok = value in _SHIFT_TYPES
    elif kind is int:
        ok = number and float(value).is_integer() and value > 0
    else:
        ok = number
    if not ok:
        positive = "positive " if kind is int else ""
        expected = " or ".join(map(repr, _SHIFT_TYPES)) if kind is str else f"a {positive}{kind.__name__}"
        raise CheckpointError(f"{where}: '{key}' = {value!r} is not {expected}")
    return kind(value)


def load_scheduler_config(folder: str | Path, *, missing: FlowMatchConfig | None = None) -> FlowMatchConfig:
    """The scheduler config of the diffusers folder `folder` (scheduler/scheduler_config.json);
    `missing` (the model's published scheduler) stands in when the file is absent, a
    `CheckpointError` then if it is None."""
    path = Path(folder) / "scheduler" / "scheduler_config.json"
    if not path.is_file():
        if missing is not None:
            return missing
        raise CheckpointError(f"{path}: scheduler config not found", hint="a diffusers folder has scheduler/")
    return parse_scheduler_config(read_json_object(path), where=str(path))
