"""SD-Turbo checkpoint configs: each component's config.json parsed and checked before any builder runs.

Frontend stage 1. A diffusers folder (model_index.json naming StableDiffusionPipeline) holds
text_encoder/config.json (CLIPTextModel), unet/config.json (UNet2DConditionModel), vae/config.json
(AutoencoderKL) and scheduler/scheduler_config.json; TAESD (AutoencoderTiny) has its own config.json.
Options that change the architecture and that dif does not build (SDXL's added embeddings, class
embeddings, v-prediction, ...) are refused here, by name. `kind` is "turbo" (1 step, no CFG) or
"base" (an SD 1.x / 2.x epsilon checkpoint: 25 Euler steps, CFG 7.5).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import frozen

from dif.checkpoint import read_json_object
from dif.config_fields import int_tuple, positive_float, positive_int
from dif.errors import ConfigError

PIPELINE_CLASSES = ("StableDiffusionPipeline",)
REFUSED_PIPELINES = {
    "StableDiffusionXLPipeline": "SDXL (two text encoders, added time embeddings) is not built by dif sdturbo",
    "StableDiffusion3Pipeline": "SD3 is a transformer model, not built by dif sdturbo",
    "StableDiffusionUpscalePipeline": "the x4 upscaler (7-channel UNet, noise level class labels) is not built",
    "StableDiffusionInpaintPipeline": "inpainting UNets (9 input channels) are not built by dif sdturbo",
}


def _get(data: Mapping[str, Any], key: str, default: Any) -> Any:
    value = data.get(key, default)
    return default if value is None else value


def _refuse(what: str, data: Mapping[str, Any], key: str, allowed: tuple[Any, ...], why: str) -> None:
    value = data.get(key)
    if value not in allowed:
        raise ConfigError(f"{what}: {key}={value!r} is not supported ({why})")


def _per_block(what: str, name: str, value: Any, blocks: int) -> tuple[int, ...]:
    """An int repeated per block, or a list with one entry per block."""
    if isinstance(value, int) and not isinstance(value, bool):
        return (positive_int(what, name, value),) * blocks
    out = int_tuple(what, name, value)
    if len(out) != blocks:
        raise ConfigError(f"{what}: '{name}' has {len(out)} entries for {blocks} blocks")
    return out


@frozen
class ClipTextConfig:
    """CLIPTextModel (transformers): pre-LN causal encoder; `hidden_act` gelu (OpenCLIP, SD 2.x) or
    quick_gelu (SD 1.x)."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    max_position_embeddings: int
    layer_norm_eps: float
    hidden_act: str

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_attention_heads

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], what: str = "text_encoder/config.json") -> ClipTextConfig:
        arch = data.get("architectures") or ["CLIPTextModel"]
        if arch[0] not in ("CLIPTextModel", "CLIPTextModelWithProjection"):
            raise ConfigError(f"{what}: architecture {arch[0]!r} is not a CLIP text model")
        act = _get(data, "hidden_act", "quick_gelu")
        if act not in ("gelu", "quick_gelu"):
            raise ConfigError(f"{what}: hidden_act={act!r} is not supported (gelu or quick_gelu)")
        cfg = cls(
            vocab_size=positive_int(what, "vocab_size", _get(data, "vocab_size", 49408)),
            hidden_size=positive_int(what, "hidden_size", _get(data, "hidden_size", 512)),
            intermediate_size=positive_int(what, "intermediate_size", _get(data, "intermediate_size", 2048)),
            num_hidden_layers=positive_int(what, "num_hidden_layers", _get(data, "num_hidden_layers", 12)),
            num_attention_heads=positive_int(what, "num_attention_heads", _get(data, "num_attention_heads", 8)),
            max_position_embeddings=positive_int(
                what, "max_position_embeddings", _get(data, "max_position_embeddings", 77)
            ),
            layer_norm_eps=positive_float(what, "layer_norm_eps", _get(data, "layer_norm_eps", 1e-5)),
            hidden_act=act,
        )
        if cfg.hidden_size % cfg.num_attention_heads:
            raise ConfigError(
                f"{what}: hidden_size {cfg.hidden_size} does not split into {cfg.num_attention_heads} heads"
            )
        return cfg


DOWN_TYPES = ("CrossAttnDownBlock2D", "DownBlock2D")
UP_TYPES = ("CrossAttnUpBlock2D", "UpBlock2D")


