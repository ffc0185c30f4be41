"""MiniMax-H3's two autoencoders' full configs (AutoencoderKLMiniMaxH3, AutoencoderKLMiniMaxH3Audio):
every field the VAE program builders need, parsed and validated from the component's config.json.

Frontend stage 0, beside `config.py` (whose `VideoVaeGeometry` / `AudioVaeGeometry` hold only what the
packing needs). Defaults equal the diffusers class defaults; the derived temporal-chunking geometry is
the reference's (`frame_pre_padding`, `tokens_chunk_size`, `token_overlap`, `frame_overlap`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import frozen

from dif.checkpoint import read_json_object
from dif.config_fields import check_class_name, int_tuple, positive_float, positive_int
from dif.errors import ConfigError

VIDEO_CLASS = "AutoencoderKLMiniMaxH3"
AUDIO_CLASS = "AutoencoderKLMiniMaxH3Audio"
# ImageNet pixel convention of the video VAE (the modular pipeline's `pixel_mean` / `pixel_std`)
PIXEL_MEAN = (0.485, 0.456, 0.406)
PIXEL_STD = (0.229, 0.224, 0.225)
KEYFRAME_ENCODE_SEED = 42  # the posterior of a keyframe is sampled under a fresh generator seeded 42


def _floats(what: str, data: Mapping[str, Any], name: str, n: int, default: float) -> tuple[float, ...]:
    values = data.get(name)
    if values is None:
        return (default,) * n
    ok = isinstance(values, list | tuple) and len(values) == n
    if not ok or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values):
        raise ConfigError(f"{what}: '{name}' must be a list of {n} finite numbers")
    return tuple(float(v) for v in values)


def _get(data: Mapping[str, Any], name: str, default: Any) -> Any:
    value = data.get(name)
    return default if value is None else value


@frozen
class VideoVaeConfig:
    """AutoencoderKLMiniMaxH3: causal 3D CNN encoder (reflect padding) and non-causal ViT decoder."""

    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 24
    block_out_channels: tuple[int, ...] = (128, 256, 256, 512, 512, 1024)
    layers_per_block: int = 2
    spatial_downsample_factors: tuple[int, ...] = (2, 2, 2, 2, 1, 1)
    temporal_downsample_factors: tuple[int, ...] = (1, 2, 2, 1, 1, 1)
    norm_num_groups: int = 32
    norm_eps: float = 1e-6
    spatial_padding_mode: str = "reflect"
    decoder_num_layers: int = 36
    decoder_num_attention_heads: int = 32
    decoder_attention_head_dim: int = 64
    decoder_num_register_tokens: int = 4
    decoder_ffn_mult: int = 4
    decoder_rope_theta: float = 100.0
    decoder_rope_dim_ratio: float = 0.75
    decoder_norm_eps: float = 1e-5
    clip_length: int = 17
    token_drop: int = 3
    latents_mean: tuple[float, ...] = (0.0,) * 24
    latents_std: tuple[float, ...] = (1.0,) * 24

    @property
    def spatial_ratio(self) -> int:
        return math.prod(self.spatial_downsample_factors)

    @property
    def temporal_ratio(self) -> int:
        return math.prod(self.temporal_downsample_factors)

    @property
    def decoder_dim(self) -> int:
        return self.decoder_num_attention_heads * self.decoder_attention_head_dim

    @property
    def rope_dim(self) -> int:
        """Rotated channels of every decoder head (48 of 64)."""
        return int(self.decoder_attention_head_dim * self.decoder_rope_dim_ratio)

    @property
    def patch_features(self) -> int:
        """Features per decoder token out of proj_out: out_channels x pt x p x p."""
        return self.out_channels * self.temporal_ratio * self.spatial_ratio**2

    # the reference's derived temporal chunking (autoencoder_kl_minimax_h3.py, __init__)
    @property
    def frame_pre_padding(self) -> int:
        return (-self.clip_length) % self.temporal_ratio

    @property
    def tokens_chunk_size(self) -> int:
        return math.ceil(self.clip_length / self.temporal_ratio)

    @property
    def token_overlap(self) -> int:
        return (-self.token_drop) % self.tokens_chunk_size

    @property
    def frame_overlap(self) -> int:
        return max(self.token_overlap * self.temporal_ratio - self.frame_pre_padding, 0)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VideoVaeConfig:
        what = "MiniMax-H3 video VAE config"
        check_class_name(what, data, VIDEO_CLASS)
        d = cls()
        ints: dict[str, Any] = {
            n: positive_int(what, n, _get(data, n, getattr(d, n)))
            for n in (
                "in_channels", "out_channels", "latent_channels", "layers_per_block", "norm_num_groups",
                "decoder_num_layers", "decoder_num_attention_heads", "decoder_attention_head_dim",
                "decoder_num_register_tokens", "decoder_ffn_mult", "clip_length",
            )
        }  # fmt: skip
        token_drop = _get(data, "token_drop", d.token_drop)
        if not isinstance(token_drop, int) or isinstance(token_drop, bool) or token_drop < 0:
            raise ConfigError(f"{what}: 'token_drop' must be a non-negative integer, got {token_drop!r}")
        tuples: dict[str, Any] = {
            n: int_tuple(what, n, _get(data, n, list(getattr(d, n))))
            for n in ("block_out_channels", "spatial_downsample_factors", "temporal_downsample_factors")
        }
        levels = {len(v) for v in tuples.values()}
        if len(levels) != 1:
            raise ConfigError(f"{what}: block_out_channels and the downsample factor lists must have one length")
        floats: dict[str, Any] = {
            n: positive_float(what, n, _get(data, n, getattr(d, n)))
            for n in ("norm_eps", "decoder_rope_theta", "decoder_rope_dim_ratio", "decoder_norm_eps")
        }
        mode = _get(data, "spatial_padding_mode", d.spatial_padding_mode)
        if mode not in ("reflect", "zeros", "constant"):
            raise ConfigError(f"{what}: spatial_padding_mode {mode!r} is not 'reflect' or 'constant'")
        c = ints["latent_channels"]
        cfg = cls(
            **ints,
            **tuples,
            **floats,
            token_drop=token_drop,
            spatial_padding_mode="reflect" if mode == "reflect" else "constant",
            latents_mean=_floats(what, data, "latents_mean", c, 0.0),
            latents_std=_floats(what, data, "latents_std", c, 1.0),
        )
        if cfg.rope_dim % 6:
            raise ConfigError(f"{what}: {cfg.rope_dim} rotated channels per head must be a multiple of 6 (3 axes)")
        if any(ch % cfg.norm_num_groups for ch in cfg.block_out_channels):
            raise ConfigError(f"{what}: block_out_channels {cfg.block_out_channels} not divisible by the GN groups")
        return cfg

    @classmethod
    def from_json(cls, path: str | Path) -> VideoVaeConfig:
        return cls.from_dict(read_json_object(path, hint="point at a MiniMax-H3 vae/ folder"))


@frozen
class AudioVaeConfig:
    """AutoencoderKLMiniMaxH3Audio: DAC encoder + causal-attention projection, BigVGAN decoder; mono
    (stereo is two batch items)."""

    encoder_dim: int = 64
    encoder_rates: tuple[int, ...] = (2, 4, 4, 5, 5)
    latent_dim: int = 2048
    latent_channels: int = 32
    num_attention_heads: int = 8
    decoder_dim: int = 1024
    decoder_rates: tuple[int, ...] = (5, 5, 2, 2, 2, 2, 2)
    decoder_kernel_sizes: tuple[int, ...] = (9, 9, 4, 4, 4, 4, 4)
    resblock_kernel_sizes: tuple[int, ...] = (3, 7, 11)
    resblock_dilation_sizes: tuple[tuple[int, ...], ...] = ((1, 3, 5), (1, 3, 5), (1, 3, 5))
    sampling_rate: int = 32000
    latents_mean: tuple[float, ...] = (0.0,) * 32
    latents_std: tuple[float, ...] = (1.0,) * 32

    @property
    def hop_length(self) -> int:
        """Waveform samples per latent (800 = 40 latents/s at 32 kHz)."""
        return math.prod(self.decoder_rates)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AudioVaeConfig:
        what = "MiniMax-H3 audio VAE config"
        check_class_name(what, data, AUDIO_CLASS)
        d = cls()
        ints: dict[str, Any] = {
            n: positive_int(what, n, _get(data, n, getattr(d, n)))
            for n in ("encoder_dim", "latent_dim", "latent_channels", "num_attention_heads", "decoder_dim",
                      "sampling_rate")
        }  # fmt: skip
        tuples: dict[str, Any] = {
            n: int_tuple(what, n, _get(data, n, list(getattr(d, n))))
            for n in ("encoder_rates", "decoder_rates", "decoder_kernel_sizes", "resblock_kernel_sizes")
        }
        dil = _get(data, "resblock_dilation_sizes", [list(x) for x in d.resblock_dilation_sizes])
        if not isinstance(dil, list | tuple) or len(dil) != len(tuples["resblock_kernel_sizes"]):
            raise ConfigError(f"{what}: 'resblock_dilation_sizes' needs one list per resblock kernel size")
        dilations = tuple(int_tuple(what, f"resblock_dilation_sizes[{i}]", v) for i, v in enumerate(dil))
        if len(tuples["decoder_rates"]) != len(tuples["decoder_kernel_sizes"]):
            raise ConfigError(f"{what}: decoder_rates and decoder_kernel_sizes must have one length")
        if math.prod(tuples["decoder_rates"]) != math.prod(tuples["encoder_rates"]):
            raise ConfigError(
                f"{what}: decoder_rates must upsample by the encoder hop {math.prod(tuples['encoder_rates'])}"
            )
        if ints["decoder_dim"] % 2 ** len(tuples["decoder_rates"]):
            raise ConfigError(f"{what}: decoder_dim {ints['decoder_dim']} does not halve at every upsampling stage")
        if any(k < r for k, r in zip(tuples["decoder_kernel_sizes"], tuples["decoder_rates"], strict=True)):
            raise ConfigError(f"{what}: every decoder kernel must be at least its rate")
        c = ints["latent_channels"]
        return cls(
            **ints,
            **tuples,
            resblock_dilation_sizes=dilations,
            latents_mean=_floats(what, data, "latents_mean", c, 0.0),
            latents_std=_floats(what, data, "latents_std", c, 1.0),
        )

    @classmethod
    def from_json(cls, path: str | Path) -> AudioVaeConfig:
        return cls.from_dict(read_json_object(path, hint="point at a MiniMax-H3 audio_vae/ folder"))
