"""A training run bounded by wall-clock time as well as by steps (the recipe's GPU run has one device call).

Training recipe helper (outside the package), used by `train_vae.py` and `train_transformer.py`: drives
`dif.train.loop.Trainer.train_step` until `steps` or the deadline, whichever comes first. The learning-rate
schedule's horizon is set from the measured step time every `probe` steps (the first step builds and compiles
the programs, so it is left out of the rate; evaluations and saves count), so the cosine decay ends near the
deadline instead of being cut off at a high learning rate. `checkpoint()` runs every `save_seconds` and once
at the end, so a killed process still leaves the last saved model.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from dif.train.schedule import LrSchedule


def run_until(
    trainer: Any,
    steps: int,
    *,
    deadline: float | None = None,
    on_step: Callable[[Any], None] | None = None,
    checkpoint: Callable[[], None] | None = None,
    save_seconds: float = 0.0,
    probe: int = 20,
) -> dict[str, Any]:
    """Train until `trainer.step == steps` or `time.time() >= deadline` (None: no deadline); returns
    {"steps", "seconds", "stopped": "steps" | "deadline", "horizon"} (horizon: the schedule's final length)."""
    t0 = time.time()
    last_save = t0
    first_done: float | None = None
    start_step = trainer.step
    stopped = "steps"
    while trainer.step < steps:
        if deadline is not None and time.time() >= deadline:
            stopped = "deadline"
            break
        report = trainer.train_step()
        if first_done is None:
            first_done = time.time()
        done = trainer.step - start_step
        if deadline is not None and done > probe and done % probe == 1:  # re-estimated every `probe` steps
            per_step = (time.time() - first_done) / (done - 1)
            left = max(0.0, deadline - time.time())
            horizon = min(steps, trainer.step + int(left / max(per_step, 1e-6)))
            s = trainer.schedule
            total = max(horizon, s.warmup, trainer.step + 1)
            trainer.schedule = LrSchedule(s.peak, total, warmup=s.warmup, cosine=s.cosine, min_ratio=s.min_ratio)
        if on_step is not None:
            on_step(report)
        if checkpoint is not None and save_seconds and time.time() - last_save >= save_seconds:
            checkpoint()
            last_save = time.time()
    if checkpoint is not None:
        checkpoint()
    return {"steps": trainer.step, "seconds": round(time.time() - t0, 1), "stopped": stopped,
            "horizon": trainer.schedule.total}  # fmt: skip
