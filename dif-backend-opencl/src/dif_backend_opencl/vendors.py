"""OpenCL runtimes installed by pip, made visible to the ICD loader.

pip can install a whole CPU OpenCL implementation: Intel's `intel-opencl-rt`, whose library finds its
`tbb` and `intel-cmplr-lib-rt` neighbours in <prefix>/lib through its `$ORIGIN` runpath (the wheel pulls in
`tbb` but not `intel-cmplr-lib-rt`, which must be asked for: `dif-backend-opencl[intel-cpu]` does). But the .icd
file in its wheel names the conda build prefix (`/opt/anaconda1anaconda2anaconda3/lib/...`), not the
installed path, and pip puts it under <prefix>/etc where no loader looks; so the loader never lists it.

`register_pip_runtimes` writes a vendors folder holding the loader's current .icd files plus one naming
each installed library, and points OCL_ICD_VENDORS at it. The loader reads that variable once, at the
first platform query, so this runs before dif's first query (`device.list_devices`).

Why it matters: PoCL's LLVM cannot build a kernel on a CPU newer than itself (PoCL 3.0 with LLVM 14 on
Zen 5: "unknown target CPU 'generic'"); Intel's runtime builds on any x86-64 CPU, so a CPU host gets a
working OpenCL device from PyPI alone (`pip install dif-backend-opencl[intel-cpu]`).
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import os
from functools import cache
from pathlib import Path

from dif.env import cache_dir
from dif.errors import DifError
from dif.serialize.container import write_atomic

PIP_RUNTIMES: dict[str, str] = {"intel-opencl-rt": "libintelocl.so"}
"""Distribution name -> the ICD library file its wheel installs."""
NEIGHBOURS: dict[str, tuple[tuple[str, str], ...]] = {
    "libintelocl.so": (
        ("libtbb.so.12", "tbb"),
        ("libimf.so", "intel-cmplr-lib-rt"),
        ("libintlc.so.5", "intel-cmplr-lib-rt"),
    )
}
"""ICD library -> (a library it loads from its own folder, the distribution that installs it)."""
SYSTEM_VENDORS = Path("/etc/OpenCL/vendors")


def pip_runtime_libraries() -> list[Path]:
    """The ICD libraries of the pip-installed runtimes in PIP_RUNTIMES that are present on disk."""
    found: list[Path] = []
    for dist, library in PIP_RUNTIMES.items():
        try:
            files = importlib.metadata.distribution(dist).files or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in files:
            path = Path(str(f.locate()))
            if f.name == library and path.exists():
                found.append(path.resolve())
    return found


def missing_neighbours() -> str | None:
    """What a pip-installed runtime lacks beside it, with the fix (the loader skips such a library without a
    word); None when nothing is missing."""
    for lib in pip_runtime_libraries():
        gone = [(name, dist) for name, dist in NEIGHBOURS.get(lib.name, ()) if not (lib.parent / name).exists()]
        if gone:
            names = ", ".join(name for name, _ in gone)
            dists = " ".join(sorted({dist for _, dist in gone}))
            return f"{lib} cannot load without {names} in {lib.parent}; pip install {dists}"
    return None


def current_entries(vendors: str | None) -> dict[str, str]:
    """The loader's registrations now, as .icd file name -> the library it names: the folder or file
    OCL_ICD_VENDORS names (ocl-icd accepts both), else the system folder."""
    source = Path(vendors) if vendors else SYSTEM_VENDORS
    if source.is_dir():
        return {icd.name: icd.read_text().strip() for icd in sorted(source.glob("*.icd")) if icd.is_file()}
    if source.is_file():
        text = source.read_text(errors="replace").strip() if source.suffix == ".icd" else str(source)
        return {f"{source.stem}.icd": text}
    return {}


def vendors_folder(entries: dict[str, str]) -> Path:
    """A folder of .icd files holding `entries`, under the cache, named by their content so that
    processes with the same registrations share it (written file by file with temp + rename)."""
    digest = hashlib.sha256(repr(sorted(entries.items())).encode()).hexdigest()[:16]
    folder = cache_dir() / "opencl-vendors" / digest
    folder.mkdir(parents=True, exist_ok=True)
    for name, library in entries.items():
        icd = folder / name
        if not icd.exists() or icd.read_text().strip() != library:
            write_atomic(icd, f"{library}\n".encode())
    return folder


@cache
def register_pip_runtimes() -> Path | None:
    """Register every pip-installed runtime the loader does not already list (once per process);
    returns the vendors folder now in OCL_ICD_VENDORS, or None when nothing was missing."""
    libraries = pip_runtime_libraries()
    entries = current_entries(os.environ.get("OCL_ICD_VENDORS"))
    listed = {Path(lib).resolve() for lib in entries.values() if Path(lib).is_absolute()}
    missing = [lib for lib in libraries if lib not in listed]
    if not missing:
        return None
    for lib in missing:
        entries[f"dif-pip-{lib.name.split('.so')[0]}.icd"] = str(lib)
    try:
        folder = vendors_folder(entries)
    except (OSError, DifError):  # an unwritable cache: the runtime stays unlisted, as it was before dif ran
        return None
    os.environ["OCL_ICD_VENDORS"] = str(folder)
    return folder
