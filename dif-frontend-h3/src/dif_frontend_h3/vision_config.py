"""The Qwen3-VL vision side of MiniMax-H3's conditioner: the vision tower's config (text_encoder/config.json,
`vision_config`), the token ids and mRoPE sections the text stack needs for picture blocks, and the image
processor's settings (processor/preprocessor_config.json).

Frontend stage 0 (config parsing) for fl2va's picture blocks. Defaults equal transformers' class defaults
(Qwen3VLVisionConfig, Qwen2VLImageProcessor) where the published files leave a key out.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrs import frozen

from dif.errors import ConfigError
from dif_frontend_h3.config import read_json

WHAT = "Qwen3-VL vision config"
CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)  # transformers' OPENAI_CLIP_MEAN / _STD, the processor defaults
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


def _int(data: Mapping[str, Any], key: str, default: int) -> int:
    value = data.get(key, default)
    if isinstance(value, (list, tuple)):  # transformers allows (p, p) patch sizes; MiniMax-H3's are square
        if len(set(value)) != 1:
            raise ConfigError(f"{WHAT}: {key} {value!r} must be square (one value)")
        value = value[0]
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ConfigError(f"{WHAT}: {key} must be a positive integer, got {value!r}")
    return value


@frozen
class H3VisionConfig:
    """The vision tower (Qwen3VLVisionModel) plus what the text stack needs to place its rows: the special
    token ids of a vision block and the text rope's interleaved mRoPE sections (t, h, w)."""

    depth: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    out_hidden_size: int
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    in_channels: int = 3
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10_000.0
    image_token_id: int = 151655
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    mrope_section: tuple[int, int, int] = (24, 20, 20)

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def patch_dim(self) -> int:
        """Width of one flattened patch row: C x temporal x p x p."""
        return self.in_channels * self.temporal_patch_size * self.patch_size**2

    @property
    def merge_unit(self) -> int:
        return self.spatial_merge_size**2

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> H3VisionConfig:
        """The full Qwen3VLConfig dict (model_type qwen3_vl)."""
        if data.get("model_type") != "qwen3_vl":
            raise ConfigError(f"{WHAT}: model_type is {data.get('model_type')!r}, expected 'qwen3_vl'")
        v, t = data.get("vision_config"), data.get("text_config")
        if not isinstance(v, Mapping) or not isinstance(t, Mapping):
            raise ConfigError(f"{WHAT}: 'vision_config' and 'text_config' are both needed")
        if v.get("hidden_act", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
            raise ConfigError(f"{WHAT}: hidden_act {v.get('hidden_act')!r} is not supported (gelu_pytorch_tanh)")
        rope = t.get("rope_parameters") or t.get("rope_scaling") or {}
        section = tuple(int(s) for s in rope.get("mrope_section", (24, 20, 20)))
        if len(section) != 3 or not rope.get("mrope_interleaved", True):
            raise ConfigError(f"{WHAT}: mRoPE {rope!r} is not supported (interleaved, three sections)")
        vrope = v.get("rope_parameters") or {}
        kw = {k: _int(v, k, d) for k, d in (("depth", 27), ("hidden_size", 1152), ("intermediate_size", 4304),
              ("num_heads", 16), ("out_hidden_size", 3584), ("patch_size", 16), ("temporal_patch_size", 2),
              ("spatial_merge_size", 2), ("in_channels", 3), ("num_position_embeddings", 2304))}  # fmt: skip
        cfg = cls(
            **kw,
            deepstack_visual_indexes=tuple(int(i) for i in v.get("deepstack_visual_indexes", (8, 16, 24))),
            rope_theta=float(vrope.get("rope_theta", 10_000.0)),
            image_token_id=int(data.get("image_token_id", 151655)),
            vision_start_token_id=int(data.get("vision_start_token_id", 151652)),
            vision_end_token_id=int(data.get("vision_end_token_id", 151653)),
            mrope_section=(section[0], section[1], section[2]),
        )
        side = round(cfg.num_position_embeddings**0.5)
        if side * side != cfg.num_position_embeddings or cfg.hidden_size % cfg.num_heads or cfg.head_dim % 4:
            raise ConfigError(f"{WHAT}: need a square position table and a head_dim ({cfg.head_dim}) divisible by 4")
        if any(not 0 <= i < cfg.depth for i in cfg.deepstack_visual_indexes):
            raise ConfigError(f"{WHAT}: deepstack layers {cfg.deepstack_visual_indexes} outside 0..{cfg.depth - 1}")
        return cfg


@frozen
class ImageProcessorConfig:
    """Qwen2VLImageProcessor's settings: pixels bounds for smart_resize (`size.shortest_edge` / `longest_edge`
    are pixel counts, not edges), bicubic resampling, x / 255, (x - mean) / std, patch geometry."""

    patch_size: int = 16
    temporal_patch_size: int = 2
    merge_size: int = 2
    min_pixels: int = 56 * 56
    max_pixels: int = 28 * 28 * 1280
    image_mean: tuple[float, float, float] = CLIP_MEAN
    image_std: tuple[float, float, float] = CLIP_STD

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ImageProcessorConfig:
        size = data.get("size") or {}
        mean, std = data.get("image_mean", CLIP_MEAN), data.get("image_std", CLIP_STD)
        return cls(
            patch_size=int(data.get("patch_size", 16)),
            temporal_patch_size=int(data.get("temporal_patch_size", 2)),
            merge_size=int(data.get("merge_size", 2)),
            min_pixels=int(data.get("min_pixels", size.get("shortest_edge", 56 * 56))),
            max_pixels=int(data.get("max_pixels", size.get("longest_edge", 28 * 28 * 1280))),
            image_mean=(float(mean[0]), float(mean[1]), float(mean[2])),
            image_std=(float(std[0]), float(std[1]), float(std[2])),
        )

    @classmethod
    def from_folder(cls, folder: str | Path) -> ImageProcessorConfig:
        return cls.from_dict(read_json(Path(folder) / "preprocessor_config.json"))
