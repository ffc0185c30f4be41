"""Training hyperparameters and the learning-rate schedule (host side; the step program takes the
step's learning rate and bias corrections as inputs, so the schedule never rebuilds a program)."""

from __future__ import annotations

import math

from attrs import frozen

from dif.errors import UsageError


@frozen
class AdamW:
    """torch.optim.AdamW's update: decoupled weight decay, bias-corrected moments."""

    lr: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 1e-2

    def __attrs_post_init__(self) -> None:
        if not (0 <= self.beta1 < 1 and 0 <= self.beta2 < 1) or self.eps <= 0 or self.lr < 0 or self.weight_decay < 0:
            raise UsageError(f"AdamW: betas must be in [0, 1), eps > 0, lr and weight decay >= 0 (got {self})")


@frozen
class LrSchedule:
    """Linear warm-up over `warmup` steps, then cosine decay to `min_ratio` * peak at `total` steps
    (`cosine=False`: constant after the warm-up)."""

    peak: float
    total: int
    warmup: int = 0
    min_ratio: float = 0.0
    cosine: bool = True

    def __attrs_post_init__(self) -> None:
        if self.total < 1 or not 0 <= self.warmup <= self.total or not 0 <= self.min_ratio <= 1:
            raise UsageError(
                f"learning-rate schedule: need total >= 1, 0 <= warmup <= total, 0 <= min_ratio <= 1 ({self})"
            )

    def at(self, step: int) -> float:
        """The learning rate of 0-based optimizer step `step`."""
        if step < self.warmup:
            return self.peak * (step + 1) / self.warmup
        if not self.cosine or self.total == self.warmup:
            return self.peak
        progress = min(1.0, (step - self.warmup) / max(1, self.total - self.warmup))
        floor = self.peak * self.min_ratio
        return floor + (self.peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))


def bias_corrections(opt: AdamW, step: int) -> tuple[float, float]:
    """(1 - beta1^t, 1 - beta2^t) for 0-based step `step` (t = step + 1)."""
    t = step + 1
    return 1 - opt.beta1**t, 1 - opt.beta2**t
