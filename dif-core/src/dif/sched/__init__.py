"""Sampling schedules for host-side denoising loops (generic; each frontend picks its shift rule)."""

from dif.sched.flow_match import (
    FlowMatchSchedule,
    cfg_combine,
    euler_step,
    flow_match_schedule,
    linear_sigmas,
    shift_static,
    time_shift_exponential,
    time_shift_linear,
    with_sampling,
)
from dif.sched.sigmas import SCHEDULERS, respace_sigmas
from dif.sched.solvers import SAMPLERS

__all__ = [
    "SAMPLERS",
    "SCHEDULERS",
    "FlowMatchSchedule",
    "cfg_combine",
    "euler_step",
    "flow_match_schedule",
    "linear_sigmas",
    "shift_static",
    "time_shift_exponential",
    "respace_sigmas",
    "time_shift_linear",
    "with_sampling",
]
