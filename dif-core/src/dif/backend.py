"""The contract between dif and a backend package (CPU, CUDA, OpenCL, or a third party's).

A backend registers a `BackendInfo` through the `register_backends` hook. Nothing here imports a
device library: `is_available`, `probe` and `create` do that lazily inside the backend.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Protocol

import numpy as np
from attrs import frozen

from dif.target import RuntimeBudget, TargetProfile

if TYPE_CHECKING:
    from dif.ir.program import Program
    from dif.plan.plan import Plan


class Executable(Protocol):
    """A program prepared on a device: weights placed, kernels ready."""

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute once; `inputs` by program input name, result by output name (host arrays)."""
        ...


class Backend(Protocol):
    name: str

    def profile(self) -> TargetProfile: ...

    def budget(self) -> RuntimeBudget: ...

    def prepare(self, program: Program, plan: Plan, weights: Mapping[str, np.ndarray]) -> Executable:
        """Bind `program` + `plan` to this device with `weights` by parameter name."""
        ...


@frozen
class Availability:
    ok: bool
    reason: str = ""


@frozen
class BackendInfo:
    """What a backend plugin registers. `create()` returns a `Backend` for the default device."""

    name: str
    priority: int
    description: str
    is_available: Callable[[], Availability]
    create: Callable[[], Backend]
