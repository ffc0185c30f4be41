"""The published Krea 2 configs (raw, turbo) as package data: one diffusers folder per variant,
configs only, no weights. Full-size architecture tests and `dif krea2 info --variant` read them from here.
Provenance and status of every file (verbatim or reconstructed): SOURCES.md beside this module.
"""

from __future__ import annotations

from pathlib import Path

from dif.checkpoint import published_configs


def published(variant: str) -> Path:
    """The folder of `variant`'s published configs; `UsageError` naming the known variants otherwise."""
    return published_configs("dif_frontend_krea2", variant)
