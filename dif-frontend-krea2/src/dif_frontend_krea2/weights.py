"""Krea 2 checkpoint access: each component folder opened, presented under program names, bound.

Frontend stage between the builders and a backend's `prepare`. Program parameters carry the
diffusers / transformers state-dict names, so binding is by identity except for
  - the text encoder, saved either as `Qwen3VLModel` (`language_model.*`) or as
    `Qwen3VLForConditionalGeneration` (`model.language_model.*`); the vision tower, `lm_head` and
    layers past the deepest tap are not used;
  - the VAE, whose causal 3D kernels (O, I, T, kh, kw) are read as the 2D kernel of their last
    temporal tap (`last_temporal_tap`, a `dif.weights.Take` rule); the encoder half and the temporal
    upsampling convs are unused.
Every mismatch is reported by `dif.weights.bind_weights` naming the tensor and its file.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from pathlib import Path

import attrs
from attrs import frozen

from dif.errors import CheckpointError, WeightError
from dif.ir.program import Program
from dif.lora import DEFAULT_SLOT_RANK, LoraApplication, LoraSpec, UnmergedLoras
from dif.weights import (
    BoundWeights,
    MappedSource,
    Rule,
    Take,
    TensorSource,
    bind_weights,
    is_gguf,
    open_component,
    open_gguf,
    open_safetensors,
)
from dif.weights.fp8 import scaled_fp8
from dif.weights.metadata import embedded_config
from dif_frontend_krea2 import DEFAULT_CHECKPOINT
from dif_frontend_krea2.config import (
    Krea2Configs,
    Krea2TransformerConfig,
    QwenImageVaeConfig,
    QwenVLTextConfig,
    is_krea2_folder,
    load_configs,
)
from dif_frontend_krea2.lora import apply_checkpoint_loras
from dif_frontend_krea2.vae import unused_tensor_patterns

LAST_TEMPORAL_TAP = Take(axis=2, index=-1, what="last temporal tap of the 3D kernel")


def last_temporal_tap(base: TensorSource) -> MappedSource:
    """`base` with every rank-5 tensor (a 3D conv kernel O, I, T, kh, kw) shown under its own name
    as its last temporal tap (O, I, kh, kw); other tensors pass through. Only headers are read."""
    rules = {n: Rule(n, LAST_TEMPORAL_TAP) for n in base.names() if len(base.info(n).shape) == 5}
    return MappedSource(base, rules)


def _has_3d_kernels(source: TensorSource) -> bool:
    return any(len(source.info(n).shape) == 5 for n in source.names())


def _text_prefix(source: TensorSource) -> str:
    """'' for a Qwen3VLModel checkpoint, 'model.' for Qwen3VLForConditionalGeneration."""
    for prefix in ("", "model."):
        if f"{prefix}language_model.embed_tokens.weight" in source:
            return prefix
    raise WeightError(
        f"{source.label}: no 'language_model.embed_tokens.weight' (nor 'model.language_model.embed_tokens.weight')",
        hint="the text_encoder folder must hold a Qwen3-VL checkpoint",
    )


def text_encoder_unused(prefix: str, depth: int, final_norm: bool) -> Callable[[str], bool]:
    """Predicate for text-encoder tensors a program with `depth` layers (and the final norm or not)
    does not read: later layers, the vision tower, `lm_head`."""
    layer = re.compile(re.escape(prefix) + r"language_model\.layers\.(\d+)\.")
    others = [re.escape(prefix) + r"visual\..*", r"lm_head\.weight"]
    if not final_norm:
        others.append(re.escape(prefix) + r"language_model\.norm\.weight")
    patterns = [re.compile(p) for p in others]

    def unused(name: str) -> bool:
        m = layer.match(name)
        if m is not None:
            return int(m.group(1)) >= depth
        return any(p.fullmatch(name) for p in patterns)

    return unused


@frozen
class Krea2Checkpoint:
    """One Krea 2 diffusers folder: configs, tokenizer folder and a lazy source per component."""

    root: Path
    name: str
    configs: Krea2Configs
    tokenizer_dir: Path
    transformer: TensorSource
    text_encoder: TensorSource
    text_prefix: str
    vae: TensorSource
    unmerged: UnmergedLoras | None = None  # LoRAs as side-GEMM inputs (`--lora-mode unmerged`)
    loras: LoraApplication | None = None  # how the LoRAs run (transformer; text encoder merged), and why

    @property
    def is_distilled(self) -> bool:
        return self.configs.pipeline.is_distilled

    @property
    def variant(self) -> str:
        return self.configs.pipeline.variant


def open_checkpoint(
    path: str | Path,
    *,
    variant: str | None = None,
    transformer_file: str | Path | None = None,
    vae_file: str | Path | None = None,
    text_encoder_file: str | Path | None = None,
    config_variant: str | None = None,
    loras: Sequence[LoraSpec | str | Path] = (),
    lora_allow_unmatched: bool = False,
    lora_mode: str = "auto",
    lora_swappable: bool = False,
    lora_rank: int = DEFAULT_SLOT_RANK,
) -> Krea2Checkpoint:
    """Open a Krea 2 checkpoint: a diffusers folder (model_index.json naming Krea2Pipeline), or a
    transformer single file. Nothing is read yet beyond configs and headers. `variant` picks e.g.
    `*.fp16.safetensors` files; `transformer_file` / `vae_file` / `text_encoder_file` replace those
    components with single files (safetensors or GGUF, diffusers / transformers names, optionally
    under a `diffusion_model.` prefix). A transformer file with no folder beside it needs the other
    two: configs then come from the published `config_variant` ("turbo" unless given: weights cannot
    tell Raw from Turbo) and must fit the file's shapes, unless a file carries its own `config`.
    `loras` (`--lora FILE[:SCALE]`) are merged into the transformer's weights or kept as side-GEMM
    inputs of slots of `lora_rank` (`dif_frontend_krea2.lora.apply_checkpoint_loras`: `lora_mode`
    "auto" | "merged" | "unmerged", `lora_swappable`); swap them with `checkpoint.unmerged.set(...)`.
    Their text-encoder adapters are merged into the text encoder's weights in every mode."""
    given = Path(path)
    if not given.exists():
        raise CheckpointError(f"{given}: no such file or folder")
    root: Path | None = given
    if given.is_file():
        if transformer_file is not None:
            raise CheckpointError("give the transformer file either as the model path or as --transformer, not both")
        transformer_file = given
        root = given.parent if is_krea2_folder(given.parent) else None
    elif not is_krea2_folder(given):
        raise CheckpointError(
            f"{given}: not a Krea 2 diffusers folder (no model_index.json naming Krea2Pipeline)",
            hint="point at the folder holding model_index.json, transformer/, text_encoder/, vae/, tokenizer/, "
            "or give the components as single files",
        )
    if root is None:
        missing = [f for f, v in (("--text-encoder FILE", text_encoder_file), ("--vae FILE", vae_file)) if v is None]
        if missing:
            raise CheckpointError(
                f"{transformer_file}: a transformer single file with no Krea 2 folder beside it needs "
                f"{' and '.join(missing)}",
                hint="give the text encoder and VAE as single files too, or put the file in the diffusers folder",
            )
        from dif_frontend_krea2.configs import published

        root = published(config_variant or "turbo")
        tokenizer_dir = DEFAULT_CHECKPOINT / "tokenizer"
    else:
        tokenizer_dir = root / "tokenizer"
    configs = load_configs(root)
    if transformer_file is not None:
        transformer = open_single_file(transformer_file, "transformer")
        own = embedded_config(transformer_file)
        if own is not None:
            configs = attrs.evolve(configs, transformer=Krea2TransformerConfig.from_dict(own)).check()
        _check_transformer_shapes(transformer, configs.transformer, root)
    else:
        transformer = open_component(root / "transformer", variant=variant)
    if text_encoder_file is not None:
        text = open_single_file(text_encoder_file, "text_encoder")
        own = embedded_config(text_encoder_file)
        if own is not None:
            configs = attrs.evolve(configs, text_encoder=QwenVLTextConfig.from_dict(own)).check()
    else:
        text = open_component(root / "text_encoder", variant=variant)
    if vae_file is not None:
        vae = open_single_file(vae_file, "vae")
        own = embedded_config(vae_file)
        if own is not None:
            configs = attrs.evolve(configs, vae=QwenImageVaeConfig.from_dict(own))
    else:
        vae = open_component(root / "vae", variant=variant)
    name = Path(transformer_file).stem if transformer_file is not None else (root.resolve().name or "krea2")
    text_prefix = _text_prefix(text)
    applied = apply_checkpoint_loras(
        transformer, text, text_prefix, loras, mode=lora_mode, swappable=lora_swappable, rank=lora_rank,
        allow_unmatched=lora_allow_unmatched,
    )  # fmt: skip
    assert applied.text_encoder is not None  # given above: the base, or the adapters merged into it
    return Krea2Checkpoint(
        root, name + applied.describe(), configs, tokenizer_dir, applied.source, applied.text_encoder, text_prefix,
        last_temporal_tap(vae), applied.unmerged, applied,
    )  # fmt: skip


