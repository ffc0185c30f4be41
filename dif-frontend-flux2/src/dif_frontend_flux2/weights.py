"""FLUX.2 checkpoint layouts: find the components of a checkpoint and present them under diffusers names.

Frontend stage, first: a path (diffusers folder, or an original BFL single file) -> `Flux2Checkpoint`
with configs, tokenizer folder and one lazy `TensorSource` per component whose names are the
diffusers state-dict names the DiffIR builders use, so binding is by identity.

Layouts:
  diffusers folder   model_index.json + transformer/ text_encoder/ vae/ tokenizer/ (+ variants, shards)
  BFL transformer    one safetensors file with the original names (`double_blocks.N.img_attn.qkv`,
                     `single_blocks.N.linear1`, `final_layer.adaLN_modulation.1` ...), optionally
                     prefixed `model.diffusion_model.` / `diffusion_model.` (ComfyUI repacks).
                     Configs, text encoder, VAE and tokenizer come from a diffusers folder: the
                     file's own folder (BFL repos keep the file next to the diffusers folders) or
                     the one given as `base`.
  BFL VAE            the original autoencoder names (`decoder.up.3.block.0.nin_shortcut` ...).
The BFL -> diffusers mapping is the inverse view of what diffusers' conversion does: fused qkv
rows split in three, final adaLN (shift, scale) halves swapped to (scale, shift), `.scale` norms
renamed `.weight`, 1x1 conv attention kernels used as linears, up blocks numbered in reverse.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import attrs
from attrs import frozen

from dif.errors import CheckpointError
from dif.lora import (
    DEFAULT_SLOT_RANK,
    LoraApplication,
    LoraComponent,
    LoraSpec,
    Target,
    UnmergedLoras,
    apply_loras,
    merge_loras,
    text_encoder_table,
)
from dif.weights import Chunk, DropUnitAxes, MappedSource, Rule, SwapHalves, TensorSource, open_component
from dif.weights import open_safetensors as open_file
from dif.weights.fp8 import scaled_fp8
from dif.weights.gguf import GGUFFile, is_gguf, open_gguf
from dif.weights.safetensors_file import read_header
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_frontend_flux2.config import Flux2Configs, Qwen3Config, load_configs

BFL_PREFIXES = ("model.diffusion_model.", "diffusion_model.")
BFL_TRANSFORMER_MARKER = "single_stream_modulation.lin.weight"
BFL_VAE_MARKER = "decoder.up.0.block.0.conv1.weight"

# Tensors a checkpoint has that the programs do not use (all other extras are errors).
TEXT_ENCODER_UNUSED_ALWAYS = (r"lm_head\..*",)
VAE_DECODER_UNUSED = (r"encoder\..*", r"quant_conv\..*", r"bn\.num_batches_tracked")


@frozen
class Flux2Checkpoint:
    """Everything needed to build and bind the three programs of one FLUX.2 [klein] checkpoint."""

    root: Path
    name: str
    layout: str  # "diffusers" | "bfl"
    configs: Flux2Configs
    tokenizer_dir: Path
    transformer: TensorSource
    text_encoder: TensorSource
    vae: TensorSource
    unmerged: UnmergedLoras | None = None  # LoRAs as side-GEMM inputs (`--lora-mode unmerged`)
    loras: LoraApplication | None = None  # how the LoRAs run (transformer; text encoder merged), and why

    @property
    def is_distilled(self) -> bool:
        return self.configs.pipeline.is_distilled

    @property
    def kind(self) -> str:
        """The key of the settings' per-kind defaults (`plugin.INFO`): "distilled" or "base"."""
        return "distilled" if self.is_distilled else "base"


def text_encoder_unused(taps_max: int, num_layers: int) -> tuple[str, ...]:
    """Regexes of text-encoder tensors a program tapping up to `taps_max` does not read: `lm_head`,
    layers taps_max .. num_layers-1, and the final norm unless the last layer is tapped (tap
    `num_layers` is the final-normed state)."""
    skipped = [str(i) for i in range(taps_max, num_layers)]
    extra = (rf"model\.layers\.({'|'.join(skipped)})\..*", r"model\.norm\..*") if skipped else ()
    return TEXT_ENCODER_UNUSED_ALWAYS + extra


# -- detection -----------------------------------------------------------------------------------


def _strip(name: str) -> str:
    for prefix in BFL_PREFIXES:
        if name.startswith(prefix):
            return name[len(prefix) :]
    return name


