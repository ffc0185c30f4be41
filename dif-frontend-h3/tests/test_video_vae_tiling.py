"""The video VAE decode geometry at the published config: tile layout equal to diffusers'
`_split_tiles` for every canvas size, the notes' default canvas (768 x 1344, 124 frames) as 7 chunks x
4 x 7 tiles of 7 x 16 x 16 latents, and the frame arithmetic 5n + 2 latent -> 17n + 5 pixel frames."""

from __future__ import annotations

import numpy as np
import pytest

from dif_frontend_h3.configs import published
from dif_frontend_h3.vae_config import VideoVaeConfig
from dif_frontend_h3.video_vae_tiling import (
    VideoTiling,
    blend,
    chunk_plan,
    decode_tile_count,
    decode_tile_shape,
    decode_video,
    split_tiles,
)


@pytest.fixture(scope="module")
def cfg() -> VideoVaeConfig:
    return VideoVaeConfig.from_json(published() / "vae" / "config.json")


def test_published_chunk_geometry(cfg: VideoVaeConfig) -> None:
    assert (cfg.spatial_ratio, cfg.temporal_ratio) == (16, 4)
    assert (cfg.tokens_chunk_size, cfg.token_overlap, cfg.frame_pre_padding, cfg.frame_overlap) == (5, 2, 3, 5)
    assert cfg.decoder_dim == 2048 and cfg.rope_dim == 48 and cfg.patch_features == 3072


@pytest.mark.oracle
def test_tile_layout_equals_diffusers(torch) -> None:  # type: ignore[no-untyped-def]
    from diffusers import AutoencoderKLMiniMaxH3

    split = AutoencoderKLMiniMaxH3._split_tiles
    ref = type("Ratio", (), {"spatial_compression_ratio": 16})()
    for length in range(32, 2049, 32):
        assert split_tiles(length, 256, 64, 16) == tuple(split(ref, length, 256, 64)), length


def test_default_canvas_is_196_decoder_calls_of_one_shape(cfg: VideoVaeConfig) -> None:
    shape = (1, 24, 37, 768 // 16, 1344 // 16)  # 124 frames = 17 * 7 + 5 -> 5 * 7 + 2 latent frames
    assert chunk_plan(cfg, 37).chunks == 7
    assert decode_tile_count(cfg, shape) == 7 * 4 * 7
    assert decode_tile_shape(cfg, shape) == (7, 16, 16)
    starts, sizes, overlaps = split_tiles(1344, 256, 64, 16)
    assert sizes == [256] * 7 and starts[-1] + 256 == 1344 and min(overlaps) >= 64


@pytest.mark.parametrize("n", [1, 2, 3])
def test_frame_count_is_17n_plus_5(cfg: VideoVaeConfig, n: int) -> None:
    """A stub tile decoder returning zeros shows the frame bookkeeping alone (4 x 4 latent canvas)."""
    calls = []

    def run(inputs):  # type: ignore[no-untyped-def]
        b, _, t, h, w = inputs["latent"].shape
        calls.append(inputs["latent"].shape)
        return np.zeros((b, 3, 4 * t, 16 * h, 16 * w), np.float32)

    latents = np.zeros((1, 24, 5 * n + 2, 4, 4), np.float32)
    video = decode_video(cfg, latents, run, tiling=VideoTiling())
    assert video.shape == (1, 3, 17 * n + 5, 64, 64)
    assert len(calls) == n and all(s[2] == 7 for s in calls)


def test_blend_is_a_linear_ramp() -> None:
    a, b = np.ones((1, 4), np.float32), np.zeros((1, 6), np.float32)
    out = blend(a, b, 4, axis=-1)
    assert out.shape == (1, 6)
    np.testing.assert_array_equal(out[0], [1.0, 0.75, 0.5, 0.25, 0.0, 0.0])


def test_bad_video_vae_configs_are_refused() -> None:
    from dif.errors import ConfigError

    with pytest.raises(ConfigError, match="_class_name"):
        VideoVaeConfig.from_dict({"_class_name": "AutoencoderKLFlux2"})
    with pytest.raises(ConfigError, match="one length"):
        VideoVaeConfig.from_dict({"block_out_channels": [128, 256], "latents_mean": None})
    with pytest.raises(ConfigError, match="multiple of 6"):
        VideoVaeConfig.from_dict({"decoder_attention_head_dim": 60})
    with pytest.raises(ConfigError, match="latents_std"):
        VideoVaeConfig.from_dict({"latents_std": [1.0] * 23})
