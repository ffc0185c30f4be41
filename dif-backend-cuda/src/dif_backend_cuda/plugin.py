"""Entry point of dif-backend-cuda (`[project.entry-points.dif] cuda = "dif_backend_cuda.plugin"`):
registers the CUDA backend with dif's plugin manager. Importing this module imports no device
library; `is_available` imports cupy only to answer, and reports why not instead of raising. The ops it
declares are its lowering table's (`lower/`), imported when selection first asks."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import dif
from dif.backend import Availability, BackendInfo


def _create() -> Any:
    """The backend on this process's device: LOCAL_RANK's under `generate --gpus N` / torchrun (one rank per
    visible device), else device 0."""
    from dif.parallel.launch import RankEnv
    from dif_backend_cuda.device import CudaBackend

    return CudaBackend(RankEnv.from_env().local_rank)


def _devices() -> int:
    """The CUDA devices this process sees (CUDA_VISIBLE_DEVICES applied); 0 without a usable driver."""
    if not _available().ok:
        return 0
    import cupy

    return int(cupy.cuda.runtime.getDeviceCount())


def _available() -> Availability:
    from dif_backend_cuda.device import cuda_availability

    return cuda_availability()


def _supported_ops() -> frozenset[str]:
    from dif_backend_cuda.lower import LOWERINGS

    return LOWERINGS.ops


INFO = BackendInfo(
    name="cuda",
    priority=100,
    description="NVIDIA GPUs: NVRTC kernels, cuBLASLt GEMMs, cuDNN attention, one CUDA graph per program",
    is_available=_available,
    create=_create,
    supported_ops=_supported_ops,
    devices=_devices,
)


@dif.hookimpl
def register_backends(register: Callable[[BackendInfo], None]) -> None:
    register(INFO)
