"""OpenCL platforms and devices as dif sees them: discovery, `TargetProfile` (static capability),
`RuntimeBudget` (memory now), availability with a reason, and `OpenCLBackend`, whose `prepare`
turns a program + plan into an `OpenCLExecutable` (see executor.py). pyopencl is imported inside
functions only, so listing backends never needs it.
"""

from __future__ import annotations

import ctypes.util
from collections.abc import Mapping
from functools import cache
from pathlib import Path
from typing import Any

from attrs import frozen

from dif.backend import Availability
from dif.dtypes import DType
from dif.errors import BackendUnavailableError
from dif.host import available_memory_bytes
from dif.ir.program import Program
from dif.plan.plan import ALIAS_CAPABILITY, Plan
from dif.target import RuntimeBudget, TargetProfile

NAME = "opencl"
PRIORITY_GPU = 10
"""Priority when a GPU / accelerator OpenCL device exists: above cpu (0), below cuda."""
PRIORITY_CPU_ONLY = -10
"""Priority when the only OpenCL devices are CPUs (PoCL): the numpy CPU backend stays the default."""

NVIDIA_ICD = Path("/etc/OpenCL/vendors/nvidia.icd")
NVIDIA_LIB = "libnvidia-opencl.so.1"
_NVIDIA_LIB_DIRS = (
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/usr/lib",
    "/usr/local/nvidia/lib64",
    "/usr/local/nvidia/lib",
)
_KIND_RANK = {"gpu": 0, "accelerator": 1, "other": 2, "cpu": 3}


@frozen
class DeviceInfo:
    """What dif reads from one OpenCL device (plain data, no pyopencl objects)."""

    platform: str
    platform_version: str
    name: str
    vendor: str
    kind: str  # gpu | cpu | accelerator | other
    compute_units: int
    global_mem_bytes: int
    max_alloc_bytes: int
    local_mem_bytes: int
    max_work_group: int
    base_addr_align_bits: int
    extensions: tuple[str, ...]
    version: str
    c_version: str
    driver: str

    @property
    def fp16_arithmetic(self) -> bool:
        return "cl_khr_fp16" in self.extensions

    @property
    def fp64(self) -> bool:
        return "cl_khr_fp64" in self.extensions


def _kind(device: Any) -> str:
    import pyopencl as cl

    t = device.type
    if t & cl.device_type.GPU:
        return "gpu"
    if t & cl.device_type.ACCELERATOR:
        return "accelerator"
    if t & cl.device_type.CPU:
        return "cpu"
    return "other"


def describe(device: Any) -> DeviceInfo:
    plat = device.platform
    return DeviceInfo(
        platform=plat.name.strip(),
        platform_version=plat.version.strip(),
        name=device.name.strip(),
        vendor=device.vendor.strip(),
        kind=_kind(device),
        compute_units=int(device.max_compute_units),
        global_mem_bytes=int(device.global_mem_size),
        max_alloc_bytes=int(device.max_mem_alloc_size),
        local_mem_bytes=int(device.local_mem_size),
        max_work_group=int(device.max_work_group_size),
        base_addr_align_bits=int(device.mem_base_addr_align),
        extensions=tuple(sorted(device.extensions.split())),
        version=device.version.strip(),
        c_version=device.opencl_c_version.strip(),
        driver=device.driver_version.strip(),
    )


def list_devices() -> list[Any]:
    """Every OpenCL device of every platform (empty when pyopencl or an ICD is missing)."""
    from dif_backend_opencl.vendors import register_pip_runtimes

    register_pip_runtimes()  # before the loader's first (and only) read of its registrations
    try:
        import pyopencl as cl

        platforms = cl.get_platforms()
    except Exception:  # no pyopencl, no ICD loader, or no platform (pyopencl raises cl.LogicError)
        return []
    out = []
    for p in platforms:
        try:
            out.extend(p.get_devices())
        except Exception:  # a platform without devices raises DEVICE_NOT_FOUND
            continue
    return out


