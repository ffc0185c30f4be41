"""The CUDA device: is it usable (`cuda_availability`), what it can do (`probe_profile`), what it has free
(`probe_budget`), and `CudaBackend`, whose `prepare` turns a program + plan into a `CudaExecutable`.

Device libraries (cupy, nvmath, cudnn) are imported inside functions only, so importing this module
on a machine without a GPU costs nothing and fails nothing.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dif.backend import Availability
from dif.dtypes import DType
from dif.env import DIF_CUDA_GEMM, DIF_CUDA_INT4, DIF_CUDA_ROWS, DIF_CUDA_SDPA, DIF_CUDA_TUNE, EnvVar
from dif.errors import BackendUnavailableError, UsageError
from dif.host import total_memory_bytes
from dif.ops.registry import OPS, OpTable
from dif.passes.context import OP_CAPABILITY
from dif.plan.plan import ALIAS_CAPABILITY
from dif.plan.views import CONCAT_CAPABILITY, SPLIT_CAPABILITY, view_capability
from dif.target import RuntimeBudget, TargetProfile
from dif_backend_cuda.lower import LOWERINGS, PITCHED_ROWS
from dif_backend_cuda.lower.quant import FORMAT_CAPABILITIES

if TYPE_CHECKING:
    import numpy as np

    from dif.ir.program import Program
    from dif.plan.plan import Plan
    from dif_backend_cuda.executor import CudaExecutable
    from dif_backend_cuda.tuning import Choices

NAME = "cuda"
GEMM_CHOICES = ("auto", "cublaslt", "nvrtc")
SDPA_CHOICES = ("auto", "cudnn", "flash")
INT4_CHOICES = ("tile", "mma")
ROWS_CHOICES = ("staged", "registers")
LT_WORKSPACE_BYTES = 64 << 20
STAGING_BYTES = 2 * (64 << 20)
RESERVE_BYTES = 512 << 20
"""Kept free for the CUDA context, library handles and cuDNN workspaces (not planned memory)."""


def _choice(option: str, explicit: str | None, var: EnvVar, choices: tuple[str, ...], default: str = "auto") -> str:
    if explicit is None:
        return var.get_choice(choices) or default
    if explicit not in choices:
        raise UsageError(
            f"cuda backend option {option}={explicit!r} is not valid",
            hint=f"use one of {', '.join(choices)} (or set {var.name})",
        )
    return explicit


def resolve_options(
    gemm: str | None = None,
    sdpa: str | None = None,
    tune: str | None = None,
    int4: str | None = None,
    rows: str | None = None,
) -> dict[str, str]:
    """The kernel paths and tune mode a `CudaBackend` uses: an explicit argument wins, else DIF_CUDA_GEMM /
    DIF_CUDA_SDPA / DIF_CUDA_TUNE / DIF_CUDA_INT4 / DIF_CUDA_ROWS, else 'auto' ('cached' for tune, 'mma' for
    int4, 'registers' for rows). A bad value is a UsageError naming the argument or variable and the allowed
    values; it is checked here, when a backend is made, so importing the plugin never fails."""
    from dif_backend_cuda.tuning import TUNE_CHOICES

    return {
        "gemm": _choice("gemm", gemm, DIF_CUDA_GEMM, GEMM_CHOICES),
        "sdpa": _choice("sdpa", sdpa, DIF_CUDA_SDPA, SDPA_CHOICES),
        "tune": _choice("tune", tune, DIF_CUDA_TUNE, TUNE_CHOICES, default="cached"),
        "int4": _choice("int4", int4, DIF_CUDA_INT4, INT4_CHOICES, default="mma"),
        "rows": _choice("rows", rows, DIF_CUDA_ROWS, ROWS_CHOICES, default="registers"),
    }


def cuda_availability() -> Availability:
    """Usable when cupy imports and sees at least one device; otherwise say why (never raises)."""
    try:
        import cupy
    except Exception as exc:  # ImportError, or a broken CUDA install raising at import
        reason = f"cupy is not importable ({type(exc).__name__}: {exc}); install dif-backend-cuda[gpu]"
        return Availability(False, reason)
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:
        return Availability(False, f"no usable CUDA driver or device ({type(exc).__name__}: {exc})")
    if count < 1:
        return Availability(False, "no CUDA device found")
    return Availability(True)


def tensor_core_formats(major: int, minor: int) -> tuple[str, ...]:
    """Matrix-unit input formats by compute capability (Volta fp16, Turing int8, Ampere bf16/tf32,
    Ada/Hopper fp8)."""
    cc = major * 10 + minor
    out = []
    if cc >= 70:
        out.append("fp16")
    if cc >= 75:
        out.append("int8")
    if cc >= 80:
        out += ["bf16", "tf32"]
    if cc >= 89:
        out += ["fp8-e4m3", "fp8-e5m2"]
    return tuple(out)  # names of dif.formats.TENSOR_CORE_FORMATS


def _dist_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def library_versions() -> dict[str, str]:
    """Versions of the device libraries this backend uses (metadata only: no heavy imports)."""
    import cupy

    out = {"cupy": cupy.__version__}
    rt = cupy.cuda.runtime
    out["cuda_runtime"] = str(rt.runtimeGetVersion())
    out["cuda_driver"] = str(rt.driverGetVersion())
    from dif_backend_cuda.kernels import nvrtc_version

    out["nvrtc"] = nvrtc_version()
    for dist, key in (("nvmath-python", "nvmath"), ("nvidia-cudnn-frontend", "cudnn_frontend")):
        version = _dist_version(dist)
        if version:
            out[key] = version
    return out


def device_properties(device: int = 0) -> dict[str, Any]:
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(device)
    name = props["name"]
    return {
        "name": name.decode() if isinstance(name, bytes) else str(name),
        "major": int(props["major"]),
        "minor": int(props["minor"]),
        "sm_count": int(props["multiProcessorCount"]),
        "total_memory": int(props["totalGlobalMem"]),
        "smem_optin": int(props.get("sharedMemPerBlockOptin", 0)),
        "l2_bytes": int(props.get("l2CacheSize", 0)),
    }


CUDNN_ONLY_OPS = ("sdpa_backward", "sdpa_stats", "sdpa_fp8", "sdpa_fp8_qk")
"""Fused ops only cuDNN runs as themselves (the fp8 attentions fall back to the run dtype's sdpa): not declared where
cudnn-frontend is missing, so no pass makes them there."""


def probe_profile(device: int = 0) -> TargetProfile:
    """Static capability of CUDA device `device`; raises BackendUnavailableError without one."""
    avail = cuda_availability()
    if not avail.ok:
        raise BackendUnavailableError(f"cuda backend unavailable: {avail.reason}")
    p = device_properties(device)
    libs = library_versions()
    dtypes = [d.value for d in DType if p["major"] * 10 + p["minor"] >= 89 or d not in (DType.F8E4M3, DType.F8E5M2)]
    caps = ["arena", "cuda-graphs", "nvrtc", f"smem-optin-{p['smem_optin']}", f"l2-{p['l2_bytes']}"]
    caps += [ALIAS_CAPABILITY, SPLIT_CAPABILITY, CONCAT_CAPABILITY, *LOWERINGS.op_capabilities()]
    caps += [view_capability(op, axes) for op, axes in PITCHED_ROWS.items()]
    caps += list(FORMAT_CAPABILITIES)  # the quantized lowerings exist; legality is the dtypes / matrix units
    if "nvmath" in libs:
        caps.append("cublaslt")
    if "cudnn_frontend" in libs:
        caps.append("cudnn-sdpa")
    else:  # the fused attention backward is cuDNN's: without it autodiff's node is legalized to its chain
        for op in CUDNN_ONLY_OPS:
            caps.remove(OP_CAPABILITY.format(op))
    return TargetProfile(
        backend=NAME,
        device=p["name"],
        arch=f"sm_{p['major']}{p['minor']}",
        compute_units=p["sm_count"],
        memory_bytes=p["total_memory"],
        dtypes=tuple(dtypes),
        tensor_core_formats=tensor_core_formats(p["major"], p["minor"]),
        capabilities=tuple(caps),
        libraries=libs,
    )


def probe_budget(device: int = 0) -> RuntimeBudget:
    """Free device memory now; the workspace is what this backend keeps outside the plan's arena."""
    import cupy

    with cupy.cuda.Device(device):
        free, _total = cupy.cuda.runtime.memGetInfo()
    return RuntimeBudget(
        free_memory_bytes=int(free),
        host_memory_bytes=total_memory_bytes(),
        pinned_staging_bytes=STAGING_BYTES,
        workspace_bytes=LT_WORKSPACE_BYTES + RESERVE_BYTES,
    )


class CudaBackend:
    """Runs plans on one CUDA device. Kernel choice: `gemm` ('auto' = cuBLASLt when nvmath-python is
    installed, else the NVRTC GEMM), `sdpa` ('auto' = cuDNN for eligible fp16/bf16 attention, else
    the NVRTC flash kernel), `graph` (capture the program as one CUDA graph and replay it), `tune`
    (cuBLASLt algorithms and cuDNN plans per distinct problem: 'cached' reuses stored choices and otherwise
    takes the library's first, 'on' also times the candidates of a problem without a stored choice and
    stores the fastest, 'off' always takes the library's first; `tuning.Choices`), `int4` (the int4_linear
    kernel: the tensor-core 'mma' or the portable 'tile'), `rows` (norm_modulate_quant / quantize_rows over
    half-precision rows: held in 'registers' where they can be, or 'staged' in shared memory). Those left as None
    come from DIF_CUDA_GEMM / DIF_CUDA_SDPA / DIF_CUDA_TUNE / DIF_CUDA_INT4 / DIF_CUDA_ROWS (docs/env.md)."""

    name = NAME
    scans_weights_on_device = True  # `prepare(nonfinite_check=...)`: the pipeline skips its host scan

    def __init__(
        self,
        device: int = 0,
        *,
        gemm: str | None = None,
        sdpa: str | None = None,
        graph: bool = True,
        tune: str | None = None,
        int4: str | None = None,
        rows: str | None = None,
        table: OpTable = OPS,
        cache_root: Path | None = None,
    ) -> None:
        # Options before availability: a typo in DIF_CUDA_GEMM is reported even on a machine without a GPU.
        kernels = resolve_options(gemm, sdpa, tune, int4, rows)
        avail = cuda_availability()
        if not avail.ok:
            raise BackendUnavailableError(f"cuda backend unavailable: {avail.reason}")
        import cupy

        from dif_backend_cuda.kernels import KernelCache

        self.device = device
        self.options: dict[str, Any] = {**kernels, "graph": graph}
        self.table = table
        cupy.cuda.Device(device).use()
        self.props = device_properties(device)
        self.stream = cupy.cuda.Stream(non_blocking=True)
        self.kernels = KernelCache(f"sm_{self.props['major']}{self.props['minor']}", cache_root)
        self._profile: TargetProfile | None = None
        self._lt: Any = None
        self._lt_error: str | None = None
        self._cudnn: Any = None
        self._cudnn_error: str | None = None

    def profile(self) -> TargetProfile:
        if self._profile is None:
            self._profile = probe_profile(self.device)
        return self._profile

    def budget(self) -> RuntimeBudget:
        return probe_budget(self.device)

    def lt(self) -> Any:
        """The shared cuBLASLt context (handle + workspace), or None with `lt_error` saying why."""
        if self._lt is None and self._lt_error is None:
            try:
                from dif_backend_cuda.gemm import LtContext

                self._lt = LtContext(LT_WORKSPACE_BYTES, self.choices)
            except Exception as exc:  # nvmath absent or cuBLASLt failing: the NVRTC GEMM takes over
                self._lt_error = f"{type(exc).__name__}: {exc}"
        return self._lt

    def cudnn(self) -> Any:
        """The shared cuDNN handle on this backend's stream, or None with `cudnn_error` saying why."""
        if self._cudnn is None and self._cudnn_error is None:
            try:
                from dif_backend_cuda.sdpa import CudnnContext

                self._cudnn = CudnnContext(self.stream, self.choices)
            except Exception as exc:
                self._cudnn_error = f"{type(exc).__name__}: {exc}"
        return self._cudnn

    def choices(self, library: str) -> Choices:
        """The store of `library`'s (name and version) candidate choices on this device, under the tune mode."""
        import cupy

        from dif_backend_cuda.tuning import Choices

        rt = cupy.cuda.runtime
        device = {
            "device": self.props["name"],
            "arch": self.kernels.arch,
            "driver": str(rt.driverGetVersion()),
            "runtime": str(rt.runtimeGetVersion()),
        }
        return Choices(library.split()[0], library, device, self.options["tune"], self.kernels.root / "choices")

    def prepare(
        self,
        program: Program,
        plan: Plan,
        weights: Mapping[str, np.ndarray],
        nonfinite_check: Callable[[set[str], set[str]], None] | None = None,
    ) -> CudaExecutable:
        """Check the plan, upload `weights` (by parameter name) into one device allocation, lower every
        node to kernels/library calls, test the uploaded weights for NaN / inf (`nonfinite_check`), run
        once, and capture the CUDA graph. Raises PlanError, WeightError or NotImplementedOnBackend before
        anything runs."""
        from dif_backend_cuda.executor import CudaExecutable

        return CudaExecutable.create(self, program, plan, weights, nonfinite_check)
