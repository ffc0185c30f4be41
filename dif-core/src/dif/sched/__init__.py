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
)

__all__ = [
    "FlowMatchSchedule",
    "cfg_combine",
    "euler_step",
    "flow_match_schedule",
    "linear_sigmas",
    "shift_static",
    "time_shift_exponential",
    "time_shift_linear",
]