def pick_device(devices: list[Any], selector: str | None = None) -> Any:
    """`selector` is 'P:D' (platform and device index, as `clinfo -l` lists them) or a substring
    of the device or platform name; default: GPUs first, then accelerators, then CPUs, larger
    memory first within a kind, and of those the first whose compiler builds a kernel (two CPU
    runtimes: PoCL may list a CPU its LLVM cannot target)."""
    if not devices:
        raise BackendUnavailableError(f"no OpenCL device found: {availability().reason}")
    if not selector:
        ranked = sorted(devices, key=lambda d: (_KIND_RANK[_kind(d)], -int(d.global_mem_size)))
        if len(ranked) == 1:
            return ranked[0]
        return next((d for d in ranked if compiler_failure(d) is None), ranked[0])
    indexed = _indexed(devices)
    for label, d in indexed:
        if selector == label or selector.lower() in f"{d.platform.name} {d.name}".lower():
            return d
    names = ", ".join(f"{label} {d.name.strip()}" for label, d in indexed)
    raise BackendUnavailableError(f"no OpenCL device matches '{selector}' (devices: {names})")


def _indexed(devices: list[Any]) -> list[tuple[str, Any]]:
    """('P:D', device) with P the platform's index among the devices' platforms, D the device's."""
    platforms: list[Any] = []
    out: list[tuple[str, Any]] = []
    for d in devices:
        if d.platform not in platforms:
            platforms.append(d.platform)
        p = platforms.index(d.platform)
        out.append((f"{p}:{sum(1 for _, x in out if x.platform == d.platform)}", d))
    return out


# -- NVIDIA ICD diagnosis -------------------------------------------------------------------------


def nvidia_library() -> str | None:
    """Where libnvidia-opencl.so.1 is, if the NVIDIA driver's OpenCL library is installed."""
    found = ctypes.util.find_library("nvidia-opencl")  # consults `ldconfig -p`
    if found:
        return found
    for d in _NVIDIA_LIB_DIRS:
        path = Path(d) / NVIDIA_LIB
        if path.exists():
            return str(path)
    return None


def nvidia_hint(devices: list[Any] | None = None) -> str | None:
    """Why an installed NVIDIA OpenCL library shows no platform, with the fix; None if nothing is off."""
    lib = nvidia_library()
    if lib is None:
        return None
    devices = list_devices() if devices is None else devices
    if any("nvidia" in d.platform.name.lower() for d in devices):
        return None
    try:
        named = NVIDIA_LIB in NVIDIA_ICD.read_text()
    except OSError:
        named = False
    if not named:
        return (
            f"the NVIDIA OpenCL library is installed ({lib}) but no NVIDIA platform is visible because "
            f"{NVIDIA_ICD} does not name it; fix: echo {NVIDIA_LIB} | sudo tee {NVIDIA_ICD}"
        )
    return (
        f"{NVIDIA_ICD} names {NVIDIA_LIB} ({lib}) but the ICD loader found no NVIDIA platform: check that the "
        "driver is loaded (nvidia-smi) and that OCL_ICD_VENDORS / OCL_ICD_FILENAMES do not hide /etc/OpenCL/vendors"
    )


PROBE_KERNEL = "__kernel void dif_probe(__global float* a) { a[get_global_id(0)] = 1.0f; }"


def availability() -> Availability:
    try:
        import pyopencl  # noqa: F401
    except ImportError as exc:
        return Availability(False, f"pyopencl is not installed ({exc}); pip install pyopencl pocl-binary-distribution")
    from dif_backend_opencl.vendors import missing_neighbours

    devices = list_devices()
    hint = "; ".join(h for h in (nvidia_hint(devices), missing_neighbours()) if h) or None
    if not devices:
        reason = (
            "no OpenCL platform/device (install a driver's ICD, or for CPUs `pip install pocl-binary-distribution` "
            "or `pip install dif-backend-opencl[intel-cpu]`)"
        )
        return Availability(False, f"{reason}; {hint}" if hint else reason)
    broken = compiler_failure(pick_device(devices))
    if broken is not None:
        return Availability(False, f"{broken}; {hint}" if hint else broken)
    return Availability(True, hint or "")


