"""The contract between dif and a backend package (CPU, CUDA, OpenCL, or a third party's).

A backend registers a `BackendInfo` through the `register_backends` hook. Nothing here imports a
device library: `is_available`, `probe` and `create` do that lazily inside the backend. What it
declares (`supported_ops`, its profile's dtypes) is what `dif.runtime` selects a backend by, per program.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Protocol

import numpy as np
from attrs import field, frozen

from dif.target import RuntimeBudget, TargetProfile

if TYPE_CHECKING:
    from dif.ir.program import Program
    from dif.plan.plan import Plan


class Executable(Protocol):
    """A program prepared on a device: weights placed, kernels ready."""

    def run(self, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Execute once; `inputs` by program input name, result by output name (host arrays)."""
        ...

    def release(self) -> None:
        """Free the device memory this executable holds (arena, weights, staging, pinned buffers, a
        captured graph), after its last run has finished; it does not run again (prepare anew). A
        pipeline calls it when its one memory budget cannot keep this program resident through the next
        stage (`dif.program_cache.ProgramCache`). A backend with nothing on a device makes it a no-op; one
        without the method is treated as such."""
        ...


class Backend(Protocol):
    name: str

    def profile(self) -> TargetProfile: ...

    def budget(self) -> RuntimeBudget: ...

    def prepare(self, program: Program, plan: Plan, weights: Mapping[str, np.ndarray]) -> Executable:
        """Bind `program` + `plan` to this device with `weights` by parameter name.

        A backend whose class sets `scans_weights_on_device = True` also takes a keyword
        `nonfinite_check(flagged, covered)`: it tests the parameters it uploaded (`covered`) for NaN /
        infinite values and calls it with those that hold one (`flagged`) before the program first runs;
        the callable raises `WeightError` naming the tensors (`dif.weights.bind.PendingScan.report`). The
        pipeline then skips the host's own scan of those weights."""
        ...


@frozen
class Availability:
    ok: bool
    reason: str = ""


OpDeclaration = frozenset[str] | Callable[[], Iterable[str]] | None
"""The ops a backend runs: names, a function returning them (called when selection asks, so a
backend can derive them from a lowering table it imports lazily), or None for every op of the table."""


def _op_names(items: Iterable[str]) -> frozenset[str]:
    if isinstance(items, str):
        raise TypeError(f"supported_ops must be a collection of op names, not the string {items!r}")
    return frozenset(items)


def _op_declaration(value: Iterable[str] | Callable[[], Iterable[str]] | None) -> OpDeclaration:
    return value if value is None or callable(value) else _op_names(value)


@frozen
class BackendInfo:
    """What a backend plugin registers. `create()` returns a `Backend` for the default device.

    `priority`: among the available backends that can run a program, the highest is chosen (ties by
    name); a callable is asked only when automatic selection needs it (`rank()`), so a plugin whose
    priority depends on probing its devices costs a run that names another backend nothing.
    `supported_ops`: see `OpDeclaration`; a program with an op outside it is never given to this
    backend. `probe()` / `budget()`: the default device's `TargetProfile` / `RuntimeBudget` without
    creating the backend (None: selection creates it and asks the `Backend`); the profile's `dtypes`
    are the element types a program may use on it. `devices()`: how many devices this process sees, for
    `generate --gpus N` (one rank per device; a backend that declares it creates rank r's backend on device
    LOCAL_RANK when that variable is set); None: not declared, and such a backend runs no ranks."""

    name: str
    priority: int | Callable[[], int]
    description: str
    is_available: Callable[[], Availability]
    create: Callable[[], Backend]
    supported_ops: OpDeclaration = field(default=None, converter=_op_declaration)
    probe: Callable[[], TargetProfile] | None = None
    budget: Callable[[], RuntimeBudget] | None = None
    devices: Callable[[], int] | None = None

    def rank(self) -> int:
        """The priority, asked of the plugin when it registered a callable."""
        return self.priority() if callable(self.priority) else self.priority

    def declared_ops(self) -> frozenset[str] | None:
        """The op names this backend runs, None when it declares every op of the table."""
        ops = self.supported_ops
        if ops is None or isinstance(ops, frozenset):
            return ops
        return _op_names(ops())
