"""The published MiniMax-H3 configs as package data: one diffusers (modular) folder, configs only, no
weights, plus the transformer's safetensors index (the published tensor names and shapes' file map).
Full-size architecture tests and `dif h3 info --variant h3` read them from here; SOURCES.md says where
they came from.
"""

from __future__ import annotations

from pathlib import Path

from dif.checkpoint import published_configs


def published(variant: str = "h3") -> Path:
    """The folder of `variant`'s published configs; `UsageError` naming the known variants otherwise."""
    return published_configs("dif_frontend_h3", variant)
