"""FLUX.2 [klein] configuration: parsed from a diffusers folder's JSON files before any building.

`Flux2TransformerConfig`, `Qwen3Config` and `Flux2VaeConfig` hold exactly the fields the DiffIR
builders need (model.py, text_encoder.py, vae.py); `Flux2PipelineInfo` reads model_index.json.
Every field is validated here so builders can trust their config.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Self, TypeVar

from attrs import frozen

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
from dif_frontend_flux2.tokenize import MAX_LENGTH

T = TypeVar("T")


def _read_json(path: str | Path) -> dict[str, Any]:
    return read_json_object(path, hint="point at a diffusers folder (model_index.json + components)")


def _load(cls: type[T], path: str | Path) -> T:
    data = _read_json(path)
    try:
        return cls.from_dict(data)  # type: ignore[attr-defined, no-any-return]
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None


# -- transformer ---------------------------------------------------------------------------------


@frozen
class Flux2TransformerConfig:
    """Flux2Transformer2DModel config (diffusers transformer/config.json)."""

    num_layers: int
    num_single_layers: int
    num_attention_heads: int
    attention_head_dim: int
    joint_attention_dim: int
    in_channels: int = 128
    out_channels: int | None = None
    patch_size: int = 1
    timestep_guidance_channels: int = 256
    mlp_ratio: float = 3.0
    axes_dims_rope: tuple[int, ...] = (32, 32, 32, 32)
    rope_theta: float = 2000.0
    eps: float = 1e-6
    guidance_embeds: bool = False

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    @property
    def mlp_hidden(self) -> int:
        return int(self.inner_dim * self.mlp_ratio)

    @property
    def out_dim(self) -> int:
        return self.out_channels or self.in_channels

    @classmethod
    def from_json(cls, path: str | Path) -> Self:
        """Parse a JSON file; errors name the file."""
        return _load(cls, path)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Flux2TransformerConfig:
        what = "Flux2 transformer config"
        check_class_name(what, data, "Flux2Transformer2DModel")
        kw = known_fields(cls, what, data)
        missing = [
            n
            for n in (
                "num_layers",
                "num_single_layers",
                "num_attention_heads",
                "attention_head_dim",
                "joint_attention_dim",
            )
            if n not in kw
        ]
        if missing:
            raise ConfigError(f"{what}: missing keys {', '.join(missing)}")
        for n in (
            "num_attention_heads",
            "attention_head_dim",
            "joint_attention_dim",
            "in_channels",
            "timestep_guidance_channels",
            "patch_size",
        ):
            if n in kw:
                kw[n] = positive_int(what, n, kw[n])
        for n in ("num_layers", "num_single_layers"):
            kw[n] = non_negative_int(what, n, kw[n])
        if kw.get("out_channels") is not None:
            kw["out_channels"] = positive_int(what, "out_channels", kw["out_channels"])
        if kw.get("patch_size", 1) != 1:
            raise ConfigError(f"{what}: patch_size {kw['patch_size']} is not supported (FLUX.2 uses 1)")
        for n in ("mlp_ratio", "rope_theta", "eps"):
            if n in kw:
                kw[n] = positive_float(what, n, kw[n])
        if "axes_dims_rope" in kw:
            kw["axes_dims_rope"] = int_tuple(what, "axes_dims_rope", kw["axes_dims_rope"])
        if "guidance_embeds" in kw:
            kw["guidance_embeds"] = flag(what, "guidance_embeds", kw["guidance_embeds"])
        cfg = cls(**kw)
        heads = {"num_attention_heads": cfg.num_attention_heads, "attention_head_dim": cfg.attention_head_dim}
        width_product(what, heads)
        width_product(what, {**heads, "mlp_ratio": math.ceil(cfg.mlp_ratio)})
        if any(d % 2 for d in cfg.axes_dims_rope) or sum(cfg.axes_dims_rope) > cfg.attention_head_dim:
            raise ConfigError(
                f"{what}: axes_dims_rope {list(cfg.axes_dims_rope)} must be even widths summing to at most "
                f"attention_head_dim={cfg.attention_head_dim}"
            )
        if cfg.timestep_guidance_channels % 2:
            raise ConfigError(f"{what}: timestep_guidance_channels must be even, got {cfg.timestep_guidance_channels}")
        if float(cfg.mlp_hidden) != cfg.inner_dim * cfg.mlp_ratio:
            raise ConfigError(f"{what}: mlp_ratio {cfg.mlp_ratio} x {cfg.inner_dim} is not an integer width")
        return cfg


# -- text encoder --------------------------------------------------------------------------------


@frozen
class Qwen3Config(BaseDecoderConfig):
    """Qwen3 decoder config (transformers text_encoder/config.json); only what the stack needs."""

    rope_theta: float = 1_000_000.0
    tie_word_embeddings: bool = False

    @classmethod
    def from_json(cls, path: str | Path) -> Self:
        """Parse a JSON file; errors name the file."""
        return _load(cls, path)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Qwen3Config:
        what = "Qwen3 text encoder config"
        model_type = data.get("model_type", "qwen3")
        if model_type != "qwen3":
            raise ConfigError(f"{what}: model_type is {model_type!r}, expected 'qwen3'")
        act = data.get("hidden_act", "silu")
        if act != "silu":
            raise ConfigError(f"{what}: hidden_act {act!r} is not supported (Qwen3 uses 'silu')")
        if data.get("use_sliding_window"):
            raise ConfigError(f"{what}: use_sliding_window=true is not supported")
        types = data.get("layer_types")
        if types is not None and (not isinstance(types, list) or any(t != "full_attention" for t in types)):
            raise ConfigError(f"{what}: 'layer_types' must list only 'full_attention' layers, got {str(types)[:200]}")
        kw = known_fields(cls, what, data, strict=False)
        kw.pop("rope_theta", None)
        kw["rope_theta"] = _qwen_rope_theta(what, data)
        if kw.get("head_dim") is None:  # older configs: hidden_size / heads
            heads = positive_int(what, "num_attention_heads", data.get("num_attention_heads"))
            kw["head_dim"] = positive_int(what, "hidden_size", data.get("hidden_size")) // heads
        required = (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_hidden_layers",
            "num_attention_heads",
            "num_key_value_heads",
        )
        missing = [n for n in required if n not in kw]
        if missing:
            raise ConfigError(f"{what}: missing keys {', '.join(missing)}")
        for n in (*required, "head_dim"):
            kw[n] = positive_int(what, n, kw[n])
        if "rms_norm_eps" in kw:
            kw["rms_norm_eps"] = positive_float(what, "rms_norm_eps", kw["rms_norm_eps"])
        for n in ("attention_bias", "tie_word_embeddings"):
            if n in kw:
                kw[n] = flag(what, n, kw[n])
        cfg = cls(**kw)
        width_product(what, {"num_attention_heads": cfg.num_attention_heads, "head_dim": cfg.head_dim})
        width_product(what, {"vocab_size": cfg.vocab_size, "hidden_size": cfg.hidden_size}, maximum=1 << 36)
        if cfg.num_attention_heads % cfg.num_key_value_heads:
            raise ConfigError(
                f"{what}: num_attention_heads {cfg.num_attention_heads} is not a multiple of "
                f"num_key_value_heads {cfg.num_key_value_heads}"
            )
        if cfg.head_dim % 2:
            raise ConfigError(f"{what}: head_dim must be even for RoPE, got {cfg.head_dim}")
        return cfg


def _qwen_rope_theta(what: str, data: Mapping[str, Any]) -> float:
    """rope_theta from the flat key (transformers 4 layout) or `rope_parameters` (transformers 5)."""
    params = data.get("rope_parameters")
    scaling = data.get("rope_scaling")
    for block in (params, scaling):
        if isinstance(block, Mapping):
            kind = block.get("rope_type", block.get("type", "default"))
            if kind != "default":
                raise ConfigError(f"{what}: rope type {kind!r} is not supported (only 'default')")
        elif block is not None:
            raise ConfigError(f"{what}: rope parameters must be an object or null, got {block!r}")
    theta = data.get("rope_theta")
    if theta is None and isinstance(params, Mapping):
        theta = params.get("rope_theta")
    return positive_float(what, "rope_theta", 1_000_000.0 if theta is None else theta)


# -- VAE -----------------------------------------------------------------------------------------

_VAE_IGNORED = frozenset({"force_upcast", "batch_norm_momentum", "scaling_factor", "shift_factor"})


@frozen
class Flux2VaeConfig:
    """AutoencoderKLFlux2 config (diffusers vae/config.json)."""

    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    decoder_block_out_channels: tuple[int, ...] | None = None
    in_channels: int = 3
    out_channels: int = 3
    latent_channels: int = 32
    layers_per_block: int = 2
    norm_num_groups: int = 32
    act_fn: str = "silu"
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_block_add_attention: bool = True
    batch_norm_eps: float = 1e-4
    patch_size: tuple[int, int] = (2, 2)
    sample_size: int = 1024  # image pixels per side of one tile of a tiled decode (diffusers' tile_sample_min_size)
    down_block_types: tuple[str, ...] = ("DownEncoderBlock2D",) * 4
    up_block_types: tuple[str, ...] = ("UpDecoderBlock2D",) * 4

    @property
    def decoder_channels(self) -> tuple[int, ...]:
        return self.decoder_block_out_channels or self.block_out_channels

    @property
    def patched_channels(self) -> int:
        return self.latent_channels * self.patch_size[0] * self.patch_size[1]

    @property
    def scale_factor(self) -> int:
        """Image pixels per latent pixel along each axis (8 for four blocks)."""
        return 2 ** (len(self.block_out_channels) - 1)

    @property
    def tile_latent(self) -> int:
        """Latent pixels per side of one tile of a tiled decode (diffusers' tile_latent_min_size)."""
        return max(1, self.sample_size // self.scale_factor)

    @classmethod
    def from_json(cls, path: str | Path) -> Self:
        """Parse a JSON file; errors name the file."""
        return _load(cls, path)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Flux2VaeConfig:
        what = "Flux2 VAE config"
        check_class_name(what, data, "AutoencoderKLFlux2")
        kw = known_fields(cls, what, data, ignored=_VAE_IGNORED)
        for n in ("block_out_channels", "decoder_block_out_channels"):
            if n in kw and (kw[n] is not None or n == "block_out_channels"):  # only the decoder's may be null
                kw[n] = int_tuple(what, n, kw[n])
        if isinstance(kw.get("sample_size"), list) and kw["sample_size"]:  # [h, w]: diffusers tiles by the first
            kw["sample_size"] = kw["sample_size"][0]
        for n in (
            "in_channels",
            "out_channels",
            "latent_channels",
            "layers_per_block",
            "norm_num_groups",
            "sample_size",
        ):
            if n in kw:
                kw[n] = positive_int(what, n, kw[n])
        if "batch_norm_eps" in kw:
            kw["batch_norm_eps"] = positive_float(what, "batch_norm_eps", kw["batch_norm_eps"])
        if "patch_size" in kw:
            ps = int_tuple(what, "patch_size", kw["patch_size"])
            if ps != (2, 2):
                raise ConfigError(f"{what}: patch_size {list(ps)} is not supported (FLUX.2 uses [2, 2])")
            kw["patch_size"] = ps
        for n in ("down_block_types", "up_block_types"):
            if n in kw:
                if not isinstance(kw[n], list) or not all(isinstance(t, str) for t in kw[n]):
                    raise ConfigError(f"{what}: '{n}' must be a list of block type names, got {str(kw[n])[:200]}")
                kw[n] = tuple(kw[n])
        for n in ("use_quant_conv", "use_post_quant_conv", "mid_block_add_attention"):
            if n in kw:
                kw[n] = flag(what, n, kw[n])
        cfg = cls(**kw)
        if cfg.act_fn != "silu":
            raise ConfigError(f"{what}: act_fn {cfg.act_fn!r} is not supported (only 'silu')")
        n_blocks = len(cfg.block_out_channels)
        if cfg.down_block_types != ("DownEncoderBlock2D",) * n_blocks:
            raise ConfigError(f"{what}: down_block_types must be {n_blocks} x DownEncoderBlock2D")
        if cfg.up_block_types != ("UpDecoderBlock2D",) * len(cfg.decoder_channels):
            raise ConfigError(f"{what}: up_block_types must be {len(cfg.decoder_channels)} x UpDecoderBlock2D")
        for ch in (*cfg.block_out_channels, *cfg.decoder_channels):
            if ch % cfg.norm_num_groups:
                raise ConfigError(
                    f"{what}: channel count {ch} is not divisible by norm_num_groups {cfg.norm_num_groups}"
                )
        return cfg


# -- pipeline ------------------------------------------------------------------------------------

_KLEIN_COMPONENTS = {
    "transformer": "Flux2Transformer2DModel",
    "text_encoder": "Qwen3ForCausalLM",
    "vae": "AutoencoderKLFlux2",
    "scheduler": "FlowMatchEulerDiscreteScheduler",
}


KLEIN_PIPELINES = ("Flux2KleinPipeline", "Flux2KleinKVPipeline")
"""model_index.json `_class_name`s of the klein folders this frontend loads."""


@frozen
class Flux2PipelineInfo:
    """model_index.json of a Flux2KleinPipeline folder, or of a Flux2KleinKVPipeline one (`kv_cache`: the
    klein KV variant, distilled, whose reference tokens' keys/values are computed once and reused).
    `max_sequence_length`: the text rows the prompt is padded to, Flux2KleinPipeline's call argument of that
    name; 512 (its default) unless the folder's model_index.json says otherwise (the embedded demo model
    says 32: its pad rows would otherwise outnumber the content tokens ~25 to 1)."""

    is_distilled: bool
    components: dict[str, tuple[str, str]]
    kv_cache: bool = False
    max_sequence_length: int = MAX_LENGTH

    @classmethod
    def from_json(cls, path: str | Path) -> Self:
        """Parse a JSON file; errors name the file."""
        return _load(cls, path)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Flux2PipelineInfo:
        what = "model_index.json"
        name = data.get("_class_name")
        if name not in KLEIN_PIPELINES:
            raise ConfigError(
                f"{what}: _class_name is {name!r}, expected 'Flux2KleinPipeline' or 'Flux2KleinKVPipeline'"
            )
        kv = name == "Flux2KleinKVPipeline"  # saved without is_distilled: the KV pipeline's default is True
        distilled = flag(what, "is_distilled", data.get("is_distilled", kv))
        text_rows = positive_int(what, "max_sequence_length", data.get("max_sequence_length", MAX_LENGTH))
        comps: dict[str, tuple[str, str]] = {}
        for key, value in data.items():
            if key.startswith("_") or key in ("is_distilled", "max_sequence_length"):
                continue
            if isinstance(value, list | tuple) and len(value) == 2 and all(isinstance(v, str | None) for v in value):
                comps[key] = (str(value[0]), str(value[1]))
        for key, expected in _KLEIN_COMPONENTS.items():
            if key not in comps:
                raise ConfigError(f"{what}: component '{key}' is missing")
            if comps[key][1] != expected:
                raise ConfigError(f"{what}: component '{key}' is {comps[key][1]!r}, expected {expected!r}")
        return cls(distilled, comps, kv, text_rows)


@frozen
class Flux2Configs:
    """All configs of one diffusers Flux2KleinPipeline folder."""

    pipeline: Flux2PipelineInfo
    transformer: Flux2TransformerConfig
    text_encoder: Qwen3Config
    vae: Flux2VaeConfig

    @property
    def pixels_per_token(self) -> int:
        """Image pixels per transformer token along each side: the VAE's scale factor x its 2x2
        latent patch x the transformer's patch size (16 for klein's 8 x 2 x 1)."""
        return self.vae.scale_factor * self.vae.patch_size[0] * self.transformer.patch_size


def load_configs(folder: str | Path) -> Flux2Configs:
    """Read model_index.json and the transformer/text_encoder/vae config.json of a diffusers folder."""
    root = Path(folder)
    return Flux2Configs(
        Flux2PipelineInfo.from_json(root / "model_index.json"),
        Flux2TransformerConfig.from_json(root / "transformer" / "config.json"),
        Qwen3Config.from_json(root / "text_encoder" / "config.json"),
        Flux2VaeConfig.from_json(root / "vae" / "config.json"),
    )
