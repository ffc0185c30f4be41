"""Training through the same IR: step programs (forward + loss + gradients + AdamW in one program),
the loop with checkpoint / resume (`.diftrain`), data folders with aspect buckets and cached features,
flow-matching targets, LoRA initialisation and export. Models plug in through `dif.train.loop.Task`
and register with `dif.train.tasks` (imported by frontend plugins, so this package loads lazily)."""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "AdamW": "dif.train.schedule",
    "LrSchedule": "dif.train.schedule",
    "StepPrograms": "dif.train.step",
    "StepReport": "dif.train.loop",
    "Task": "dif.train.loop",
    "Trainer": "dif.train.loop",
    "build_step_programs": "dif.train.step",
    "training_forward": "dif.train.step",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dif.train' has no attribute {name!r}")