def safetensors_kind(path: Path) -> str | None:
    """'bfl-transformer' | 'bfl-vae' | 'diffusers-transformer' | 'diffusers-vae' | None, from the header
    of a safetensors or GGUF file."""
    try:
        if is_gguf(path):
            return _kind_of(GGUFFile(path).names())
        tensors, _, _ = read_header(path)
    except Exception:
        return None
    return _kind_of(tensors)


def _kind_of(tensor_names: Iterable[str]) -> str | None:
    """`safetensors_kind` of a file holding these tensor names."""
    names = {_strip(n) for n in tensor_names}
    if BFL_TRANSFORMER_MARKER in names:
        return "bfl-transformer"
    if "single_stream_modulation.linear.weight" in names:
        return "diffusers-transformer"
    if BFL_VAE_MARKER in names:
        return "bfl-vae"
    if "decoder.up_blocks.0.resnets.0.conv1.weight" in names:
        return "diffusers-vae"
    return None


def is_flux2_folder(path: Path) -> bool:
    index = path / "model_index.json"
    if not index.is_file():
        return False
    try:
        text = index.read_text(encoding="utf-8")
        return '"Flux2KleinPipeline"' in text or '"Flux2KleinKVPipeline"' in text
    except (OSError, UnicodeDecodeError):
        return False


def detect(path: Path) -> bool:
    """Whether `path` is a FLUX.2 [klein] checkpoint (diffusers folder, or a transformer single file:
    safetensors or GGUF, BFL or diffusers names)."""
    path = Path(path)
    if path.is_dir():
        return is_flux2_folder(path)
    single = path.suffix in (".safetensors", ".gguf") or is_gguf(path)
    return single and safetensors_kind(path) in ("bfl-transformer", "diffusers-transformer")


# -- opening -------------------------------------------------------------------------------------


def open_checkpoint(
    path: str | Path,
    *,
    variant: str | None = None,
    base: str | Path | None = None,
    transformer_file: str | Path | None = None,
    vae_file: str | Path | None = None,
    text_encoder_file: str | Path | None = None,
    config_variant: str | None = None,
    loras: Sequence[LoraSpec | str | Path] = (),
    lora_allow_unmatched: bool = False,
    lora_mode: str = "auto",
    lora_swappable: bool = False,
    lora_rank: int = DEFAULT_SLOT_RANK,
) -> Flux2Checkpoint:
    """Open a checkpoint. `path` is a diffusers folder or a transformer single file; `base` is the
    diffusers folder supplying the other components when `path` is a file (default: its folder);
    `transformer_file` / `vae_file` / `text_encoder_file` replace those components with single files.
    A transformer file with no diffusers folder (none beside it, no `base`) needs `vae_file` and
    `text_encoder_file`: configs then come from the files or the published `config_variant`
    (default: inferred, `dif_frontend_flux2.single_files`). `loras` (`--lora FILE[:SCALE]`) are merged
    into the transformer's weights, or kept as side-GEMM inputs of slots of `lora_rank` on every
    linear (`dif.lora.UnmergedLoras`; swap them with `checkpoint.unmerged.set(...)`): `lora_mode`
    "merged" | "unmerged", or "auto" (`dif.lora.mode`: unmerged when `lora_swappable`, else merged
    unless the merged weights do not fit the host), the decision in `checkpoint.loras.mode`. Their
    text-encoder adapters (`text_encoder_lora_table`) are merged into the Qwen3 weights in every mode."""
    from dif_frontend_flux2.single_files import open_single_files, open_text_encoder_file

    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or folder")
    root: Path | None
    if path.is_file():
        if transformer_file is not None:
            raise CheckpointError("give the transformer file either as the model path or as --transformer, not both")
        transformer_file = path
        root = Path(base) if base is not None else (path.parent if is_flux2_folder(path.parent) else None)
    else:
        root = path
    if root is not None and not is_flux2_folder(root):
        raise CheckpointError(
            f"{root}: not a FLUX.2 [klein] diffusers folder (no model_index.json naming Flux2KleinPipeline)",
            hint="point --base at the diffusers folder of the same model, or give every component as a single"
            " file (--text-encoder FILE --vae FILE)",
        )
    vae = open_single_file(vae_file, "vae") if vae_file is not None else None
    if root is None:  # single files only
        assert transformer_file is not None
        transformer = open_single_file(transformer_file, "transformer")
        root, configs, text_encoder, tokenizer_dir, _ = open_single_files(
            transformer,
            Path(transformer_file),
            text_encoder_file=None if text_encoder_file is None else Path(text_encoder_file),
            vae=vae,
            vae_file=None if vae_file is None else Path(vae_file),
            config_variant=config_variant,
        )
        assert vae is not None
    else:
        configs = load_configs(root)
        tokenizer_dir = root / "tokenizer"
        transformer = (
            open_single_file(transformer_file, "transformer")
            if transformer_file is not None
            else open_component(root / "transformer", variant=variant)
        )
        vae = vae if vae is not None else open_component(root / "vae", variant=variant)
        if text_encoder_file is not None:
            text_encoder, own = open_text_encoder_file(text_encoder_file)
            if own is not None:
                configs = attrs.evolve(configs, text_encoder=Qwen3Config.from_dict(own))
        else:
            text_encoder = open_component(root / "text_encoder", variant=variant)
    if transformer_file is not None:
        name = Path(transformer_file).stem
    elif root.resolve() == DEFAULT_CHECKPOINT:
        name = "flux2-klein-tiny-shapes (embedded demo)"
    else:
        name = root.resolve().name or "flux2"
    layout = "bfl" if isinstance(transformer, MappedSource) else "diffusers"
    applied = apply_loras(
        transformer, loras, lora_table(transformer), family="flux2", model="FLUX.2 [klein]", mode=lora_mode,
        swappable=lora_swappable, rank=lora_rank, allow_unmatched=lora_allow_unmatched,
        text_encoder=LoraComponent(text_encoder, text_encoder_lora_table(text_encoder)),
    )  # fmt: skip
    name += applied.describe()
    assert applied.text_encoder is not None  # given above: the base, or the adapters merged into it
    return Flux2Checkpoint(
        root, name, layout, configs, tokenizer_dir, applied.source, applied.text_encoder, vae, applied.unmerged,
        applied,
    )  # fmt: skip


