"""Page-cache residency of model files, measured before a benchmark stage (is this a cold or a warm start?).

Where it sits: `dif.bench.runner` probes each stage's `model_files` with `probe_files` before starting it.
The probe maps each file read-only and asks the kernel with mincore(2) which pages are in memory; nothing
is read, so probing does not warm the cache. `evict` asks the kernel to drop a file's clean pages
(posix_fadvise DONTNEED: advice, which pages still mapped or dirty survive).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import glob
import mmap
import os
from collections.abc import Sequence
from typing import Any

import numpy as np
from attrs import frozen

WARM_AT = 0.95  # resident fraction at or above which a start counts as warm
COLD_BELOW = 0.05  # ... and below which it counts as cold; between the two it is mixed


class ResidencyUnavailable(Exception):
    """mincore/mmap are not usable here (not a POSIX libc); the probe reports 'not measured'."""


@frozen
class FileResidency:
    path: str
    bytes: int
    resident_bytes: int

    @property
    def fraction(self) -> float:
        return self.resident_bytes / self.bytes if self.bytes else 1.0


def _libc() -> Any:
    libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    return libc


def file_residency(path: str) -> FileResidency:
    """How many bytes of `path` are in the page cache now (the last page counts whole when resident)."""
    size = os.path.getsize(path)
    if size == 0:
        return FileResidency(path, 0, 0)
    try:
        libc = _libc()
    except (OSError, AttributeError) as exc:  # no POSIX libc (Windows)
        raise ResidencyUnavailable(f"libc mmap/mincore not available: {exc}") from None
    page = mmap.PAGESIZE
    pages = (size + page - 1) // page
    fd = os.open(path, os.O_RDONLY)
    try:
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr in (None, ctypes.c_void_p(-1).value):
            raise OSError(ctypes.get_errno(), f"mmap of {path} failed: {os.strerror(ctypes.get_errno())}")
        try:
            vec = np.zeros(pages, dtype=np.uint8)
            if libc.mincore(ctypes.c_void_p(addr), size, vec.ctypes.data_as(ctypes.c_void_p)) != 0:
                raise OSError(ctypes.get_errno(), f"mincore on {path} failed: {os.strerror(ctypes.get_errno())}")
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
    finally:
        os.close(fd)
    resident_pages = int(np.count_nonzero(vec & 1))  # bit 0: resident; the other bits are reserved
    resident = min(resident_pages * page, size)
    return FileResidency(path, size, resident)


def classify(fraction: float) -> str:
    """'warm', 'cold' or 'mixed' for a resident fraction in [0, 1]."""
    if fraction >= WARM_AT:
        return "warm"
    if fraction < COLD_BELOW:
        return "cold"
    return "mixed"


def expand(patterns: Sequence[str]) -> list[str]:
    """The regular files the glob `patterns` match (`**` recursive), sorted, each once."""
    found = {p for pattern in patterns for p in glob.glob(pattern, recursive=True) if os.path.isfile(p)}
    return sorted(found)


def probe_files(patterns: Sequence[str]) -> dict[str, Any]:
    """The residency record of a stage: overall resident fraction of the files `patterns` match (by bytes),
    its class, and each file's fraction; `measured: False` with the reason when it cannot be known."""
    files = expand(patterns)
    if not files:
        reason = "no model_files declared" if not patterns else "no file matches model_files"
        return {"measured": False, "reason": reason, "patterns": list(patterns)}
    try:
        per_file = [file_residency(f) for f in files]
    except (ResidencyUnavailable, OSError) as exc:
        return {"measured": False, "reason": str(exc), "patterns": list(patterns)}
    total = sum(f.bytes for f in per_file)
    resident = sum(f.resident_bytes for f in per_file)
    fraction = resident / total if total else 1.0
    return {
        "measured": True,
        "class": classify(fraction),
        "resident_fraction": round(fraction, 4),
        "bytes": total,
        "resident_bytes": resident,
        "files": [{"path": f.path, "bytes": f.bytes, "resident_fraction": round(f.fraction, 4)} for f in per_file],
    }


def evict(path: str) -> bool:
    """Ask the kernel to drop `path`'s cached pages; False where posix_fadvise does not exist."""
    if not hasattr(os, "posix_fadvise"):
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        if hasattr(os, "fdatasync"):
            os.fdatasync(fd)  # dirty pages cannot be dropped; write them back first
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return True
