"""The CPU device: what the host offers (TargetProfile, RuntimeBudget) and `CpuBackend`, the
`dif.backend.Backend` whose `prepare` turns a program + plan into an arena executable.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path

import ml_dtypes
import numpy as np

from dif.dtypes import DType
from dif.host import available_memory_bytes, total_memory_bytes
from dif.ir.program import Program
from dif.ops.registry import OPS, OpTable
from dif.passes.context import ALL_OPS_CAPABILITY
from dif.plan.plan import ALIAS_CAPABILITY, Plan
from dif.plan.views import ANY_VIEW_CAPABILITY, CONCAT_CAPABILITY, SPLIT_CAPABILITY
from dif.target import RuntimeBudget, TargetProfile
from dif_backend_cpu.executor import ArenaExecutable

NAME = "cpu"


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def host_profile() -> TargetProfile:
    """Static capability of this host as the CPU backend sees it. Free memory is not in here."""
    return TargetProfile(
        backend=NAME,
        device=cpu_model(),
        arch=platform.machine(),
        compute_units=os.cpu_count() or 1,
        memory_bytes=total_memory_bytes(),
        dtypes=tuple(d.value for d in DType),
        tensor_core_formats=(),
        # every op in the table; every view of dif.plan.views (operands are strided numpy arrays)
        capabilities=(
            "arena",
            ALIAS_CAPABILITY,
            SPLIT_CAPABILITY,
            CONCAT_CAPABILITY,
            ANY_VIEW_CAPABILITY,
            ALL_OPS_CAPABILITY,
            # the quantized ops' references run here: fp8 / int8 emulated (no matrix units), int4 executed
            "format:fp8-e4m3",
            "format:int8",
            "format:int4-group",
        ),
        libraries={"numpy": np.__version__, "ml_dtypes": ml_dtypes.__version__},
    )


def host_budget() -> RuntimeBudget:
    """Host memory available right now (MemAvailable), all of it usable by the arena."""
    return RuntimeBudget(free_memory_bytes=available_memory_bytes(), host_memory_bytes=total_memory_bytes())


class CpuBackend:
    """Runs programs with numpy: one uint8 arena per executable, laid out exactly as the plan says,
    each op computed by the op table's reference and stored in its result dtype."""

    name = NAME

    def __init__(self, *, table: OpTable = OPS) -> None:
        self.table = table

    def profile(self) -> TargetProfile:
        return host_profile()

    def budget(self) -> RuntimeBudget:
        return host_budget()

    def prepare(self, program: Program, plan: Plan, weights: Mapping[str, np.ndarray]) -> ArenaExecutable:
        """Check the plan against the program, bind `weights` (by parameter name; np.memmap is fine,
        nothing is copied) and allocate the arena. Raises `PlanError`, `WeightError` or
        `NotImplementedOnBackend` before anything runs."""
        return ArenaExecutable.create(program, plan, weights, table=self.table, backend=self.name)
