"""Training through the same IR: step programs (forward + loss + gradients + AdamW in one program),
the loop with checkpoint / resume (`.diftrain`), data folders with aspect buckets and cached features,
flow-matching targets, LoRA initialisation and export. Models plug in through `dif.train.loop.Task`."""

from dif.train.loop import StepReport, Task, Trainer
from dif.train.schedule import AdamW, LrSchedule
from dif.train.step import StepPrograms, build_step_programs, training_forward

__all__ = [
    "AdamW",
    "LrSchedule",
    "StepPrograms",
    "StepReport",
    "Task",
    "Trainer",
    "build_step_programs",
    "training_forward",
]
