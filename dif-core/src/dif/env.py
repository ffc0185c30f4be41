"""Every `DIF_*` environment variable dif reads, declared in one place (documented in docs/env.md).

Code reads a variable through its `EnvVar` here (`DIF_BACKEND.get()`), never `os.environ`
directly, so the list below is complete by construction and a test checks the docs against it.
"""

from __future__ import annotations

import os
from pathlib import Path

from attrs import frozen

from dif.errors import UsageError


@frozen
class EnvVar:
    """One declared variable: its name, what it does, and the value used when it is unset."""

    name: str
    doc: str
    default: str | None = None

    def get(self) -> str | None:
        """The value, or the default when unset. An empty string is a value, not "unset"."""
        return os.environ.get(self.name, self.default)

    def get_list(self) -> list[str] | None:
        """Comma-separated names; `None` when unset, `[]` for an empty string."""
        value = self.get()
        if value is None:
            return None
        return [part.strip() for part in value.split(",") if part.strip()]

    def get_bool(self) -> bool:
        value = (self.get() or "").strip().lower()
        if value in ("", "0", "false", "no", "off"):
            return False
        if value in ("1", "true", "yes", "on"):
            return True
        raise UsageError(f"{self.name}={value!r} is not a boolean", hint="use 1 or 0")


ENV_VARS: dict[str, EnvVar] = {}


def declare(name: str, doc: str, default: str | None = None) -> EnvVar:
    """Declare a variable (module level, below). Names must start with `DIF_`."""
    if not name.startswith("DIF_"):
        raise ValueError(f"environment variable {name} must start with DIF_")
    if name in ENV_VARS:
        raise ValueError(f"environment variable {name} is declared twice")
    var = EnvVar(name, doc, default)
    ENV_VARS[name] = var
    return var


DIF_LOAD_PLUGINS = declare(
    "DIF_LOAD_PLUGINS",
    "Comma-separated entry-point names of the plugins to load; empty string loads none; unset loads all.",
)
DIF_BACKEND = declare(
    "DIF_BACKEND",
    "Backend used when a command or `dif.runtime.get_backend()` is given no name; unset picks the "
    "available backend with the highest priority.",
)
DIF_PASSES = declare(
    "DIF_PASSES",
    "Optimizer passes `dif.runtime.prepare` runs: unset or `default` for the core pipeline plus plugin passes, "
    "`none` for no pass, or comma-separated pass names in order (`default` expands in place).",
)
DIF_CACHE_DIR = declare(
    "DIF_CACHE_DIR",
    "Folder for on-disk caches (compiled kernels, tuned plans). Default: $XDG_CACHE_HOME/dif or ~/.cache/dif.",
)


def cache_dir() -> Path:
    """The cache folder (not created here; writers create the subfolder they own)."""
    explicit = DIF_CACHE_DIR.get()
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "dif"
