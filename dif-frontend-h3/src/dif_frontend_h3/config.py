"""MiniMax-H3 configuration: a diffusers (modular) folder's JSON files, parsed and validated before building.

Frontend stage 0. `H3TransformerConfig` (MiniMaxH3Transformer3DModel), `H3TextConfig` (the Qwen3-VL text
stack), `H3SchedulerConfig` (MiniMaxH3Scheduler, one per stream), `VideoVaeGeometry` / `AudioVaeGeometry`
(the few numbers of the two VAE configs the packing needs; the VAE builders parse the rest) and
`load_configs` for a whole folder. Defaults equal the diffusers / transformers class defaults.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from dif._convert import ints
from dif.checkpoint import read_json_object
from dif.config_fields import (
    check_class_name,
    flag,
    int_tuple,
    known_fields,
    non_negative_int,
    positive_float,
    positive_int,
    width_product,
)
from dif.errors import ConfigError
from dif.layers.causal_lm import BaseDecoderConfig

PIPELINE_CLASS = "MiniMaxH3ModularPipeline"
TEXT_ENCODER_LAYER = 50  # the reference reads hidden_states[50] (modular_pipeline.py `text_encoder_layer`)
FPS = 24
AUDIO_CHANNELS = 2  # stereo, packed channel-major
TAGS = {"video": 0, "text": 1, "audio": 2}  # per-row modality tags (transformer: `ts_idx * 3 + tag`)


def read_json(path: str | Path) -> dict[str, Any]:
    """A JSON object from `path`; `ConfigError` naming the file otherwise."""
    return read_json_object(path, hint="point at a MiniMax-H3 diffusers folder")


# -- transformer ---------------------------------------------------------------------------------


@frozen
class H3TransformerConfig:
    """MiniMaxH3Transformer3DModel (diffusers transformer/config.json)."""

    num_attention_heads: int = 56
    attention_head_dim: int = 128
    hidden_size: int = 5376
    num_layers: int = 50
    num_refiner_layers: int = 2
    ffn_dim: int = 14336
    in_channels: int = 24
    audio_in_channels: int = 32
    patch_size: tuple[int, ...] = field(default=(1, 2, 2), converter=ints)
    text_dim: int = 5120
    freq_dim: int = 256
    time_embed_hidden_dim: int = 5376
    time_embed_dim: int = 2688
    rope_freq_dim: int = 16
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    qk_norm_eps: float = 1e-5
    final_norm_eps: float = 1e-5

    @property
    def inner_dim(self) -> int:
        """Attention width heads x head_dim (7168 at full size: wider than the residual stream)."""
        return self.num_attention_heads * self.attention_head_dim

    @property
    def video_patch_dim(self) -> int:
        """Features of one video row: in_channels x prod(patch_size), ordered (c, pt, ph, pw)."""
        return self.in_channels * math.prod(self.patch_size)

    @property
    def rotary_dim(self) -> int:
        """Rotated channels of every head: 2 x 3 axes x rope_freq_dim (96 of 128 at full size)."""
        return 6 * self.rope_freq_dim

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> H3TransformerConfig:
        what = "MiniMax-H3 transformer config"
        check_class_name(what, data, "MiniMaxH3Transformer3DModel")
        kw = known_fields(cls, what, data)
        for name, value in kw.items():
            if name in ("rope_theta", "norm_eps", "qk_norm_eps", "final_norm_eps"):
                kw[name] = positive_float(what, name, value)
            elif name == "patch_size":
                kw[name] = int_tuple(what, name, value)
            elif name in ("num_layers", "num_refiner_layers"):
                kw[name] = non_negative_int(what, name, value)
            else:
                kw[name] = positive_int(what, name, value)
        cfg = cls(**kw)
        width_product(
            what, {"num_attention_heads": cfg.num_attention_heads, "attention_head_dim": cfg.attention_head_dim}
        )
        if len(cfg.patch_size) != 3:
            raise ConfigError(f"{what}: patch_size must be (t, h, w), got {list(cfg.patch_size)}")
        if cfg.patch_size[0] != 1:
            raise ConfigError(f"{what}: temporal patch {cfg.patch_size[0]} is not supported (MiniMax-H3 uses 1)")
        if cfg.rotary_dim > cfg.attention_head_dim:
            raise ConfigError(
                f"{what}: 6 x rope_freq_dim = {cfg.rotary_dim} rotated channels exceed attention_head_dim "
                f"{cfg.attention_head_dim}"
            )
        if cfg.freq_dim % 2:
            raise ConfigError(f"{what}: freq_dim must be even, got {cfg.freq_dim}")
        return cfg


# -- text encoder --------------------------------------------------------------------------------


@frozen
class H3TextConfig(BaseDecoderConfig):
    """The text stack of the Qwen3-VL conditioner (transformers text_encoder/config.json, `text_config`)."""

    rope_theta: float = 5_000_000.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> H3TextConfig:
        """The full Qwen3VLConfig (`model_type` qwen3_vl, reads `text_config`) or the text config alone."""
        what = "Qwen3-VL text encoder config"
        if data.get("model_type") == "qwen3_vl":
            text = data.get("text_config")
            if not isinstance(text, Mapping):
                raise ConfigError(f"{what}: 'text_config' is missing")
            data = text
        model_type = data.get("model_type", "qwen3_vl_text")
        if model_type != "qwen3_vl_text":
            raise ConfigError(f"{what}: model_type is {model_type!r}, expected 'qwen3_vl' or 'qwen3_vl_text'")
        if data.get("hidden_act", "silu") != "silu":
            raise ConfigError(f"{what}: hidden_act {data.get('hidden_act')!r} is not supported (only 'silu')")
        kw: dict[str, Any] = {}
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads"):  # fmt: skip
            if name not in data:
                raise ConfigError(f"{what}: missing key '{name}'")
            kw[name] = positive_int(what, name, data[name])
        kw["head_dim"] = positive_int(
            what, "head_dim", data.get("head_dim") or kw["hidden_size"] // kw["num_attention_heads"]
        )
        if "rms_norm_eps" in data:
            kw["rms_norm_eps"] = positive_float(what, "rms_norm_eps", data["rms_norm_eps"])
        kw["attention_bias"] = flag(what, "attention_bias", data.get("attention_bias", False))
        params = data.get("rope_parameters") or data.get("rope_scaling") or {}
        if not isinstance(params, Mapping) or params.get("rope_type", params.get("type", "default")) != "default":
            raise ConfigError(f"{what}: rope parameters {params!r} are not supported (only rope_type 'default')")
        # text-only input: the three mRoPE axes carry the same position, so interleaved mRoPE is plain RoPE
        kw["rope_theta"] = positive_float(what, "rope_theta", data.get("rope_theta", params.get("rope_theta", 5e6)))
        cfg = cls(**kw)
        if cfg.num_attention_heads % cfg.num_key_value_heads or cfg.head_dim % 2:
            raise ConfigError(
                f"{what}: need heads ({cfg.num_attention_heads}) a multiple of kv heads "
                f"({cfg.num_key_value_heads}) and an even head_dim ({cfg.head_dim})"
            )
        return cfg


# -- schedulers and VAE geometry -----------------------------------------------------------------


@frozen
class H3SchedulerConfig:
    """MiniMaxH3Scheduler (scheduler/ and audio_scheduler/scheduler_config.json): only the shift."""

    shift: float = 1.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> H3SchedulerConfig:
        what = "MiniMax-H3 scheduler config"
        check_class_name(what, data, "MiniMaxH3Scheduler")
        kw = known_fields(cls, what, data)
        return cls(positive_float(what, "shift", kw.get("shift", 1.0)))


@frozen
class VideoVaeGeometry:
    """What the packing needs of AutoencoderKLMiniMaxH3's config: latent channels, 16x spatial and 4x
    temporal compression, 17-frame clips of which 3 latent tokens are dropped, latent mean / std."""

    latent_channels: int
    spatial_ratio: int
    temporal_ratio: int
    clip_length: int
    latents_mean: tuple[float, ...]
    latents_std: tuple[float, ...]

    @property
    def latents_per_clip(self) -> int:
        """Latent frames one clip keeps (5 for 17 frames at 4x): the `17n + 5` rule's 5."""
        return (self.clip_length - 1) // self.temporal_ratio + 1

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> VideoVaeGeometry:
        what = "MiniMax-H3 video VAE config"
        check_class_name(what, data, "AutoencoderKLMiniMaxH3")
        spatial = int_tuple(
            what, "spatial_downsample_factors", data.get("spatial_downsample_factors", [2, 2, 2, 2, 1, 1])
        )
        temporal = int_tuple(
            what, "temporal_downsample_factors", data.get("temporal_downsample_factors", [1, 2, 2, 1, 1, 1])
        )
        channels = positive_int(what, "latent_channels", data.get("latent_channels", 24))
        mean, std = _floats(what, data, "latents_mean", channels), _floats(what, data, "latents_std", channels)
        return cls(channels, math.prod(spatial), math.prod(temporal),
                   positive_int(what, "clip_length", data.get("clip_length", 17)), mean, std)  # fmt: skip


