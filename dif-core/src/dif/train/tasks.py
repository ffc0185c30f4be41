"""Which frontend trains which model family: frontends register their LoRA session factory here
(a "module:function" string, imported when `dif train` needs it), so dif-core names no model."""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from attrs import define, field, frozen

from dif.errors import UsageError

_LORA: dict[str, str] = {}
_FULL: dict[str, str] = {}


@frozen
class LoraSettings:
    """What `dif train lora` asks of a frontend's session (defaults are the CLI's)."""

    rank: int = 16
    alpha: float = 16.0
    targets: tuple[str, ...] = field(default=(), converter=tuple)  # empty: the frontend's attention projections
    steps: int = 1000
    lr: float = 1e-4
    warmup: int = 0
    cosine: bool = True
    accumulate: int = 1
    max_grad_norm: float | None = 1.0
    weight_decay: float = 1e-2
    resolution: int = 512
    seed: int = 0
    dtype: str = "f32"  # compute dtype; master weights and optimizer state are fp32
    checkpoint_blocks: tuple[str, ...] = field(default=(), converter=tuple)
    timestep_sampling: str = "uniform"
    cache_dir: Path | None = None
    max_text_tokens: int | None = None  # caption length the text features are padded to (None: the model's default)
    timestep_shift: float | None = None  # shift of the training sigmas (`dif.train.flow`); None: the scheduler's
    batch_size: int = 1  # images per micro-batch: one step program of that batch (a frontend may refuse > 1)

    def __attrs_post_init__(self) -> None:
        if (self.rank < 1 or self.alpha <= 0 or self.steps < 1 or self.accumulate < 1 or self.resolution < 16
                or self.batch_size < 1):  # fmt: skip
            raise UsageError(
                f"LoRA settings out of range: rank, alpha, steps, accumulate, batch size >= 1, resolution >= 16 "
                f"({self})"
            )
        s = self.timestep_shift
        if s is not None and not (math.isfinite(s) and s > 0):
            raise UsageError(
                f"--timestep-shift must be a finite number > 0, got {s}",
                hint="1 trains on the unshifted sigmas; the sampler's shift (e.g. 3) favours high noise",
            )


LoraFactory = Callable[..., Any]


@define
class LoraSession:
    """A LoRA run as `dif train lora` drives it, whatever the family: the frontend's task (its pipeline,
    data, target modules and step programs: `.modules`, `.encode_all`), the trainer and the settings."""

    task: Any
    trainer: Any
    settings: LoraSettings

    @property
    def modules(self) -> Sequence[str]:
        return self.task.modules

    def encode_all(self, on_sample: Any = None) -> None:
        self.task.encode_all(on_sample)

    def export(self, path: Path) -> Path:
        """The trained factors as a diffusers / PEFT-layout LoRA file at `path`."""
        from dif.train.lora import write_diffusers_lora

        s = self.settings
        return write_diffusers_lora(path, self.trainer.params, self.task.modules, rank=s.rank, alpha=s.alpha)


def register_lora_trainer(family: str, target: str) -> None:
    """`target` = "module:function"; the function takes (model path, data folder, LoraSettings,
    backend=...) and returns a session with `trainer`, `modules`, `encode_all(on_sample)` and
    `export(path)`."""
    _LORA[family] = target


def register_full_trainer(family: str, target: str) -> None:
    """As `register_lora_trainer`, for a full fine-tune (every weight of the trained component);
    the session's `export(folder)` writes a model folder."""
    _FULL[family] = target


def lora_trainer(family: str) -> LoraFactory:
    return _resolve(_LORA, family, "LoRA")


def full_trainer(family: str) -> LoraFactory:
    return _resolve(_FULL, family, "full fine-tune")


def _resolve(table: dict[str, str], family: str, what: str) -> LoraFactory:
    if family not in table:
        raise UsageError(
            f"no {what} trainer for model family '{family}' (trainers: {', '.join(sorted(table)) or 'none'})",
            hint="the frontend plugin registers one; check `dif plugins`",
        )
    module, _, name = table[family].partition(":")
    return getattr(importlib.import_module(module), name)  # type: ignore[no-any-return]


def lora_families() -> list[str]:
    return sorted(_LORA)
