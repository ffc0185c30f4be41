"""Entry point of dif-backend-cpu (`[project.entry-points.dif] cpu = "dif_backend_cpu.plugin"`):
registers the CPU backend with dif's plugin manager. Nothing heavy is imported until `create()`."""

from __future__ import annotations

from collections.abc import Callable

import dif
from dif.backend import Availability, Backend, BackendInfo


def _create() -> Backend:
    from dif_backend_cpu.device import CpuBackend

    return CpuBackend()


def _available() -> Availability:
    return Availability(True)


INFO = BackendInfo(
    name="cpu",
    priority=0,
    description="numpy executor following the plan's arena; the reference every backend is checked against",
    is_available=_available,
    create=_create,
)


@dif.hookimpl
def register_backends(register: Callable[[BackendInfo], None]) -> None:
    register(INFO)
