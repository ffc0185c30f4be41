"""Configs of the published Krea 2 folders, their cross-checks, and what follows from them:
schedules (Turbo / Raw), default settings, size rounding and the latent packing."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dif.errors import CheckpointError
from dif.sched import cfg_combine
from dif_frontend_krea2.config import ConfigError, Krea2TransformerConfig, load_configs
from dif_frontend_krea2.pipeline import (
    default_steps_guidance,
    denormalize,
    krea2_schedule,
    pack_latents,
    round_size,
    unpack_latents,
)
from dif_frontend_krea2.plugin import INFO


def test_published_configs_load(model_configs: Callable[[str], Path]) -> None:
    turbo = load_configs(model_configs("turbo"))
    raw = load_configs(model_configs("raw"))
    assert turbo.pipeline.is_distilled and turbo.pipeline.variant == "turbo"
    assert not raw.pipeline.is_distilled and raw.pipeline.variant == "raw"
    t = turbo.transformer
    assert (t.hidden_size, t.num_layers, t.num_key_value_heads, t.text_head_dim) == (6144, 28, 12, 128)
    assert turbo.pipeline.text_encoder_select_layers == (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)
    assert turbo.text_encoder.rope_theta == 5e6 and turbo.text_encoder.num_hidden_layers == 36
    assert turbo.vae.scale_factor == 8 and turbo.vae.z_dim * 4 == t.in_channels
    assert turbo.transformer == raw.transformer and turbo.scheduler == raw.scheduler


def test_schedules_follow_model_index(model_configs: Callable[[str], Path]) -> None:
    turbo = load_configs(model_configs("turbo"))
    raw = load_configs(model_configs("raw"))
    assert default_steps_guidance(turbo) == (8, 0.0)
    assert default_steps_guidance(raw) == (28, 4.5)
    n = 4096  # 1024 x 1024
    st = krea2_schedule(turbo, n, 8)
    assert st.mu == pytest.approx(1.15) and st.num_steps == 8 and st.sigmas[-1] == 0.0
    assert krea2_schedule(turbo, 256, 8).mu == pytest.approx(1.15)  # fixed, whatever the size
    sr = krea2_schedule(raw, n, 28)
    # mu on the line through (256, 0.5) and (6400, 1.15)
    assert sr.mu == pytest.approx(0.5 + (n - 256) * 0.65 / 6144) and sr.num_steps == 28
    assert krea2_schedule(raw, 256, 28).mu == pytest.approx(0.5)
    assert krea2_schedule(raw, 6400, 28).mu == pytest.approx(1.15)
    # exponential shift of linspace(1, 1/n, n): sigma' = e^mu / (e^mu + 1/sigma - 1)
    base = np.linspace(1.0, 1.0 / 28, 28)
    e = np.exp(sr.mu)
    np.testing.assert_allclose(sr.sigmas[:-1], e / (e + 1 / base - 1), rtol=1e-6)
    np.testing.assert_allclose(sr.timesteps, sr.sigmas[:-1] * 1000, rtol=1e-6)


def test_size_rounding_and_packing() -> None:
    assert round_size(1024, 1024, 16)[:2] == (1024, 1024)
    w, h, warnings = round_size(1000, 770, 16)
    assert (w, h) == (1008, 784) and len(warnings) == 2 and "1000" in warnings[0]
    x = np.random.default_rng(0).standard_normal((1, 16, 6, 8)).astype(np.float32)
    packed = pack_latents(x)
    assert packed.shape == (1, 12, 64)
    # token (row 1, col 2), channel c*4 + 2*dy + dx
    assert packed[0, 1 * 4 + 2, 5 * 4 + 2 * 1 + 0] == x[0, 5, 2 + 1, 4 + 0]
    np.testing.assert_array_equal(unpack_latents(packed, 3, 4), x)


def test_denormalize_and_cfg_arithmetic() -> None:
    z = np.ones((1, 2, 1, 1), np.float32)
    np.testing.assert_allclose(denormalize(z, (0.5, -1.0), (2.0, 4.0))[:, :, 0, 0], [[2.5, 3.0]])
    cond, uncond = np.array([1.0, 2.0], np.float32), np.array([0.5, 3.0], np.float32)
    krea2 = cfg_combine(cond, uncond, 4.5, base="cond")  # the Krea 2 convention: cond + g (cond - uncond)
    np.testing.assert_allclose(krea2, [1 + 4.5 * 0.5, 2 - 4.5])


def test_plugin_settings() -> None:
    assert INFO.name == "krea2" and INFO.variants == ("raw", "turbo")
    assert INFO.resolve_settings({"width": 1000})["width"] == 1000


def _copy(model_configs: Callable[[str], Path], tmp_path: Path) -> Path:
    dst = tmp_path / "krea2"
    shutil.copytree(model_configs("raw"), dst)
    return dst


def test_config_errors_name_the_file(model_configs: Callable[[str], Path], tmp_path: Path) -> None:
    root = _copy(model_configs, tmp_path)
    cfg_path = root / "transformer" / "config.json"
    data = json.loads(cfg_path.read_text())
    data["use_magic"] = True
    cfg_path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match=r"transformer/config\.json.*use_magic"):
        load_configs(root)
    data.pop("use_magic")
    data["num_text_layers"] = 11
    cfg_path.write_text(json.dumps(data))
    with pytest.raises(ConfigError, match="selects 12 text-encoder layers"):
        load_configs(root)
    with pytest.raises(CheckpointError, match="model_index.json"):
        load_configs(tmp_path)
    with pytest.raises(ConfigError, match="axes_dims_rope"):
        Krea2TransformerConfig.from_dict({"axes_dims_rope": [32, 48, 40]})