@frozen
class AudioVaeGeometry:
    """What the packing needs of AutoencoderKLMiniMaxH3Audio's config: latent channels, sampling rate and
    the decoder's hop (samples per latent: 800 = 40 latents/s at 32 kHz)."""

    latent_channels: int
    sampling_rate: int
    hop: int

    @property
    def latents_per_second(self) -> float:
        return self.sampling_rate / self.hop

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AudioVaeGeometry:
        what = "MiniMax-H3 audio VAE config"
        check_class_name(what, data, "AutoencoderKLMiniMaxH3Audio")
        rates = int_tuple(what, "decoder_rates", data.get("decoder_rates", [5, 5, 2, 2, 2, 2, 2]))
        return cls(positive_int(what, "latent_channels", data.get("latent_channels", 32)),
                   positive_int(what, "sampling_rate", data.get("sampling_rate", 32000)), math.prod(rates))  # fmt: skip


def _floats(what: str, data: Mapping[str, Any], name: str, n: int) -> tuple[float, ...]:
    values = data.get(name)
    if (
        not isinstance(values, list)
        or len(values) != n
        or not all(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) for v in values)
    ):
        raise ConfigError(f"{what}: '{name}' must be a list of {n} finite numbers")
    return tuple(float(v) for v in values)


# -- the folder ----------------------------------------------------------------------------------