# -- single files --------------------------------------------------------------------------------

_MARKERS = {
    "transformer": "text_fusion.projector.weight",
    "vae": "decoder.conv_in.weight",
    "text_encoder": "language_model.embed_tokens.weight",
}
_ORIGINAL_MARKERS = ("first.weight", "blocks.0.attn.wq.weight", "txtfusion.projector.weight")
_PREFIXES = ("model.diffusion_model.", "diffusion_model.", "model.")


def open_single_file(path: str | Path, component: str) -> TensorSource:
    """One Krea 2 component as a single file (safetensors or GGUF) under the names the programs use:
    a `model.diffusion_model.` / `diffusion_model.` (or for a text encoder `model.`) prefix is
    dropped when every tensor has it. The original Krea 2 naming (`blocks.N.attn.wq`) is refused."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"{path}: no such {component.replace('_', ' ')} file")
    base: TensorSource = open_gguf(path) if is_gguf(path) else scaled_fp8(open_safetensors(path))
    names = base.names()
    marker = _MARKERS[component]
    if marker in base:
        return base
    for prefix in _PREFIXES:
        if names and all(n.startswith(prefix) for n in names) and f"{prefix}{marker}" in base:
            if component == "text_encoder" and prefix == "model.":
                return base  # Qwen3VLForConditionalGeneration naming, read as is (`_text_prefix`)
            mapped = MappedSource(base, {n[len(prefix) :]: Rule(n) for n in names})
            mapped.label = f"{path} (prefix '{prefix}')"
            return mapped
    stripped = {n.split("diffusion_model.", 1)[-1] for n in names}
    if component == "transformer" and any(m in stripped for m in _ORIGINAL_MARKERS):
        raise CheckpointError(
            f"{path}: a Krea 2 transformer in the original (non-diffusers) naming ('blocks.N.attn.wq' ...); "
            "dif reads the diffusers naming of Krea 2 single files",
            hint="use the diffusers folder's transformer, or convert the file to diffusers names",
        )
    raise CheckpointError(
        f"{path}: not a Krea 2 {component.replace('_', ' ')} file (no '{marker}')",
        hint=f"found {len(names)} tensors, e.g. {', '.join(names[:3])}",
    )


def is_transformer_file(path: Path) -> bool:
    """Whether `path` is a Krea 2 transformer single file (safetensors or GGUF; headers only)."""
    if path.suffix not in (".safetensors", ".gguf") and not is_gguf(path):
        return False
    try:
        open_single_file(path, "transformer")
    except Exception:
        return False
    return True


def _check_transformer_shapes(source: TensorSource, cfg: Krea2TransformerConfig, root: Path) -> None:
    """A transformer file must have the configured width and depth (named file, config, shapes)."""
    if "img_in.weight" not in source:
        raise CheckpointError(f"{source.label}: no 'img_in.weight': not a Krea 2 transformer")
    width, channels = source.info("img_in.weight").shape
    layers = len({m[1] for n in source.names() if (m := re.match(r"transformer_blocks\.(\d+)\.", n))})
    have = {"width": width, "in_channels": channels, "blocks": layers}
    want = {"width": cfg.num_attention_heads * cfg.attention_head_dim, "in_channels": cfg.in_channels}
    want["blocks"] = cfg.num_layers
    if have != want:
        said = lambda d: ", ".join(f"{k}={v}" for k, v in d.items())  # noqa: E731
        raise CheckpointError(
            f"{source.label}: the transformer ({said(have)}) does not fit the configs of {root} ({said(want)})",
            hint="a file for another model, or --config-variant / a folder of the same model",
        )


def bind_text_encoder(program: Program, source: TensorSource, prefix: str | None = None) -> BoundWeights:
    """Bind a `build_text_encoder` program to a text-encoder source (either naming)."""
    prefix = _text_prefix(source) if prefix is None else prefix
    layers = {int(m.group(1)) for p in program.params if (m := re.match(r"language_model\.layers\.(\d+)\.", p.name))}
    depth = max(layers) + 1 if layers else 0
    final_norm = any(p.name == "language_model.norm.weight" for p in program.params)
    return bind_weights(program, source, lambda p: prefix + p, ignore=text_encoder_unused(prefix, depth, final_norm))


TEXT_FUSION_PREFIXES = ("text_fusion.", "txt_in.")


def bind_transformer(program: Program, source: TensorSource) -> BoundWeights:
    """Bind a whole-forward `build_transformer` program: every checkpoint tensor must be used."""
    return bind_weights(program, source)


def bind_text_fusion(program: Program, source: TensorSource) -> BoundWeights:
    """Bind a `build_text_fusion` program: it owns the `text_fusion.*` and `txt_in.*` tensors."""
    return bind_weights(program, source, ignore=lambda n: not n.startswith(TEXT_FUSION_PREFIXES))


def bind_denoiser(program: Program, source: TensorSource) -> BoundWeights:
    """Bind a `build_denoiser` program: everything but the text-fusion tensors (so between the two
    bindings, an unused or missing tensor anywhere in the checkpoint is reported)."""
    return bind_weights(program, source, ignore=lambda n: n.startswith(TEXT_FUSION_PREFIXES))


def bind_vae(program: Program, source: TensorSource) -> BoundWeights:
    """Bind a `build_vae_decoder` program to a VAE source (seen through `last_temporal_tap` if it
    still shows 3D kernels)."""
    if _has_3d_kernels(source):
        source = last_temporal_tap(source)
    return bind_weights(program, source, ignore=unused_tensor_patterns())
