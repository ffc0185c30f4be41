"""Krea 2 configuration: a diffusers folder's JSON files, parsed and validated before any building.

Frontend stage 0. `Krea2TransformerConfig`, `QwenVLTextConfig`, `QwenImageVaeConfig` and
`Krea2PipelineInfo` (model_index.json) hold exactly what the builders (model.py, text_encoder.py,
vae.py) and the pipeline need; the scheduler config is the kit's (`dif.kit.scheduler`);
`load_configs` reads a whole folder.
Defaults equal the diffusers / transformers class defaults, so a sparse config means the same here.
"""

from __future__ import annotations

import sys
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
from dif.kit.scheduler import FlowMatchConfig, load_scheduler_config
from dif.layers.causal_lm import BaseDecoderConfig

DEFAULT_TAPS = (2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35)


def read_json(path: str | Path) -> dict[str, Any]:
    """A JSON object from `path`; `ConfigError` naming the file otherwise."""
    return read_json_object(path, hint="point at a Krea 2 diffusers folder")


# -- transformer ---------------------------------------------------------------------------------


@frozen
class Krea2TransformerConfig:
    """Krea2Transformer2DModel (diffusers transformer/config.json)."""

    in_channels: int = 64
    num_layers: int = 28
    attention_head_dim: int = 128
    num_attention_heads: int = 48
    num_key_value_heads: int = 12
    intermediate_size: int = 16384
    timestep_embed_dim: int = 256
    text_hidden_dim: int = 2560
    num_text_layers: int = 12
    text_num_attention_heads: int = 20
    text_num_key_value_heads: int = 20
    text_intermediate_size: int = 6912
    num_layerwise_text_blocks: int = 2
    num_refiner_text_blocks: int = 2
    axes_dims_rope: tuple[int, ...] = field(default=(32, 48, 48), converter=ints)
    rope_theta: float = 1000.0
    norm_eps: float = 1e-5

    @property
    def hidden_size(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def text_head_dim(self) -> int:
        return self.text_hidden_dim // self.text_num_attention_heads

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Krea2TransformerConfig:
        what = "Krea 2 transformer config"
        check_class_name(what, data, "Krea2Transformer2DModel")
        kw = known_fields(cls, what, data)
        for name, value in kw.items():
            if name in ("rope_theta", "norm_eps"):
                kw[name] = positive_float(what, name, value)
            elif name == "axes_dims_rope":
                kw[name] = int_tuple(what, name, value)
            elif name in ("num_layerwise_text_blocks", "num_refiner_text_blocks", "num_layers"):
                kw[name] = non_negative_int(what, name, value)
            else:
                kw[name] = positive_int(what, name, value)
        cfg = cls(**kw)
        width = {"num_attention_heads": cfg.num_attention_heads, "attention_head_dim": cfg.attention_head_dim}
        width_product(what, width)
        if sum(cfg.axes_dims_rope) != cfg.attention_head_dim or any(d % 2 for d in cfg.axes_dims_rope):
            raise ConfigError(
                f"{what}: axes_dims_rope {list(cfg.axes_dims_rope)} must be even and sum to "
                f"attention_head_dim={cfg.attention_head_dim}"
            )
        for heads, kv, where in (
            (cfg.num_attention_heads, cfg.num_key_value_heads, ""),
            (cfg.text_num_attention_heads, cfg.text_num_key_value_heads, "text_"),
        ):
            if heads % kv:
                raise ConfigError(f"{what}: {where}num_attention_heads {heads} is not a multiple of kv heads {kv}")
        if cfg.text_hidden_dim % cfg.text_num_attention_heads:
            raise ConfigError(
                f"{what}: text_hidden_dim {cfg.text_hidden_dim} does not split into "
                f"{cfg.text_num_attention_heads} heads"
            )
        if cfg.timestep_embed_dim % 2:
            raise ConfigError(f"{what}: timestep_embed_dim must be even, got {cfg.timestep_embed_dim}")
        return cfg


# -- text encoder --------------------------------------------------------------------------------


@frozen
class QwenVLTextConfig(BaseDecoderConfig):
    """The text stack of a Qwen3-VL model (transformers text_encoder/config.json, `text_config`)."""

    rope_theta: float = 5_000_000.0

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QwenVLTextConfig:
        """Accepts the full Qwen3VLConfig (`model_type` qwen3_vl, reads `text_config`) or the text
        config alone (`qwen3_vl_text`)."""
        what = "Qwen3-VL text encoder config"
        model_type = data.get("model_type")
        if model_type == "qwen3_vl":
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
                     "num_key_value_heads"):
            if name not in data:
                raise ConfigError(f"{what}: missing key '{name}'")
            kw[name] = positive_int(what, name, data[name])
        head_dim = data.get("head_dim") or kw["hidden_size"] // kw["num_attention_heads"]
        kw["head_dim"] = positive_int(what, "head_dim", head_dim)
        if "rms_norm_eps" in data:
            kw["rms_norm_eps"] = positive_float(what, "rms_norm_eps", data["rms_norm_eps"])
        kw["attention_bias"] = flag(what, "attention_bias", data.get("attention_bias", False))
        kw["rope_theta"] = _rope_theta(what, data)
        cfg = cls(**kw)
        width_product(what, {"num_attention_heads": cfg.num_attention_heads, "head_dim": cfg.head_dim})
        width_product(what, {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size}, maximum=1 << 36)
        if cfg.num_attention_heads % cfg.num_key_value_heads or cfg.head_dim % 2:
            raise ConfigError(
                f"{what}: need heads ({cfg.num_attention_heads}) a multiple of kv heads "
                f"({cfg.num_key_value_heads}) and an even head_dim ({cfg.head_dim})"
            )
        return cfg