@cache
def _compiler_failure(platform: str, device: str) -> str | None:
    import pyopencl as cl

    from dif_backend_opencl.library import build

    target = next(d for d in list_devices() if (d.platform.name, d.name) == (platform, device))
    try:
        build(cl.Program(cl.Context([target]), PROBE_KERNEL))
    except Exception as exc:  # the driver's build error: its log says why
        log = " ".join(str(exc).split())[:300]
        return (
            f"the OpenCL compiler of '{device.strip()}' ({platform}) cannot build a one-line kernel on this host: {log}"
        )
    return None


def compiler_failure(device: Any) -> str | None:
    """Why `device`'s OpenCL C compiler cannot build a trivial kernel, or None when it can (asked once per
    device and process). A PoCL whose LLVM does not know the host CPU ("unknown target CPU 'generic'")
    lists a device that runs nothing; the backend is then unavailable, with that reason, rather than
    chosen and failing at the first program."""
    return _compiler_failure(device.platform.name, device.name)


@cache
def priority() -> int:
    """Backend priority from the device kinds present (cached: probing costs ~0.3 s)."""
    return PRIORITY_GPU if any(_kind(d) != "cpu" for d in list_devices()) else PRIORITY_CPU_ONLY


# -- profile and budget -----------------------------------------------------------------------------


FORMAT_CAPABILITIES = ("format:int4-group",)
"""The formats the passes may choose here: int4 weight-only, whose GEMM unpacks the weight in its tile loads
(memory for small cards). fp8 and int8 W8A8 are not listed: without matrix units their products run at the fp32
GEMM's rate after a quantization pass, slower than the unquantized linear (the ops still run when a program
holding them is handed over as it is)."""


def storage_dtypes(info: DeviceInfo) -> tuple[str, ...]:
    """Storage types every kernel reads and writes (fp32 compute). f16 needs no extension: its
    loads/stores are the core vload_half / vstore_half_rte; f8e4m3 is uchar bits converted in
    kernels/common.cl. Listing a dtype picks no format: a format needs its `format:*` capability
    (`FORMAT_CAPABILITIES`)."""
    dtypes = (DType.F32, DType.BF16, DType.F16, DType.I32, DType.I64, DType.I8, DType.U8, DType.BOOL, DType.F8E4M3)
    return tuple(d.value for d in dtypes)


def profile_of(info: DeviceInfo, host_threshold_bytes: int | None = None) -> TargetProfile:
    """The device's capability; `host_threshold_bytes` is what the backend measured for host evaluation
    of tiny nodes (the planner places nodes by it; None: all on the device)."""
    import pyopencl as cl

    from dif_backend_opencl.lower import LOWERINGS

    caps = ["arena", "fp16-storage"]
    if info.fp16_arithmetic:
        caps.append("fp16-arithmetic")
    if info.fp64:
        caps.append("fp64")
    caps += [
        f"max-alloc:{info.max_alloc_bytes}",
        f"local-mem:{info.local_mem_bytes}",
        f"max-work-group:{info.max_work_group}",
        f"base-addr-align-bits:{info.base_addr_align_bits}",
    ]
    caps += [f"ext:{e}" for e in info.extensions]
    caps.append(ALIAS_CAPABILITY)  # the executor reads aliased reshape results from their operand's bytes
    caps += LOWERINGS.op_capabilities()  # the fused ops lowered in lower/fused.py: the optimizer may make them
    caps += FORMAT_CAPABILITIES
    return TargetProfile(
        backend=NAME,
        device=info.name,
        arch=f"{info.kind}:{info.vendor}",
        compute_units=info.compute_units,
        memory_bytes=info.global_mem_bytes,
        dtypes=storage_dtypes(info),
        tensor_core_formats=(),
        capabilities=tuple(caps),
        libraries={
            "pyopencl": cl.VERSION_TEXT,
            "opencl": info.version,
            "opencl-c": info.c_version,
            "driver": info.driver,
            "platform": f"{info.platform} ({info.platform_version})",
        },
        host_threshold_bytes=host_threshold_bytes,
    )


