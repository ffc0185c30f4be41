"""Device discovery, TargetProfile / RuntimeBudget, availability reasons (including the NVIDIA ICD
hint), priority relative to the CPU backend, build options and plugin registration."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from dif.backend import BackendInfo
from dif.errors import BackendError, BackendUnavailableError
from dif_backend_opencl import device, library, plugin


def test_profile_describes_the_device(ocl) -> None:
    p = ocl.profile()
    info = ocl.info
    assert p.backend == "opencl" and p.device == info.name and p.compute_units == info.compute_units >= 1
    assert p.memory_bytes == info.global_mem_bytes > 0
    assert {"f32", "bf16", "f16"} <= set(p.dtypes)
    assert f"max-alloc:{info.max_alloc_bytes}" in p.capabilities
    assert ("fp16-arithmetic" in p.capabilities) == ("cl_khr_fp16" in info.extensions)
    assert ("fp64" in p.capabilities) == ("cl_khr_fp64" in info.extensions)
    assert all(f"ext:{e}" in p.capabilities for e in info.extensions)
    assert {"pyopencl", "opencl", "opencl-c", "driver", "platform"} <= set(p.libraries)
    assert p.libraries["opencl"].startswith("OpenCL ")
    assert p.fingerprint() == ocl.profile().fingerprint()


def test_budget_reports_free_memory(ocl) -> None:
    b = ocl.budget()
    assert 0 < b.free_memory_bytes <= ocl.info.global_mem_bytes
    assert b.workspace_bytes == ocl.options.scratch_cap_bytes


def test_available_here(ocl) -> None:
    assert device.availability().ok


def test_pick_device_by_index_or_name(ocl) -> None:
    devices = device.list_devices()
    assert device.pick_device(devices, "0:0") == device._indexed(devices)[0][1]
    first = devices[0]
    assert device.pick_device(devices, first.name.strip()[:6]) is not None
    with pytest.raises(BackendUnavailableError, match="no OpenCL device matches"):
        device.pick_device(devices, "no-such-device-xyz")


def _fake(kind: int, platform: str = "Fake") -> SimpleNamespace:
    return SimpleNamespace(type=kind, platform=SimpleNamespace(name=platform), global_mem_size=1 << 30)


@pytest.mark.parametrize(
    ("kinds", "expected"),
    [(["CPU"], device.PRIORITY_CPU_ONLY), (["CPU", "GPU"], device.PRIORITY_GPU), ([], device.PRIORITY_CPU_ONLY)],
)
def test_priority_follows_device_kinds(monkeypatch: pytest.MonkeyPatch, kinds: list[str], expected: int) -> None:
    cl = pytest.importorskip("pyopencl")
    monkeypatch.setattr(device, "list_devices", lambda: [_fake(getattr(cl.device_type, k)) for k in kinds])
    device.priority.cache_clear()
    try:
        assert device.priority() == expected
        assert plugin.info().rank() == expected
    finally:
        device.priority.cache_clear()
    assert device.PRIORITY_CPU_ONLY < 0 < device.PRIORITY_GPU  # cpu backend registers priority 0


def test_default_device_prefers_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    cl = pytest.importorskip("pyopencl")
    cpu, gpu = _fake(cl.device_type.CPU), _fake(cl.device_type.GPU)
    monkeypatch.setattr(device, "compiler_failure", lambda d: None)
    assert device.pick_device([cpu, gpu]) is gpu


def test_default_device_skips_one_whose_compiler_is_broken(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two CPU runtimes (PoCL and Intel's): PoCL's LLVM may not target this CPU; the one that builds wins."""
    cl = pytest.importorskip("pyopencl")
    pocl, intel = _fake(cl.device_type.CPU, "Portable Computing Language"), _fake(cl.device_type.CPU, "Intel(R) OpenCL")
    broken = {"Portable Computing Language": "unknown target CPU 'generic'"}
    monkeypatch.setattr(device, "compiler_failure", lambda d: broken.get(d.platform.name))
    assert device.pick_device([pocl, intel]) is intel
    broken["Intel(R) OpenCL"] = "also broken"
    assert device.pick_device([pocl, intel]) is pocl  # none builds: the first, and availability() says why


def test_nvidia_hint_when_library_present_but_no_icd(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(device, "nvidia_library", lambda: "/usr/lib/x86_64-linux-gnu/libnvidia-opencl.so.1")
    monkeypatch.setattr(device, "NVIDIA_ICD", tmp_path / "nvidia.icd")
    pocl = [SimpleNamespace(platform=SimpleNamespace(name="Portable Computing Language"))]
    hint = device.nvidia_hint(pocl)
    assert hint is not None and "nvidia.icd" in hint and "echo libnvidia-opencl.so.1" in hint
    (tmp_path / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")
    assert "found no NVIDIA platform" in (device.nvidia_hint(pocl) or "")
    nvidia = [SimpleNamespace(platform=SimpleNamespace(name="NVIDIA CUDA"))]
    assert device.nvidia_hint(nvidia) is None
    monkeypatch.setattr(device, "list_devices", lambda: [])
    avail = device.availability()
    assert not avail.ok and "no OpenCL platform" in avail.reason and "nvidia.icd" in avail.reason


def test_no_hint_without_the_nvidia_library(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(device, "nvidia_library", lambda: None)
    assert device.nvidia_hint([]) is None


def test_build_options_never_relax_math() -> None:
    assert "-cl-mad-enable" in library.BUILD_OPTIONS
    assert not set(library.BUILD_OPTIONS) & set(library.FORBIDDEN_OPTIONS)
    lib = library.KernelLibrary(context=None, row_group=64)
    assert "-DWG=64" in lib.options({})
    with pytest.MonkeyPatch.context() as mp:  # a forbidden option smuggled into the constant is refused
        mp.setattr(library, "BUILD_OPTIONS", ("-cl-fast-relaxed-math",))
        with pytest.raises(BackendError, match="fast-relaxed"):
            lib.options({})


def test_kernel_sources_ship_as_package_data() -> None:
    for name in ("common", "elementwise", "layout", "norm", "linalg", "conv", "attention", "fused"):
        assert "__kernel" in library.source(name) or name == "common"
    assert "fast-relaxed" not in library.full_source("norm").replace("Never built with -cl-fast-relaxed-math", "")


def test_plugin_registers_the_backend() -> None:
    from dif.plugins import backends

    info = backends()["opencl"]
    assert isinstance(info, BackendInfo) and info.name == "opencl"
    assert info.rank() in (device.PRIORITY_CPU_ONLY, device.PRIORITY_GPU)
    if device.list_devices() and all(device._kind(d) == "cpu" for d in device.list_devices()):
        assert info.rank() < backends()["cpu"].rank() if "cpu" in backends() else info.rank() < 0


def test_a_build_that_logs_warns_nothing(fresh_backend) -> None:  # type: ignore[no-untyped-def]
    """Intel's CPU runtime logs every successful build; pyopencl's CompilerWarning for it would land on
    stderr, inside a `--json` tool's output. A fresh kernel library builds without one."""
    import warnings

    backend = fresh_backend(host_eval_max_bytes=0)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        backend.library.program("elementwise", {"DIF_TEST_FRESH_BUILD": 1})
    assert not [w for w in seen if "compiler output" in str(w.message).lower()], [str(w.message) for w in seen]