def _rope_theta(what: str, data: Mapping[str, Any]) -> float:
    """rope_theta of a default (unscaled) rotary embedding; the mRoPE sections do not matter for
    text, whose three position axes are equal, so interleaved mRoPE is plain RoPE here."""
    params = data.get("rope_parameters") or data.get("rope_scaling") or {}
    if not isinstance(params, Mapping):
        raise ConfigError(f"{what}: rope parameters must be an object, got {params!r}")
    kind = params.get("rope_type", params.get("type", "default"))
    if kind != "default":
        raise ConfigError(f"{what}: rope type {kind!r} is not supported (only 'default')")
    theta = data.get("rope_theta", params.get("rope_theta", 5_000_000.0))
    return positive_float(what, "rope_theta", theta)


# -- VAE -----------------------------------------------------------------------------------------


@frozen
class QwenImageVaeConfig:
    """AutoencoderKLQwenImage (diffusers vae/config.json). Only the decoder is built."""

    base_dim: int = 96
    z_dim: int = 16
    dim_mult: tuple[int, ...] = field(default=(1, 2, 4, 4), converter=ints)
    num_res_blocks: int = 2
    attn_scales: tuple[float, ...] = field(default=(), converter=tuple)
    temperal_downsample: tuple[bool, ...] = field(default=(False, True, True), converter=tuple)
    dropout: float = 0.0
    input_channels: int = 3
    latents_mean: tuple[float, ...] = field(default=(0.0,) * 16, converter=tuple)
    latents_std: tuple[float, ...] = field(default=(1.0,) * 16, converter=tuple)

    @property
    def scale_factor(self) -> int:
        """Pixels per latent pixel along each side (8 for three resampling stages)."""
        return 2 ** len(self.temperal_downsample)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> QwenImageVaeConfig:
        what = "Qwen-Image VAE config"
        check_class_name(what, data, "AutoencoderKLQwenImage")
        # sample_size is a default image size, not architecture
        kw = known_fields(cls, what, data, ignored=frozenset({"sample_size"}))
        for name in ("base_dim", "z_dim", "num_res_blocks", "input_channels"):
            if name in kw:
                kw[name] = positive_int(what, name, kw[name])
        if "dim_mult" in kw:
            kw["dim_mult"] = int_tuple(what, "dim_mult", kw["dim_mult"])
        for name in ("temperal_downsample", "attn_scales", "latents_mean", "latents_std"):
            if name in kw and not isinstance(kw[name], list):
                raise ConfigError(f"{what}: '{name}' must be a list, got {str(kw[name])[:200]}")
        for name in ("attn_scales", "latents_mean", "latents_std"):
            for i, v in enumerate(kw.get(name, ())):
                number = isinstance(v, int | float) and not isinstance(v, bool)
                # a comparison, not math.isfinite: it refuses NaN and integers past float range without raising
                if not number or not -sys.float_info.max <= v <= sys.float_info.max:
                    raise ConfigError(f"{what}: '{name}[{i}]' must be a finite number, got {str(v)[:200]}")
        if "temperal_downsample" in kw:
            kw["temperal_downsample"] = tuple(
                flag(what, f"temperal_downsample[{i}]", v) for i, v in enumerate(kw["temperal_downsample"])
            )
        if "latents_mean" not in kw or "latents_std" not in kw:
            raise ConfigError(f"{what}: 'latents_mean' and 'latents_std' are required (the pipeline denormalizes)")
        cfg = cls(**kw)
        if len(cfg.temperal_downsample) != len(cfg.dim_mult) - 1:
            raise ConfigError(f"{what}: temperal_downsample needs {len(cfg.dim_mult) - 1} entries")
        if not (len(cfg.latents_mean) == len(cfg.latents_std) == cfg.z_dim):
            raise ConfigError(f"{what}: latents_mean/latents_std must have z_dim={cfg.z_dim} entries")
        if any(float(s) == 0.0 for s in cfg.latents_std):
            raise ConfigError(f"{what}: latents_std has a zero entry")
        return cfg


# -- pipeline ------------------------------------------------------------------------------------