def open_single_file(path: str | Path, component: str) -> TensorSource:
    """A transformer or VAE single file (safetensors, or GGUF: city96's bare BFL names or
    stable-diffusion.cpp's `model.diffusion_model.` ones) in either naming, under diffusers names;
    ComfyUI scaled fp8 weights dequantized (`dif.weights.fp8`)."""
    path = Path(path)
    base: TensorSource = open_gguf(path) if is_gguf(path) else scaled_fp8(open_file(path))
    kind = _kind_of(base.names())  # the header is already read: no second pass over the file
    if kind == f"bfl-{component}":
        rules = bfl_transformer_rules(base.names()) if component == "transformer" else bfl_vae_rules(base.names())
        mapped = MappedSource(base, rules)
        mapped.label = f"{path} (original BFL names)"
        return mapped
    if kind == f"diffusers-{component}":
        return base
    raise CheckpointError(
        f"{path}: not a FLUX.2 {component} file (neither original BFL nor diffusers tensor names)",
        hint=f"found {len(base)} tensors, e.g. {', '.join(list(base.names())[:3])}",
    )


# -- BFL transformer names -----------------------------------------------------------------------

_TOP = {
    "img_in": "x_embedder",
    "txt_in": "context_embedder",
    "time_in.in_layer": "time_guidance_embed.timestep_embedder.linear_1",
    "time_in.out_layer": "time_guidance_embed.timestep_embedder.linear_2",
    "guidance_in.in_layer": "time_guidance_embed.guidance_embedder.linear_1",
    "guidance_in.out_layer": "time_guidance_embed.guidance_embedder.linear_2",
    "double_stream_modulation_img.lin": "double_stream_modulation_img.linear",
    "double_stream_modulation_txt.lin": "double_stream_modulation_txt.linear",
    "single_stream_modulation.lin": "single_stream_modulation.linear",
    "final_layer.linear": "proj_out",
}
_DOUBLE = {
    "img_attn.norm.query_norm": "attn.norm_q",
    "img_attn.norm.key_norm": "attn.norm_k",
    "img_attn.proj": "attn.to_out.0",
    "img_mlp.0": "ff.linear_in",
    "img_mlp.2": "ff.linear_out",
    "txt_attn.norm.query_norm": "attn.norm_added_q",
    "txt_attn.norm.key_norm": "attn.norm_added_k",
    "txt_attn.proj": "attn.to_add_out",
    "txt_mlp.0": "ff_context.linear_in",
    "txt_mlp.2": "ff_context.linear_out",
}
_QKV = {
    "img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
    "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
}
_SINGLE = {
    "linear1": "attn.to_qkv_mlp_proj",
    "linear2": "attn.to_out",
    "norm.query_norm": "attn.norm_q",
    "norm.key_norm": "attn.norm_k",
}
_PARAM = re.compile(r"(?P<module>.+)\.(?P<kind>weight|bias|scale)")


