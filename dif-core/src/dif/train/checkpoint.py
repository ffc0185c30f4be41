"""`.diftrain`: a training run's state in one safetensors file, written atomically.

Tensors: the trainable values (`param/<name>`, master dtype), AdamW moments (`adam.m.<name>`,
`adam.v.<name>`). Metadata (`dif.train` JSON): format version, the model fingerprint the state belongs
to (`dif.train.step.model_fingerprint`), the optimizer step, the data order's state, the random
generator's state, the loss history and the run's settings. Loading checks all of it and names the
file and what is wrong: never a silent restart.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
from attrs import frozen

from dif.errors import CheckpointError, DifError, FormatError
from dif.serialize.diftensor import load_tensors, read_safetensors_header, save_tensors

SUFFIX = ".diftrain"
META_KEY = "dif.train"
VERSION = 1
PARAM = "param/"


@frozen
class TrainState:
    """Everything a resumed run needs to continue bit-identically."""

    model: str  # the model fingerprint
    step: int  # optimizer steps done
    params: dict[str, np.ndarray]
    moments: dict[str, np.ndarray]  # adam.m.<name> / adam.v.<name>
    rng: dict[str, Any]  # numpy bit-generator state
    data: dict[str, Any]  # the data order's state (epoch, position, permutation seed)
    losses: list[float]
    settings: dict[str, Any]


def save_state(path: str | Path, state: TrainState) -> Path:
    path = Path(path)
    tensors = {PARAM + k: v for k, v in state.params.items()} | dict(state.moments)
    meta = {
        "version": VERSION,
        "model": state.model,
        "step": state.step,
        "rng": state.rng,
        "data": state.data,
        "losses": state.losses,
        "settings": state.settings,
    }
    save_tensors(path, tensors, {META_KEY: json.dumps(meta, sort_keys=True)})
    return path


def load_state(path: str | Path, *, model: str | None = None) -> TrainState:
    """Read a `.diftrain`; with `model`, refuse one written for another model fingerprint."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such training checkpoint")
    try:
        tensors, meta = load_tensors(path)
    except (DifError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a readable .diftrain file ({exc})") from None
    raw = meta.get(META_KEY)
    if raw is None:
        raise FormatError(f"{path}: has no '{META_KEY}' metadata: not a training checkpoint")
    try:
        doc = json.loads(raw)
        if doc["version"] != VERSION:
            raise FormatError(f"{path}: .diftrain version {doc['version']} (this dif reads {VERSION})")
        state = TrainState(
            model=str(doc["model"]), step=int(doc["step"]),
            params={k[len(PARAM) :]: np.array(v) for k, v in tensors.items() if k.startswith(PARAM)},
            moments={k: np.array(v) for k, v in tensors.items() if not k.startswith(PARAM)},
            rng=dict(doc["rng"]), data=dict(doc["data"]), losses=[float(x) for x in doc["losses"]],
            settings=dict(doc["settings"]),
        )  # fmt: skip
    except (KeyError, TypeError, ValueError) as exc:
        raise FormatError(f"{path}: corrupted .diftrain metadata ({type(exc).__name__}: {exc})") from None
    if model is not None and state.model != model:
        raise CheckpointError(
            f"{path}: written for another model or LoRA layout (fingerprint {state.model[:24]}..., "
            f"this run is {model[:24]}...)",
            hint="resume with the model, rank and target modules the checkpoint was trained with",
        )
    for name in state.params:
        for kind in ("m", "v"):
            if f"adam.{kind}.{name}" not in state.moments:
                raise FormatError(f"{path}: optimizer moment adam.{kind}.{name} is missing")
    return state


def recorded_settings(path: str | Path) -> dict[str, Any]:
    """The run settings a `.diftrain` records, from its header alone (no tensor is read); {} when the
    file is not a readable `.diftrain` (`load_state` then refuses it by name)."""
    try:
        header, _ = read_safetensors_header(path)
        return dict(json.loads(header["__metadata__"][META_KEY])["settings"])
    except (DifError, OSError, ValueError, KeyError, TypeError):
        return {}


def check_shapes(path: str | Path, state: TrainState, expected: Mapping[str, tuple[int, ...]]) -> None:
    """Refuse a checkpoint whose trainable set or shapes differ from the run's (naming the tensor)."""
    if set(state.params) != set(expected):
        extra = sorted(set(state.params) - set(expected))[:3]
        lacking = sorted(set(expected) - set(state.params))[:3]
        raise CheckpointError(f"{path}: trainable tensors differ from this run (extra {extra}, missing {lacking})")
    for name, shape in expected.items():
        if tuple(state.params[name].shape) != tuple(shape):
            raise CheckpointError(f"{path}: '{name}' is {state.params[name].shape}, this run has {tuple(shape)}")