def free_memory(device: Any, info: DeviceInfo, used_bytes: int) -> int:
    """Free device memory: AMD reports it (cl_amd_device_attribute_query); CPU devices share host
    memory (MemAvailable); otherwise global memory minus what this backend holds."""
    if "cl_amd_device_attribute_query" in info.extensions:
        try:
            free_kib = device.get_info(0x4039)  # CL_DEVICE_GLOBAL_FREE_MEMORY_AMD, KiB per memory
            return int(free_kib[0] if isinstance(free_kib, list | tuple) else free_kib) * 1024
        except Exception:
            pass
    if info.kind == "cpu":
        return min(available_memory_bytes(), info.global_mem_bytes)
    return max(info.global_mem_bytes - used_bytes, 0)


# -- the backend ----------------------------------------------------------------------------------------

HOST_EVAL_MAX_BYTES_CPU = 196_608
"""The profile's `host_threshold_bytes` on CPU devices: the planner places nodes whose operands are
all host-known (program inputs, weights, other such nodes) and that touch at most this many bytes
(operands + results) on the host, where the executor runs them with the op's numpy reference
instead of as a dispatch (`dif.plan.placement`). Measured on PoCL (2 EPYC cores,
perf/opencl_bench.py, chains of adds): a pipelined tiny launch costs 4-6 us, like one numpy call,
but PoCL's kernel time grows faster (16K-element add: 36-41 us vs 10-11 us on the host); the host
stays faster up to 16K elements (196,608 B per node) and loses from 32K (393,216 B)."""
HOST_EVAL_MAX_BYTES_GPU = 16 << 10
"""The same threshold for GPUs / accelerators, where a dispatch is cheap and the host result must
cross the bus: conservative until measured on such a device (perf/opencl_bench.py prints it)."""


class OpenCLBackend:
    """One OpenCL device: its context, one in-order queue, the kernel library and a buffer pool.

    `device` selects the device ('P:D' or a name substring; default: the best GPU, else a CPU).
    `host_eval_max_bytes` is the host threshold its profile declares to the planner (None: the
    measured default for the device kind, 0: never); it and `options` exist for tests and tuning."""

    name = NAME

    def __init__(
        self,
        device: str | None = None,
        *,
        host_eval_max_bytes: int | None = None,
        options: Any = None,
        profiling: bool = False,
    ) -> None:
        import pyopencl as cl

        from dif_backend_opencl.library import KernelLibrary
        from dif_backend_opencl.lower import LowerOptions
        from dif_backend_opencl.memory import BufferPool

        self.device = pick_device(list_devices(), device)
        self.info = describe(self.device)
        self.context = cl.Context([self.device])
        if profiling:
            self.queue = cl.CommandQueue(self.context, properties=cl.command_queue_properties.PROFILING_ENABLE)
        else:
            self.queue = cl.CommandQueue(self.context)
        self.row_group = min(256 if self.info.kind != "cpu" else 64, _pow2_floor(self.info.max_work_group))
        self.library = KernelLibrary(self.context, self.row_group)
        self.pool = BufferPool(
            self.context, self.info.max_alloc_bytes, idle_limit_bytes=self.info.global_mem_bytes // 4
        )
        if host_eval_max_bytes is None:
            host_eval_max_bytes = HOST_EVAL_MAX_BYTES_CPU if self.info.kind == "cpu" else HOST_EVAL_MAX_BYTES_GPU
        self.host_eval_max_bytes = host_eval_max_bytes
        self.options = options if options is not None else LowerOptions()
        self.profiling = profiling

    def profile(self) -> TargetProfile:
        return profile_of(self.info, self.host_eval_max_bytes or None)

    def budget(self) -> RuntimeBudget:
        return RuntimeBudget(
            free_memory_bytes=free_memory(self.device, self.info, self.pool.live_bytes),
            host_memory_bytes=available_memory_bytes(),
            workspace_bytes=self.options.scratch_cap_bytes,
        )

    def prepare(self, program: Program, plan: Plan, weights: Mapping[str, Any]) -> Any:
        """Check the plan, upload weights, lower every node to pre-bound launches. Raises
        `PlanError`, `WeightError` or `NotImplementedOnBackend` before anything runs."""
        from dif_backend_opencl.executor import OpenCLExecutable

        return OpenCLExecutable.create(self, program, plan, weights)


def _pow2_floor(n: int) -> int:
    return 1 << (max(int(n), 1).bit_length() - 1)
