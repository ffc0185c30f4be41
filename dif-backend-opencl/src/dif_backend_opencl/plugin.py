"""Entry point of dif-backend-opencl (`[project.entry-points.dif] opencl = "dif_backend_opencl.plugin"`):
registers the OpenCL backend. pyopencl is imported only when availability or priority is asked; the
ops it declares are its lowering table's (`lower/`), imported when selection first asks.

Priority: 10 (above cpu's 0, below cuda) when a GPU or accelerator OpenCL device exists; -10 when
the only devices are CPUs (PoCL), so the numpy CPU backend stays the default there. Deciding it
enumerates platforms once per process (~0.15-0.3 s with pyopencl's import), so it is registered as a
callable: only automatic selection asks it, never a run that names its backend. Without pyopencl it is -10.
"""

from __future__ import annotations

from collections.abc import Callable

import dif
from dif.backend import Availability, Backend, BackendInfo


def _create() -> Backend:
    from dif_backend_opencl.device import OpenCLBackend

    return OpenCLBackend()


def _available() -> Availability:
    from dif_backend_opencl.device import availability

    return availability()


def _supported_ops() -> frozenset[str]:
    from dif_backend_opencl.lower import LOWERINGS

    return LOWERINGS.ops


def _priority() -> int:
    from dif_backend_opencl.device import PRIORITY_CPU_ONLY, priority

    try:
        return priority()
    except Exception:  # a broken ICD must not break backend listing
        return PRIORITY_CPU_ONLY


def info() -> BackendInfo:
    return BackendInfo(
        name="opencl",
        priority=_priority,
        description="pyopencl kernels on any OpenCL 1.2+ device (PoCL on CPUs, AMD / Intel / NVIDIA GPUs)",
        is_available=_available,
        create=_create,
        supported_ops=_supported_ops,
    )


@dif.hookimpl
def register_backends(register: Callable[[BackendInfo], None]) -> None:
    register(info())