COMPONENTS = {
    "transformer": "Krea2Transformer2DModel",
    "text_encoder": "Qwen3VLModel",
    "vae": "AutoencoderKLQwenImage",
    "scheduler": "FlowMatchEulerDiscreteScheduler",
}
TURBO_MU = 1.15


@frozen
class Krea2PipelineInfo:
    """model_index.json of a Krea2Pipeline folder."""

    is_distilled: bool = False
    patch_size: int = 2
    text_encoder_select_layers: tuple[int, ...] = field(default=DEFAULT_TAPS, converter=ints)

    @property
    def variant(self) -> str:
        return "turbo" if self.is_distilled else "raw"

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Krea2PipelineInfo:
        what = "model_index.json"
        if data.get("_class_name") != "Krea2Pipeline":
            raise ConfigError(f"{what}: _class_name is {data.get('_class_name')!r}, expected 'Krea2Pipeline'")
        for key, expected in COMPONENTS.items():
            entry = data.get(key)
            if not (isinstance(entry, list | tuple) and len(entry) == 2):
                raise ConfigError(f"{what}: component '{key}' is missing")
            if entry[1] != expected:
                raise ConfigError(f"{what}: component '{key}' is {entry[1]!r}, expected {expected!r}")
        distilled = flag(what, "is_distilled", data.get("is_distilled", False))
        patch = positive_int(what, "patch_size", data.get("patch_size", 2))
        if patch != 2:
            raise ConfigError(f"{what}: patch_size {patch} is not supported (Krea 2 packs 2x2 patches)")
        taps = data.get("text_encoder_select_layers")
        if taps is None:
            taps = DEFAULT_TAPS
        return cls(distilled, patch, int_tuple(what, "text_encoder_select_layers", taps, allow_zero=True))


@frozen
class Krea2Configs:
    """All configs of one Krea 2 diffusers folder."""

    pipeline: Krea2PipelineInfo
    transformer: Krea2TransformerConfig
    text_encoder: QwenVLTextConfig
    vae: QwenImageVaeConfig
    scheduler: FlowMatchConfig

    @property
    def pixels_per_token(self) -> int:
        """Image pixels per transformer token along each side: the VAE's scale factor x the
        pipeline's latent patch size (16 for Krea 2's 8 x 2)."""
        return self.vae.scale_factor * self.pipeline.patch_size

    def check(self) -> Krea2Configs:
        """Cross-component rules: tap count and width must match the text fusion's input."""
        taps = self.pipeline.text_encoder_select_layers
        if len(taps) != self.transformer.num_text_layers:
            raise ConfigError(
                f"model_index.json selects {len(taps)} text-encoder layers but the transformer fuses "
                f"num_text_layers={self.transformer.num_text_layers}"
            )
        if max(taps) > self.text_encoder.num_hidden_layers:
            raise ConfigError(
                f"text_encoder_select_layers reaches {max(taps)} but the text encoder has "
                f"{self.text_encoder.num_hidden_layers} layers"
            )
        if self.text_encoder.hidden_size != self.transformer.text_hidden_dim:
            raise ConfigError(
                f"text encoder width {self.text_encoder.hidden_size} != transformer text_hidden_dim "
                f"{self.transformer.text_hidden_dim}"
            )
        if self.vae.z_dim * self.pipeline.patch_size**2 != self.transformer.in_channels:
            raise ConfigError(
                f"VAE z_dim {self.vae.z_dim} x patch {self.pipeline.patch_size}^2 != transformer in_channels "
                f"{self.transformer.in_channels}"
            )
        return self


def _component(root: Path, name: str, file: str, parse: Any) -> Any:
    path = root / name / file
    try:
        return parse(read_json(path))
    except ConfigError as exc:
        if str(path) in str(exc):
            raise
        raise ConfigError(f"{path}: {exc}") from None


def load_configs(folder: str | Path) -> Krea2Configs:
    """Read model_index.json and every component config of a Krea 2 diffusers folder."""
    root = Path(folder)
    try:
        info = Krea2PipelineInfo.from_dict(read_json(root / "model_index.json"))
    except ConfigError as exc:
        if "model_index.json:" in str(exc) and str(root) not in str(exc):
            raise ConfigError(f"{root}/{exc}") from None
        raise
    return Krea2Configs(
        info,
        _component(root, "transformer", "config.json", Krea2TransformerConfig.from_dict),
        _component(root, "text_encoder", "config.json", QwenVLTextConfig.from_dict),
        _component(root, "vae", "config.json", QwenImageVaeConfig.from_dict),
        load_scheduler_config(root),
    ).check()


def is_krea2_folder(path: Path) -> bool:
    """Cheap detection: a folder whose model_index.json names Krea2Pipeline."""
    index = Path(path) / "model_index.json"
    if not index.is_file():
        return False
    try:
        return read_json(index).get("_class_name") == "Krea2Pipeline"
    except ConfigError:
        return False
