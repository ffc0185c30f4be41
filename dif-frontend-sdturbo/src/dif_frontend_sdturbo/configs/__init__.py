"""The published SD-Turbo configs (sd-turbo: a diffusers folder without weights) and TAESD's
(taesd/config.json) as package data. Full-size architecture tests and `dif sdturbo info --variant`
read them from here. Provenance of every file: SOURCES.md beside this module.
"""

from __future__ import annotations

from pathlib import Path

from dif.checkpoint import published_configs


def published(variant: str) -> Path:
    """The folder of `variant`'s published configs ("sd-turbo"); `UsageError` naming the known ones otherwise."""
    return published_configs("dif_frontend_sdturbo", variant)


def taesd_config() -> Path:
    """madebyollin/taesd's config.json (AutoencoderTiny, 4 latent channels)."""
    return Path(__file__).resolve().parent / "taesd" / "config.json"