@frozen
class UNetConfig:
    """UNet2DConditionModel as SD 1.x / 2.x and SD-Turbo configure it. `heads[i]` is the head count of
    block i (diffusers reads `attention_head_dim` as the head count when `num_attention_heads` is
    unset: pitfall 29); `cross[i]` whether down block i has attention (up blocks mirror it)."""

    in_channels: int
    out_channels: int
    block_out_channels: tuple[int, ...]
    down_cross: tuple[bool, ...]
    up_cross: tuple[bool, ...]
    layers_per_block: int
    heads: tuple[int, ...]
    transformer_layers: tuple[int, ...]
    cross_attention_dim: int
    norm_num_groups: int
    norm_eps: float
    use_linear_projection: bool
    flip_sin_to_cos: bool
    freq_shift: float
    sample_size: int

    @property
    def time_embed_dim(self) -> int:
        return self.block_out_channels[0] * 4

    @property
    def downsample_factor(self) -> int:
        """Latent pixels per UNet bottleneck pixel: 2 per downsampling block."""
        return 2 ** (len(self.block_out_channels) - 1)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], what: str = "unet/config.json") -> UNetConfig:
        name = data.get("_class_name", "UNet2DConditionModel")
        if name != "UNet2DConditionModel":
            raise ConfigError(f"{what}: _class_name is {name!r}, expected 'UNet2DConditionModel'")
        if data.get("addition_embed_type") is not None:
            raise ConfigError(
                f"{what}: addition_embed_type={data['addition_embed_type']!r}: an SDXL-style UNet (added text/time "
                "embeddings) is not supported by dif sdturbo; SD-Turbo and SD 1.x / 2.x are"
            )
        for key, why in (
            ("class_embed_type", "class-conditioned UNets"),
            ("num_class_embeds", "class-conditioned UNets"),
            ("time_cond_proj_dim", "LCM guidance embeddings"),
            ("encoder_hid_dim", "projected encoder states"),
            ("time_embedding_dim", "a custom time embedding width"),
            ("timestep_post_act", "a post-activation on the time embedding"),
            ("time_embedding_act_fn", "an activation on the time embedding"),
            ("mid_block_only_cross_attention", "cross-attention-only mid blocks"),
            ("reverse_transformer_layers_per_block", "asymmetric transformer depths"),
            ("cross_attention_norm", "normed cross-attention inputs"),
        ):
            if data.get(key) is not None:
                raise ConfigError(f"{what}: {key}={data[key]!r} is not supported ({why})")
        _refuse(what, {"k": _get(data, "act_fn", "silu")}, "k", ("silu",), "act_fn must be silu")
        for key, default, allowed in (
            ("dual_cross_attention", False, (False,)),
            ("only_cross_attention", False, (False,)),
            ("center_input_sample", False, (False,)),
            ("resnet_time_scale_shift", "default", ("default",)),
            ("resnet_skip_time_act", False, (False,)),
            ("time_embedding_type", "positional", ("positional",)),
            ("attention_type", "default", ("default",)),
            ("mid_block_type", "UNetMidBlock2DCrossAttn", ("UNetMidBlock2DCrossAttn",)),
            ("conv_in_kernel", 3, (3,)),
            ("conv_out_kernel", 3, (3,)),
            ("downsample_padding", 1, (1,)),
            ("mid_block_scale_factor", 1, (1, 1.0)),
            ("resnet_out_scale_factor", 1.0, (1, 1.0)),
            ("addition_time_embed_dim", None, (None,)),
        ):
            _refuse(what, {key: _get(data, key, default)}, key, allowed, "SD 1.x / 2.x UNets use the default")
        chans = int_tuple(what, "block_out_channels", _get(data, "block_out_channels", [320, 640, 1280, 1280]))
        n = len(chans)
        down = tuple(_get(data, "down_block_types", ["CrossAttnDownBlock2D"] * 3 + ["DownBlock2D"]))
        up = tuple(_get(data, "up_block_types", ["UpBlock2D"] + ["CrossAttnUpBlock2D"] * 3))
        for key, types, known in (("down_block_types", down, DOWN_TYPES), ("up_block_types", up, UP_TYPES)):
            bad = [t for t in types if t not in known]
            if bad or len(types) != n:
                raise ConfigError(f"{what}: {key} {list(types)} must be {n} of {', '.join(known)}")
        heads_key = "num_attention_heads" if data.get("num_attention_heads") is not None else "attention_head_dim"
        heads = _per_block(what, heads_key, _get(data, heads_key, 8), n)
        cross_dim = _get(data, "cross_attention_dim", 1280)
        if not isinstance(cross_dim, int):
            raise ConfigError(f"{what}: cross_attention_dim={cross_dim!r}: one width for all blocks is supported")
        for c, h in zip(chans, heads, strict=True):
            if c % h:
                raise ConfigError(f"{what}: {c} channels do not split into {h} heads ({heads_key})")
        groups = positive_int(what, "norm_num_groups", _get(data, "norm_num_groups", 32))
        if any(c % groups for c in chans):
            raise ConfigError(f"{what}: block_out_channels {list(chans)} do not split into {groups} groups")
        return cls(
            in_channels=positive_int(what, "in_channels", _get(data, "in_channels", 4)),
            out_channels=positive_int(what, "out_channels", _get(data, "out_channels", 4)),
            block_out_channels=chans,
            down_cross=tuple(t == "CrossAttnDownBlock2D" for t in down),
            up_cross=tuple(t == "CrossAttnUpBlock2D" for t in up),
            layers_per_block=positive_int(what, "layers_per_block", _get(data, "layers_per_block", 2)),
            heads=heads,
            transformer_layers=_per_block(
                what, "transformer_layers_per_block", _get(data, "transformer_layers_per_block", 1), n
            ),
            cross_attention_dim=positive_int(what, "cross_attention_dim", cross_dim),
            norm_num_groups=groups,
            norm_eps=positive_float(what, "norm_eps", _get(data, "norm_eps", 1e-5)),
            use_linear_projection=bool(_get(data, "use_linear_projection", False)),
            flip_sin_to_cos=bool(_get(data, "flip_sin_to_cos", True)),
            freq_shift=float(_get(data, "freq_shift", 0)),
            sample_size=positive_int(what, "sample_size", _get(data, "sample_size", 64)),
        )


