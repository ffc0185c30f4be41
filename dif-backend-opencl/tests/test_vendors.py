"""pip-installed OpenCL runtimes made visible to the ICD loader (`dif_backend_opencl.vendors`): the vendors
folder keeps the loader's current registrations and adds the missing library; nothing changes when the
library is already listed or absent; the real Intel runtime, where pip installed it, builds a kernel."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

from dif_backend_opencl import vendors


@pytest.fixture
def fake_runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A 'pip-installed' library, an empty cache and no OCL_ICD_VENDORS; `register_pip_runtimes` uncached."""
    lib = tmp_path / "prefix" / "lib" / "libintelocl.so"
    lib.parent.mkdir(parents=True)
    lib.write_bytes(b"\x7fELF")
    monkeypatch.setattr(vendors, "pip_runtime_libraries", lambda: [lib])
    monkeypatch.setenv("DIF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("OCL_ICD_VENDORS", raising=False)
    vendors.register_pip_runtimes.cache_clear()
    yield lib
    vendors.register_pip_runtimes.cache_clear()


def test_the_folder_keeps_the_system_registrations_and_adds_the_runtime(
    fake_runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    system = tmp_path / "etc-vendors"
    system.mkdir()
    (system / "nvidia.icd").write_text("libnvidia-opencl.so.1\n")
    monkeypatch.setattr(vendors, "SYSTEM_VENDORS", system)
    folder = vendors.register_pip_runtimes()
    assert folder is not None and str(folder) == vendors.os.environ["OCL_ICD_VENDORS"]
    assert folder.is_relative_to(tmp_path / "cache" / "opencl-vendors")
    icds = {p.name: p.read_text().strip() for p in folder.glob("*.icd")}
    assert icds == {"nvidia.icd": "libnvidia-opencl.so.1", "dif-pip-libintelocl.icd": str(fake_runtime)}
    assert not list(folder.glob(".*.tmp"))  # written whole (temp file + rename)


def test_a_user_vendors_folder_is_kept_too(fake_runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mine = tmp_path / "my-vendors"
    mine.mkdir()
    (mine / "pocl.icd").write_text("/opt/pocl/lib/libpocl.so\n")
    monkeypatch.setenv("OCL_ICD_VENDORS", str(mine))
    folder = vendors.register_pip_runtimes()
    assert folder is not None
    assert {p.name for p in folder.glob("*.icd")} == {"pocl.icd", "dif-pip-libintelocl.icd"}


def test_nothing_changes_when_the_runtime_is_listed_or_absent(
    fake_runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    listed = tmp_path / "listed"
    listed.mkdir()
    (listed / "intel.icd").write_text(f"{fake_runtime}\n")
    monkeypatch.setenv("OCL_ICD_VENDORS", str(listed))
    assert vendors.register_pip_runtimes() is None
    assert vendors.os.environ["OCL_ICD_VENDORS"] == str(listed)
    vendors.register_pip_runtimes.cache_clear()
    monkeypatch.setattr(vendors, "pip_runtime_libraries", lambda: [])
    monkeypatch.delenv("OCL_ICD_VENDORS")
    assert vendors.register_pip_runtimes() is None and "OCL_ICD_VENDORS" not in vendors.os.environ


def test_an_unwritable_cache_leaves_the_loader_alone(
    fake_runtime: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    monkeypatch.setenv("DIF_CACHE_DIR", str(blocker))
    assert vendors.register_pip_runtimes() is None and "OCL_ICD_VENDORS" not in vendors.os.environ


def test_a_runtime_without_its_compiler_libraries_is_named_with_the_fix(fake_runtime: Path) -> None:
    (fake_runtime.parent / "libtbb.so.12").write_bytes(b"")
    hint = vendors.missing_neighbours()
    assert hint == (
        f"{fake_runtime} cannot load without libimf.so, libintlc.so.5 in {fake_runtime.parent}; "
        "pip install intel-cmplr-lib-rt"
    )
    for name in ("libimf.so", "libintlc.so.5"):
        (fake_runtime.parent / name).write_bytes(b"")
    assert vendors.missing_neighbours() is None


def test_the_installed_intel_runtime_builds_a_kernel() -> None:
    """Where `intel-opencl-rt` is installed (the test dependencies install it), its library is found and
    registered, and its device builds and runs a kernel; elsewhere this says it is not installed."""
    try:
        importlib.metadata.distribution("intel-opencl-rt")
    except importlib.metadata.PackageNotFoundError:
        pytest.skip("intel-opencl-rt is not installed here (pip install dif-backend-opencl[intel-cpu])")
    libs = vendors.pip_runtime_libraries()
    assert [p.name.split(".so")[0] for p in libs] == ["libintelocl"] and libs[0].exists()
    from dif_backend_opencl import device

    intel = [d for d in device.list_devices() if "Intel" in d.platform.name]
    assert intel, "the Intel platform is not listed"
    assert device.compiler_failure(intel[0]) is None
