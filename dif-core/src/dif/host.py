"""Host memory as backends report it in their `RuntimeBudget` (and the CPU backend in its profile).

Where it sits: under every backend's `budget()`; read from /proc/meminfo on Linux, else sysconf.
"""

from __future__ import annotations

import os
from pathlib import Path

_MEMINFO = Path("/proc/meminfo")


def _meminfo(key: str) -> int | None:
    """A /proc/meminfo field in bytes (Linux), or None where that file is absent or lacks it."""
    try:
        text = _MEMINFO.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        name, _, rest = line.partition(":")
        if name == key:
            fields = rest.split()
            return int(fields[0]) * (1024 if fields[1:] == ["kB"] else 1)
    return None


def _sysconf_bytes(pages: str) -> int:
    try:
        return int(os.sysconf(pages)) * int(os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return 0


def total_memory_bytes() -> int:
    """Physical memory of the host (MemTotal); 0 when it cannot be read."""
    return _meminfo("MemTotal") or _sysconf_bytes("SC_PHYS_PAGES")


def available_memory_bytes() -> int:
    """Host memory available right now (MemAvailable); 0 when it cannot be read."""
    return _meminfo("MemAvailable") or _sysconf_bytes("SC_AVPHYS_PAGES")