@frozen
class VaeConfig:
    """AutoencoderKL (decoder half). `scaling_factor` divides the sampled latents before decoding."""

    latent_channels: int
    out_channels: int
    block_out_channels: tuple[int, ...]
    layers_per_block: int
    norm_num_groups: int
    scaling_factor: float
    shift_factor: float
    force_upcast: bool
    use_post_quant_conv: bool
    mid_block_add_attention: bool
    sample_size: int

    @property
    def scale_factor(self) -> int:
        """Image pixels per latent pixel."""
        return 2 ** (len(self.block_out_channels) - 1)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], what: str = "vae/config.json") -> VaeConfig:
        name = data.get("_class_name", "AutoencoderKL")
        if name != "AutoencoderKL":
            raise ConfigError(f"{what}: _class_name is {name!r}, expected 'AutoencoderKL'")
        _refuse(what, {"k": _get(data, "act_fn", "silu")}, "k", ("silu",), "act_fn must be silu")
        for key in ("up_block_types", "down_block_types"):
            types = data.get(key)
            if types is not None and any(t not in ("UpDecoderBlock2D", "DownEncoderBlock2D") for t in types):
                raise ConfigError(f"{what}: {key} {types} are not the 2D encoder/decoder blocks")
        groups = positive_int(what, "norm_num_groups", _get(data, "norm_num_groups", 32))
        chans = int_tuple(what, "block_out_channels", _get(data, "block_out_channels", [64]))
        if any(c % groups for c in chans):
            raise ConfigError(f"{what}: block_out_channels {list(chans)} do not split into {groups} groups")
        return cls(
            latent_channels=positive_int(what, "latent_channels", _get(data, "latent_channels", 4)),
            out_channels=positive_int(what, "out_channels", _get(data, "out_channels", 3)),
            block_out_channels=chans,
            layers_per_block=positive_int(what, "layers_per_block", _get(data, "layers_per_block", 1)),
            norm_num_groups=groups,
            scaling_factor=positive_float(what, "scaling_factor", _get(data, "scaling_factor", 0.18215)),
            shift_factor=float(_get(data, "shift_factor", 0.0)),
            force_upcast=bool(_get(data, "force_upcast", True)),
            use_post_quant_conv=bool(_get(data, "use_post_quant_conv", True)),
            mid_block_add_attention=bool(_get(data, "mid_block_add_attention", True)),
            sample_size=positive_int(what, "sample_size", _get(data, "sample_size", 32)),
        )


