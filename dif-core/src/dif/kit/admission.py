"""Admission of an image request before anything large is allocated: the token count against
what the checkpoint's schedule can represent, and the host memory the run's arrays will hold
against what is free.

Where it sits: a frontend pipeline's `resolve` calls `admit_image` once the size and steps are
known, so both the CLI (which resolves before the "load" stage) and `dif.load(...)(...)` refuse
a size with a `UsageError` naming the size, the limit and why, instead of drawing gigabytes of
noise first or overflowing inside the schedule. Device memory is the planner's (a `PlanError`
before any device allocation); the figures here are lower bounds, never guesses of a plan.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from dif.dtypes import DType
from dif.errors import DifError, UsageError
from dif.sched import FlowMatchSchedule

MAX_STEPS = 10_000
"""The most sampling steps a run may ask for: past every published sampler's count by far, and still
steps of 1e-4 in sigma (a billion steps would draw a 4 GB schedule and run for years)."""

Schedule = Callable[[int, int], FlowMatchSchedule]
"""(image tokens, steps) -> the run's schedule (a pipeline's `schedule`)."""


def host_bytes(tokens: int, channels: int, pixels: int, dtype: DType, *, cfg: bool) -> int:
    """Bytes of the host arrays a run holds together at its peak, a lower bound: the seeded noise
    (float32, unpacked and packed), the latents, the velocity (twice under CFG) and the next latents
    in the run dtype, and the decoded image (float32 (1, 3, H, W)) with its uint8 copy."""
    latent = tokens * channels
    run = np.dtype(dtype.np).itemsize
    return latent * (4 + 4) + latent * run * (4 if cfg else 3) + pixels * 3 * (4 + 1)


def _schedule_ok(schedule: Schedule, tokens: int, steps: int) -> bool:
    try:
        return bool(np.isfinite(schedule(tokens, steps).sigmas).all())
    except DifError:
        return False


def largest_schedulable(schedule: Schedule, steps: int, above: int) -> int:
    """The largest token count <= `above` whose schedule at `steps` is finite (bisection; the
    schedules' shifts grow with the token count), 0 when even one token is not."""
    if not _schedule_ok(schedule, 1, steps):
        return 0
    lo, hi = 1, above
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if _schedule_ok(schedule, mid, steps) else (lo, mid - 1)
    return lo


def admit_image(
    width: int,
    height: int,
    *,
    pixels_per_token: int,
    channels: int,
    steps: int,
    cfg: bool,
    dtype: DType,
    schedule: Schedule,
    free_host_bytes: int | None = None,
    guidance: float = 0.0,
    batch: int = 1,
) -> None:
    """`UsageError` unless a `width` x `height` run (a multiple of `pixels_per_token`; latent tokens
    of `channels` packed channels) can start: at most `MAX_STEPS` steps, its schedule is finite, and `host_bytes`
    fits `free_host_bytes` (default: the host's available memory now; 0 = unknown, not checked) for
    each of the `batch` images; `guidance` must be finite."""
    from dif.host import available_memory_bytes

    if not np.isfinite(guidance):  # click's FloatRange parses "nan" and "inf"
        raise UsageError(f"guidance {guidance} is not a finite number")
    if steps > MAX_STEPS:
        raise UsageError(f"steps {steps} is more than {MAX_STEPS}", hint="flow-match samplers use 1-100 steps")
    size = f"{width}x{height}"
    tokens = (width // pixels_per_token) * (height // pixels_per_token)
    schedule(1, steps)  # a config the schedule refuses at any size is the config's error, raised as it is
    if not _schedule_ok(schedule, tokens, steps):
        most = largest_schedulable(schedule, steps, tokens)
        side = int(np.sqrt(most)) * pixels_per_token
        raise UsageError(
            f"image size {size} ({tokens} latent tokens) is beyond this checkpoint's sampling schedule: "
            f"its resolution shift overflows float32 above {most} tokens at {steps} steps",
            hint=f"use a smaller size (at most about {side}x{side})",
        )
    free = available_memory_bytes() if free_host_bytes is None else free_host_bytes
    need = host_bytes(tokens, channels, width * height, dtype, cfg=cfg) * batch
    if free and need > free:
        raise UsageError(
            f"image size {size}{f' x {batch} images' if batch > 1 else ''} needs at least {_gib(need)} of host "
            f"memory for its latents and image ({tokens} latent tokens x {channels} channels, {width * height} "
            f"pixels{' each' if batch > 1 else ''}), but {_gib(free)} is available",
            hint="use a smaller size" + (" or batch" if batch > 1 else "") + ", or free host memory",
        )


def _gib(nbytes: int) -> str:
    return f"{nbytes / 2**30:.2f} GiB"