COMPONENTS = {
    "transformer": "MiniMaxH3Transformer3DModel",
    "text_encoder": "Qwen3VLForConditionalGeneration",
    "vae": "AutoencoderKLMiniMaxH3",
    "audio_vae": "AutoencoderKLMiniMaxH3Audio",
    "scheduler": "MiniMaxH3Scheduler",
    "audio_scheduler": "MiniMaxH3Scheduler",
}


@frozen
class H3Configs:
    """All configs of one MiniMax-H3 folder. `vae_config` / `audio_vae_config` are the raw dicts (the VAE
    builders parse them); None when that component folder is absent (decoding is then refused)."""

    transformer: H3TransformerConfig
    text_encoder: H3TextConfig
    scheduler: H3SchedulerConfig
    audio_scheduler: H3SchedulerConfig
    video_vae: VideoVaeGeometry
    audio_vae: AudioVaeGeometry
    text_encoder_layer: int = TEXT_ENCODER_LAYER
    vae_config: dict[str, Any] | None = None
    audio_vae_config: dict[str, Any] | None = None

    @property
    def canvas_multiple(self) -> int:
        """Pixel sizes must be multiples of this: VAE spatial ratio x patch (32 for MiniMax-H3)."""
        return self.video_vae.spatial_ratio * self.transformer.patch_size[2]

    def check(self) -> H3Configs:
        t, q = self.transformer, self.text_encoder
        if q.hidden_size != t.text_dim:
            raise ConfigError(f"text encoder width {q.hidden_size} != transformer text_dim {t.text_dim}")
        if not 0 < self.text_encoder_layer < q.num_hidden_layers:
            raise ConfigError(
                f"MiniMax-H3 reads hidden_states[{self.text_encoder_layer}] of the text encoder, which needs more "
                f"than {self.text_encoder_layer} layers; this one has {q.num_hidden_layers}"
            )
        if self.video_vae.latent_channels != t.in_channels:
            raise ConfigError(
                f"video VAE latent_channels {self.video_vae.latent_channels} != transformer in_channels {t.in_channels}"
            )
        if self.audio_vae.latent_channels != t.audio_in_channels:
            raise ConfigError(
                f"audio VAE latent_channels {self.audio_vae.latent_channels} != transformer audio_in_channels "
                f"{t.audio_in_channels}"
            )
        if t.patch_size[1] != t.patch_size[2]:
            raise ConfigError(f"transformer patch {list(t.patch_size)}: square spatial patches only")
        return self