@frozen
class TaesdConfig:
    """AutoencoderTiny (decoder half): conv + ReLU stacks, nearest 2x upsampling, no normalization."""

    latent_channels: int
    out_channels: int
    block_out_channels: tuple[int, ...]
    num_blocks: tuple[int, ...]
    upsampling_scaling_factor: int
    scaling_factor: float
    latent_magnitude: float

    @property
    def scale_factor(self) -> int:
        return self.upsampling_scaling_factor ** (len(self.block_out_channels) - 1)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], what: str = "taesd config.json") -> TaesdConfig:
        name = data.get("_class_name", "AutoencoderTiny")
        if name != "AutoencoderTiny":
            raise ConfigError(f"{what}: _class_name is {name!r}, expected 'AutoencoderTiny' (TAESD)")
        _refuse(what, {"k": _get(data, "act_fn", "relu")}, "k", ("relu",), "TAESD uses relu")
        _refuse(what, {"k": _get(data, "upsample_fn", "nearest")}, "k", ("nearest",), "TAESD upsamples nearest")
        chans = int_tuple(what, "decoder_block_out_channels", _get(data, "decoder_block_out_channels", [64] * 4))
        blocks = int_tuple(what, "num_decoder_blocks", _get(data, "num_decoder_blocks", [3, 3, 3, 1]))
        if len(set(chans)) != 1:  # each level's last conv keeps its width, so the next level must have it too
            raise ConfigError(f"{what}: decoder_block_out_channels {list(chans)} must all be equal (DecoderTiny)")
        if len(blocks) != len(chans):
            raise ConfigError(
                f"{what}: num_decoder_blocks {list(blocks)} and decoder_block_out_channels differ in length"
            )
        return cls(
            latent_channels=positive_int(what, "latent_channels", _get(data, "latent_channels", 4)),
            out_channels=positive_int(what, "out_channels", _get(data, "out_channels", 3)),
            block_out_channels=chans,
            num_blocks=blocks,
            upsampling_scaling_factor=positive_int(
                what, "upsampling_scaling_factor", _get(data, "upsampling_scaling_factor", 2)
            ),
            scaling_factor=positive_float(what, "scaling_factor", _get(data, "scaling_factor", 1.0)),
            latent_magnitude=positive_float(what, "latent_magnitude", _get(data, "latent_magnitude", 3)),
        )


EULER_CLASSES = ("EulerDiscreteScheduler", "EulerAncestralDiscreteScheduler")


@frozen
class SchedulerConfig:
    """The discrete (DDPM-trained) noise schedule: betas, timestep spacing, prediction type. dif samples
    it with Euler (`dif_frontend_sdturbo.sampling`); `class_name` says what the checkpoint ships."""

    class_name: str
    num_train_timesteps: int
    beta_start: float
    beta_end: float
    beta_schedule: str
    timestep_spacing: str
    steps_offset: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], what: str = "scheduler/scheduler_config.json") -> SchedulerConfig:
        pred = _get(data, "prediction_type", "epsilon")
        if pred != "epsilon":
            raise ConfigError(
                f"{what}: prediction_type={pred!r}: only epsilon-prediction checkpoints are supported "
                "(SD-Turbo, SD 1.x, SD 2.x-base); the 768 v-prediction SD 2.x models are not"
            )
        schedule = _get(data, "beta_schedule", "linear")
        if schedule not in ("linear", "scaled_linear"):
            raise ConfigError(f"{what}: beta_schedule={schedule!r} is not supported (linear, scaled_linear)")
        if data.get("trained_betas") is not None:
            raise ConfigError(f"{what}: trained_betas are not supported")
        spacing = _get(data, "timestep_spacing", "linspace")
        if spacing not in ("linspace", "leading", "trailing"):
            raise ConfigError(f"{what}: timestep_spacing={spacing!r} is not supported")
        for key in ("use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas", "rescale_betas_zero_snr"):
            if data.get(key):
                raise ConfigError(f"{what}: {key}=true is not supported")
        if _get(data, "interpolation_type", "linear") != "linear":
            raise ConfigError(f"{what}: interpolation_type={data['interpolation_type']!r} is not supported")
        return cls(
            class_name=str(data.get("_class_name", "EulerDiscreteScheduler")),
            num_train_timesteps=positive_int(what, "num_train_timesteps", _get(data, "num_train_timesteps", 1000)),
            beta_start=positive_float(what, "beta_start", _get(data, "beta_start", 0.0001)),
            beta_end=positive_float(what, "beta_end", _get(data, "beta_end", 0.02)),
            beta_schedule=schedule,
            timestep_spacing=spacing,
            steps_offset=int(_get(data, "steps_offset", 0)),
        )


