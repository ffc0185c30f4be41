"""Which backends a test can use here: the reason one cannot run, for a skip that says why."""

from __future__ import annotations


def backend_skip_reason(name: str) -> str | None:
    """None when backend `name` is installed and available on this machine, else why not (not installed, or
    the backend's own availability check's reason: no GPU, no driver, a library missing)."""
    from dif.plugins.manager import backends

    info = backends().get(name)
    if info is None:
        return f"dif-backend-{name} is not installed"
    availability = info.is_available()
    return None if availability.ok else availability.reason