def _component(root: Path, name: str, file: str) -> dict[str, Any] | None:
    path = root / name / file
    return read_json(path) if path.is_file() else None


def _parse(root: Path, name: str, file: str, parse: Any, *, default: Any = None) -> Any:
    data = _component(root, name, file)
    if data is None:
        if default is not None:
            return default
        raise ConfigError(f"{root / name / file}: missing (a MiniMax-H3 folder needs it)")
    try:
        return parse(data)
    except ConfigError as exc:
        raise ConfigError(f"{root / name / file}: {exc}") from None


def load_configs(folder: str | Path) -> H3Configs:
    """Read model_index.json and every component config of a MiniMax-H3 folder. A missing vae/ or
    audio_vae/ folder leaves its raw config None (the published geometry is then assumed for packing,
    and decoding that stream is refused)."""
    root = Path(folder)
    index = read_json(root / "model_index.json")
    if index.get("_class_name") != PIPELINE_CLASS:
        raise ConfigError(
            f"{root}/model_index.json: _class_name is {index.get('_class_name')!r}, expected {PIPELINE_CLASS!r}"
        )
    for key, expected in COMPONENTS.items():  # the modular index lists [library, class, spec]
        entry = index.get(key)
        if isinstance(entry, list) and len(entry) >= 2 and entry[1] not in (expected, None):
            raise ConfigError(f"{root}/model_index.json: component '{key}' is {entry[1]!r}, expected {expected!r}")
    layer = index.get("text_encoder_layer", TEXT_ENCODER_LAYER)  # a dif key: tiny checkpoints tap earlier
    layer = positive_int("model_index.json", "text_encoder_layer", layer)
    vae_raw, audio_raw = _component(root, "vae", "config.json"), _component(root, "audio_vae", "config.json")
    return H3Configs(
        _parse(root, "transformer", "config.json", H3TransformerConfig.from_dict),
        _parse(root, "text_encoder", "config.json", H3TextConfig.from_dict),
        _parse(root, "scheduler", "scheduler_config.json", H3SchedulerConfig.from_dict),
        _parse(root, "audio_scheduler", "scheduler_config.json", H3SchedulerConfig.from_dict),
        _parse(
            root,
            "vae",
            "config.json",
            VideoVaeGeometry.from_dict,
            default=VideoVaeGeometry(24, 16, 4, 17, (0.0,) * 24, (1.0,) * 24),
        ),
        _parse(root, "audio_vae", "config.json", AudioVaeGeometry.from_dict, default=AudioVaeGeometry(32, 32000, 800)),
        layer,
        vae_raw,
        audio_raw,
    ).check()


def is_h3_folder(path: Path) -> bool:
    """Cheap detection: a folder whose model_index.json names the MiniMax-H3 modular pipeline."""
    index = Path(path) / "model_index.json"
    if not index.is_file():
        return False
    try:
        return read_json(index).get("_class_name") == PIPELINE_CLASS
    except ConfigError:
        return False
