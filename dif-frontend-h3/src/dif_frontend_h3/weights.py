"""MiniMax-H3 checkpoint access: a diffusers (modular) folder opened lazily, components bound to programs.

Frontend stage between the builders and a backend's `prepare`. Weights are read by mmap (`dif.weights`);
program parameters carry the diffusers / transformers names, so binding is by identity except for the
text encoder, saved as `Qwen3VLForConditionalGeneration` (`model.language_model.*`) or as `Qwen3VLModel`
(`language_model.*`): its vision tower, `lm_head`, the final norm and the layers past the tap are unused.
The video and audio VAEs are optional here (None when their folder is absent; decoding is then refused).
Every mismatch is reported by `dif.weights.bind_weights` naming the tensor and its file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

from attrs import frozen

from dif.errors import CheckpointError, WeightError
from dif.ir.program import Program
from dif.weights import BoundWeights, TensorSource, bind_weights, open_component
from dif_frontend_h3.config import H3Configs, is_h3_folder, load_configs


@frozen
class H3Checkpoint:
    """One MiniMax-H3 folder: configs, tokenizer folder and a lazy source per component."""

    root: Path
    name: str
    configs: H3Configs
    tokenizer_dir: Path
    transformer: TensorSource
    text_encoder: TensorSource
    text_prefix: str
    vae: TensorSource | None
    audio_vae: TensorSource | None


def text_prefix(source: TensorSource) -> str:
    """'model.' for Qwen3VLForConditionalGeneration, '' for Qwen3VLModel."""
    for prefix in ("model.", ""):
        if f"{prefix}language_model.embed_tokens.weight" in source:
            return prefix
    raise WeightError(
        f"{source.label}: no 'model.language_model.embed_tokens.weight' (nor 'language_model.embed_tokens.weight')",
        hint="the text_encoder folder must hold a Qwen3-VL checkpoint",
    )


def _optional(root: Path, name: str, variant: str | None) -> TensorSource | None:
    folder = root / name
    return open_component(folder, variant=variant) if folder.is_dir() else None


def open_checkpoint(path: str | Path, *, variant: str | None = None) -> H3Checkpoint:
    """Open a MiniMax-H3 diffusers folder (model_index.json naming MiniMaxH3ModularPipeline). Nothing is
    read yet beyond configs and headers; `variant` picks e.g. `*.fp16.safetensors` files."""
    root = Path(path)
    if not root.exists():
        raise CheckpointError(f"{root}: no such folder")
    if not is_h3_folder(root):
        raise CheckpointError(
            f"{root}: not a MiniMax-H3 diffusers folder (no model_index.json naming MiniMaxH3ModularPipeline)",
            hint="point at the folder holding model_index.json, transformer/, text_encoder/, tokenizer/, "
            "vae/, audio_vae/",
        )
    configs = load_configs(root)
    transformer = open_component(root / "transformer", variant=variant)
    text = open_component(root / "text_encoder", variant=variant)
    tokenizer_dir = root / "tokenizer"
    if not tokenizer_dir.is_dir():
        raise CheckpointError(f"{tokenizer_dir}: no tokenizer folder (the prompt cannot be tokenized)")
    return H3Checkpoint(
        root, root.resolve().name or "h3", configs, tokenizer_dir, transformer, text, text_prefix(text),
        _optional(root, "vae", variant), _optional(root, "audio_vae", variant),
    )  # fmt: skip


def bind_denoiser(program: Program, source: TensorSource) -> BoundWeights:
    """Bind a `build_denoiser` program: every transformer tensor must be used."""
    return bind_weights(program, source)


def text_encoder_unused(prefix: str, depth: int) -> Callable[[str], bool]:
    """Text-encoder tensors a program of `depth` layers does not read: later layers, the final norm, the
    vision tower, `lm_head`."""
    layer = re.compile(re.escape(prefix) + r"language_model\.layers\.(\d+)\.")
    others = [re.compile(p) for p in (re.escape(prefix) + r"visual\..*", r"lm_head\.weight",
                                      re.escape(prefix) + r"language_model\.norm\.weight")]  # fmt: skip

    def unused(name: str) -> bool:
        m = layer.match(name)
        if m is not None:
            return int(m.group(1)) >= depth
        return any(p.fullmatch(name) for p in others)

    return unused


def bind_text_encoder(program: Program, source: TensorSource, prefix: str | None = None) -> BoundWeights:
    """Bind a `build_text_encoder` program to a Qwen3-VL source (either naming)."""
    prefix = text_prefix(source) if prefix is None else prefix
    layers = {int(m.group(1)) for p in program.params if (m := re.match(r"language_model\.layers\.(\d+)\.", p.name))}
    depth = max(layers) + 1 if layers else 0
    return bind_weights(program, source, lambda p: prefix + p, ignore=text_encoder_unused(prefix, depth))


def has_vision_tower(source: TensorSource, prefix: str) -> bool:
    """Whether the text encoder's save holds the vision tower (a transformers save does; a checkpoint cut to
    the text stack does not, and fl2va then conditions without picture blocks)."""
    return f"{prefix}visual.patch_embed.proj.weight" in source


def bind_vision_tower(program: Program, source: TensorSource, prefix: str | None = None) -> BoundWeights:
    """Bind a `vision_tower.build_vision_tower` program (`visual.*`) to a Qwen3-VL source (either naming);
    the text stack and `lm_head` are not read."""
    prefix = text_prefix(source) if prefix is None else prefix
    visual = re.compile(re.escape(prefix) + r"visual\.")
    return bind_weights(program, source, lambda p: prefix + p, ignore=lambda name: visual.match(name) is None)
