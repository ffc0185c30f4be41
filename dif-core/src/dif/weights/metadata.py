"""A single checkpoint file's own metadata: the safetensors `__metadata__` or the GGUF key-value pairs,
and the model config a file may carry in it (its `config` entry, as ComfyUI- and dif-written files do).
Frontends read it to configure a lone transformer / VAE / text-encoder file before the published configs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from dif.errors import ConfigError
from dif.weights.gguf import GGUFFile, is_gguf
from dif.weights.safetensors_file import read_header


def file_metadata(path: str | Path) -> dict[str, Any]:
    """The metadata of a safetensors (`__metadata__`) or GGUF (key-value) file."""
    if is_gguf(path):
        return dict(GGUFFile(Path(path)).metadata)
    _, metadata, _ = read_header(path)
    return dict(metadata)


def embedded_config(path: str | Path) -> dict[str, Any] | None:
    """The JSON `config` a single file carries in its metadata, if any (`ConfigError` if not JSON)."""
    raw = file_metadata(path).get("config")
    if raw is None:
        return None
    try:
        data = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        data = None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: its metadata 'config' is not a JSON object")
    return data
