"""Test setup for dif-backend-cuda: the `cuda` marker, and the skip reason when no GPU is usable."""

from __future__ import annotations

import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "cuda: needs an NVIDIA GPU with cupy (skipped with the reason otherwise)")


def cuda_skip_reason() -> str | None:
    """None when the CUDA backend can run here, else why not (cupy missing, no driver, no device)."""
    from dif_backend_cuda.device import cuda_availability

    avail = cuda_availability()
    return None if avail.ok else avail.reason
