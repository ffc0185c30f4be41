"""Fixtures for the OpenCL backend tests. Every test here is marked `opencl`; tests that need a
device skip (with the reason) only when no OpenCL platform exists or its compiler cannot build a one-line
kernel on this host (PoCL's LLVM on a CPU it does not know, and no other runtime). CI installs PoCL and Intel's
CPU runtime (the first that builds is the default device), so they run."""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).parent


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.opencl)


def _require_platform() -> None:
    from dif_backend_opencl.device import availability

    avail = availability()
    if not avail.ok:
        pytest.skip(f"no usable OpenCL device: {avail.reason}")


@pytest.fixture(scope="session")
def ocl():  # type: ignore[no-untyped-def]
    """The default device with host evaluation off, so every node really runs as kernels."""
    _require_platform()
    from dif_backend_opencl.device import OpenCLBackend

    return OpenCLBackend(host_eval_max_bytes=0)


@pytest.fixture(scope="session")
def ocl_fallback():  # type: ignore[no-untyped-def]
    """Unfused paths: attention as GEMM + softmax + GEMM, every conv via im2col, tiny scratch
    (forces im2col chunking and one kv head per attention block)."""
    _require_platform()
    from dif_backend_opencl.device import OpenCLBackend
    from dif_backend_opencl.lower import LowerOptions

    opts = LowerOptions(fused_attention_max_dim=0, conv3x3_direct=False, scratch_cap_bytes=512)
    return OpenCLBackend(host_eval_max_bytes=0, options=opts)


@pytest.fixture
def fresh_backend():  # type: ignore[no-untyped-def]
    """A factory of new backends (own pool and kernel library) for tests that change them."""
    _require_platform()
    from dif_backend_opencl.device import OpenCLBackend

    return OpenCLBackend