def bfl_transformer_rules(names: Iterable[str]) -> dict[str, Rule]:
    """diffusers name -> Rule for every recognised tensor of a BFL transformer file.

    Unrecognised names get no rule, so they surface as 'unexpected' when binding."""
    rules: dict[str, Rule] = {}
    for original in names:
        m = _PARAM.fullmatch(_strip(original))
        if m is None:
            continue
        module, kind = m["module"], "weight" if m["kind"] == "scale" else m["kind"]
        parts = module.split(".")
        if module == "final_layer.adaLN_modulation.1":
            rules[f"norm_out.linear.{kind}"] = Rule(original, SwapHalves())
        elif module in _TOP:
            rules[f"{_TOP[module]}.{kind}"] = Rule(original)
        elif parts[0] == "double_blocks" and len(parts) > 2:
            prefix, inner = f"transformer_blocks.{parts[1]}", ".".join(parts[2:])
            if inner in _QKV:
                for i, target in enumerate(_QKV[inner]):
                    rules[f"{prefix}.{target}.{kind}"] = Rule(original, Chunk(i, 3))
            elif inner in _DOUBLE:
                rules[f"{prefix}.{_DOUBLE[inner]}.{kind}"] = Rule(original)
        elif parts[0] == "single_blocks" and len(parts) > 2:
            inner = ".".join(parts[2:])
            if inner in _SINGLE:
                rules[f"single_transformer_blocks.{parts[1]}.{_SINGLE[inner]}.{kind}"] = Rule(original)
    return rules


# -- LoRA ---------------------------------------------------------------------------------------


def lora_table(source: TensorSource) -> dict[str, tuple[Target, ...]]:
    """The transformer's adaptable modules under both namings LoRA files use: diffusers
    (`transformer_blocks.0.attn.to_q`) and BFL (`double_blocks.0.img_attn.qkv`, whose delta rows
    split in three over to_q / to_k / to_v; `final_layer.adaLN_modulation.1`, whose (shift, scale)
    halves swap like the base weight's). Only 2-D weights of `source` are targets."""
    weights = {n for n in source.names() if n.endswith(".weight") and len(source.info(n).shape) == 2}
    table: dict[str, tuple[Target, ...]] = {n[: -len(".weight")]: (Target(n),) for n in weights}

    def add(name: str, *targets: Target) -> None:
        if targets and all(t.param in weights for t in targets):
            table[name] = targets

    for bfl, diffusers in _TOP.items():
        add(bfl, Target(f"{diffusers}.weight"))
    add("final_layer.adaLN_modulation.1", Target("norm_out.linear.weight", SwapHalves()))
    blocks = lambda pattern: sorted({int(m[1]) for n in weights if (m := re.match(pattern, n))})  # noqa: E731
    for i in blocks(r"transformer_blocks\.(\d+)\."):
        for inner, target in _DOUBLE.items():
            add(f"double_blocks.{i}.{inner}", Target(f"transformer_blocks.{i}.{target}.weight"))
        for inner, qkv in _QKV.items():
            add(
                f"double_blocks.{i}.{inner}",
                *(Target(f"transformer_blocks.{i}.{t}.weight", Chunk(k, 3)) for k, t in enumerate(qkv)),
            )
    for i in blocks(r"single_transformer_blocks\.(\d+)\."):
        for inner, target in _SINGLE.items():
            add(f"single_blocks.{i}.{inner}", Target(f"single_transformer_blocks.{i}.{target}.weight"))
    return table


def merge_transformer_loras(
    transformer: TensorSource, loras: Sequence[LoraSpec | str | Path], *, allow_unmatched: bool = False
) -> TensorSource:
    """The transformer source with `loras` merged into its weights (`dif.lora.merge_loras`)."""
    return merge_loras(
        transformer,
        loras,
        lora_table(transformer),
        family="flux2",
        model="FLUX.2 [klein]",
        allow_unmatched=allow_unmatched,
    )


