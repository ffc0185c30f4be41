"""Config reading: the published folder and the embedded one load; bad folders are refused naming the file."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from dif.errors import CheckpointError, ConfigError
from dif_frontend_h3 import DEFAULT_CHECKPOINT
from dif_frontend_h3.config import load_configs
from dif_frontend_h3.configs import published
from dif_frontend_h3.weights import open_checkpoint


def test_published_configs() -> None:
    cfg = load_configs(published("h3"))
    t = cfg.transformer
    assert (t.hidden_size, t.inner_dim, t.rotary_dim, t.video_patch_dim) == (5376, 7168, 96, 96)
    assert (cfg.scheduler.shift, cfg.audio_scheduler.shift, cfg.text_encoder_layer) == (12.0, 3.0, 50)
    assert cfg.canvas_multiple == 32 and cfg.audio_vae.latents_per_second == 40
    assert cfg.text_encoder.num_hidden_layers == 64 and cfg.text_encoder.hidden_size == t.text_dim


def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "m"
    shutil.copytree(DEFAULT_CHECKPOINT, root)
    return root


def _edit(path: Path, **changes: object) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_wrong_component_class_refused(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    index = json.loads((root / "model_index.json").read_text())
    _edit(root / "model_index.json", transformer=["diffusers", "Flux2Transformer2DModel", index["transformer"][2]])
    with pytest.raises(ConfigError, match="component 'transformer' is 'Flux2Transformer2DModel'"):
        load_configs(root)


def test_tap_past_the_text_encoder_refused(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _edit(root / "model_index.json", text_encoder_layer=4)
    with pytest.raises(ConfigError, match=r"hidden_states\[4\].*this one has 4"):
        load_configs(root)


def test_unknown_transformer_key_refused(tmp_path: Path) -> None:
    root = _copy(tmp_path)
    _edit(root / "transformer" / "config.json", cross_attention=True)
    with pytest.raises(ConfigError, match="transformer/config.json.*unknown config keys cross_attention"):
        load_configs(root)


def test_not_an_h3_folder(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="not a MiniMax-H3 diffusers folder"):
        open_checkpoint(tmp_path)