@frozen
class SdConfigs:
    """Every config of one checkpoint; `kind` "turbo" | "base" (see the module docstring)."""

    text_encoder: ClipTextConfig
    unet: UNetConfig
    vae: VaeConfig
    scheduler: SchedulerConfig
    kind: str

    @property
    def pixels_per_token(self) -> int:
        """Image pixels per latent pixel (the VAE's scale factor)."""
        return self.vae.scale_factor

    @property
    def size_multiple(self) -> int:
        """Image sizes must be multiples of this: the VAE factor times the UNet's downsampling."""
        return self.vae.scale_factor * self.unet.downsample_factor

    def check(self, what: str) -> SdConfigs:
        if self.unet.cross_attention_dim != self.text_encoder.hidden_size:
            raise ConfigError(
                f"{what}: the UNet attends to {self.unet.cross_attention_dim}-wide text states but the text "
                f"encoder is {self.text_encoder.hidden_size} wide",
                hint="the text encoder and the UNet come from different Stable Diffusion versions",
            )
        if self.unet.in_channels != self.vae.latent_channels or self.unet.out_channels != self.vae.latent_channels:
            raise ConfigError(
                f"{what}: the UNet has {self.unet.in_channels} -> {self.unet.out_channels} channels but the VAE "
                f"{self.vae.latent_channels} latent channels"
            )
        return self


def turbo_kind(index: Mapping[str, Any], scheduler: SchedulerConfig, root: Path) -> str:
    """ "turbo" when the checkpoint says it is distilled: its name (model_index `_name_or_path` or the
    folder) contains "turbo", or it ships an Euler scheduler with trailing spacing (sd-turbo's);
    otherwise "base"."""
    names = (str(index.get("_name_or_path", "")), root.resolve().name)
    if any("turbo" in n.lower() for n in names):
        return "turbo"
    if scheduler.class_name in EULER_CLASSES and scheduler.timestep_spacing == "trailing":
        return "turbo"
    return "base"


def read_model_index(root: Path) -> dict[str, Any]:
    """model_index.json of a Stable Diffusion folder; `ConfigError` naming the pipeline otherwise."""
    index = read_json_object(root / "model_index.json")
    name = index.get("_class_name")
    if name in REFUSED_PIPELINES:
        raise ConfigError(
            f"{root}: {name}: {REFUSED_PIPELINES[name]}", hint="dif sdturbo runs SD-Turbo and SD 1.x / 2.x"
        )
    if name not in PIPELINE_CLASSES:
        raise ConfigError(f"{root}/model_index.json: _class_name {name!r} is not StableDiffusionPipeline")
    return index


def is_sd_folder(path: Path) -> bool:
    """Whether `path` holds a model_index.json naming a Stable Diffusion pipeline (any version: the
    refused ones are claimed too, so their error names them)."""
    try:
        index = read_json_object(path / "model_index.json")
    except ConfigError:
        return False
    return index.get("_class_name") in (*PIPELINE_CLASSES, *REFUSED_PIPELINES)


def load_configs(root: Path) -> SdConfigs:
    """Every config of the diffusers folder `root`, checked against each other."""
    index = read_model_index(root)

    def read(sub: str, file: str = "config.json") -> dict[str, Any]:
        return read_json_object(root / sub / file)

    scheduler = SchedulerConfig.from_dict(read("scheduler", "scheduler_config.json"), f"{root}/scheduler")
    return SdConfigs(
        text_encoder=ClipTextConfig.from_dict(read("text_encoder"), f"{root}/text_encoder/config.json"),
        unet=UNetConfig.from_dict(read("unet"), f"{root}/unet/config.json"),
        vae=VaeConfig.from_dict(read("vae"), f"{root}/vae/config.json"),
        scheduler=scheduler,
        kind=turbo_kind(index, scheduler, root),
    ).check(str(root))