def text_encoder_lora_table(source: TensorSource) -> dict[str, tuple[Target, ...]]:
    """The Qwen3 text encoder's linears (`model.layers.N.self_attn.q_proj` ... `mlp.down_proj`) as LoRA
    files name them: a Qwen3ForCausalLM's module names (`model.layers.N...`, what diffusers' and PEFT's
    saves of the text encoder hold) and its inner Qwen3Model's (`layers.N...`); kohya's flattened
    `lora_te_model_layers_N_self_attn_q_proj` match either through `dif.lora`'s flattened lookup."""
    return text_encoder_table(source, "model.", ("model.", ""))


def merge_text_encoder_loras(
    text_encoder: TensorSource, loras: Sequence[LoraSpec | str | Path], *, allow_unmatched: bool = False
) -> TensorSource:
    """The text encoder source with the text-encoder adapters of `loras` merged (their denoiser keys are
    unmatched here: `open_checkpoint` applies both parts of a file)."""
    return merge_loras(
        text_encoder, loras, text_encoder_lora_table(text_encoder), family="flux2", model="FLUX.2 [klein]",
        allow_unmatched=allow_unmatched, part="text_encoder",
    )  # fmt: skip


# -- BFL (ldm) VAE names -------------------------------------------------------------------------

_VAE_TOP = {
    "encoder.norm_out": "encoder.conv_norm_out",
    "decoder.norm_out": "decoder.conv_norm_out",
    "encoder.quant_conv": "quant_conv",
    "decoder.post_quant_conv": "post_quant_conv",
}
_VAE_SAME = (
    "encoder.conv_in",
    "encoder.conv_out",
    "decoder.conv_in",
    "decoder.conv_out",
    "quant_conv",
    "post_quant_conv",
)
_ATTN = {"norm": "group_norm", "q": "to_q", "k": "to_k", "v": "to_v", "proj_out": "to_out.0"}
_RESNET_PART = {"norm1": "norm1", "conv1": "conv1", "norm2": "norm2", "conv2": "conv2", "nin_shortcut": "conv_shortcut"}


def bfl_vae_rules(names: Iterable[str]) -> dict[str, Rule]:
    """diffusers name -> Rule for every recognised tensor of an original (ldm-named) FLUX.2 VAE."""
    names = list(names)
    ups = [int(m[1]) for n in names if (m := re.match(r"decoder\.up\.(\d+)\.", _strip(n)))]
    n_up = max(ups) + 1 if ups else 0
    rules: dict[str, Rule] = {}
    for original in names:
        name = _strip(original)
        if name.startswith("bn."):
            rules[name] = Rule(original)
            continue
        m = _PARAM.fullmatch(name)
        if m is None:
            continue
        module, kind = m["module"], m["kind"]
        target = _vae_module(module, n_up)
        if target is None:
            continue
        squeeze = ".attentions.0." in f"{target}." and not target.endswith("group_norm") and kind == "weight"
        rules[f"{target}.{kind}"] = Rule(original, DropUnitAxes() if squeeze else None)
    return rules


def _vae_module(module: str, n_up: int) -> str | None:
    if module in _VAE_TOP:
        return _VAE_TOP[module]
    if module in _VAE_SAME:
        return module
    m = re.fullmatch(r"(encoder|decoder)\.mid\.(block_(\d)|attn_1)\.(\w+)", module)
    if m:
        side, which, idx, part = m[1], m[2], m[3], m[4]
        if which == "attn_1":
            return f"{side}.mid_block.attentions.0.{_ATTN[part]}" if part in _ATTN else None
        return f"{side}.mid_block.resnets.{int(idx) - 1}.{_RESNET_PART[part]}" if part in _RESNET_PART else None
    m = re.fullmatch(r"encoder\.down\.(\d+)\.(block\.(\d+)\.(\w+)|downsample\.conv)", module)
    if m:
        if m[3] is None:
            return f"encoder.down_blocks.{m[1]}.downsamplers.0.conv"
        return f"encoder.down_blocks.{m[1]}.resnets.{m[3]}.{_RESNET_PART[m[4]]}" if m[4] in _RESNET_PART else None
    m = re.fullmatch(r"decoder\.up\.(\d+)\.(block\.(\d+)\.(\w+)|upsample\.conv)", module)
    if m:
        i = n_up - 1 - int(m[1])
        if m[3] is None:
            return f"decoder.up_blocks.{i}.upsamplers.0.conv"
        return f"decoder.up_blocks.{i}.resnets.{m[3]}.{_RESNET_PART[m[4]]}" if m[4] in _RESNET_PART else None
    return None
