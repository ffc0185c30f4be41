"""Original (LDM / A1111 / Stability) whole-checkpoint single files, e.g. stabilityai's `sd_turbo.safetensors`,
presented under the diffusers names the programs use. Checkpoint access, between the file and `bind_weights`.

One file holds the three models under their original prefixes:
  UNet        `model.diffusion_model.` input_blocks / middle_block / output_blocks (LDM numbering)
  VAE         `first_stage_model.` encoder / decoder (down / up levels numbered bottom-up, 1x1 conv attention)
  OpenCLIP-H  `conditioner.embedders.0.model.` (sgm, SD-Turbo) or `cond_stage_model.model.` (SD 2.x):
              transformer.resblocks.N (fused in_proj -> q / k / v), token_embedding, positional_embedding
The rules are computed from the configs (layers per block, levels), each a `dif.weights.Rule` with the shape
transform it needs (`Chunk` for q/k/v, `DropUnitAxes` for the VAE attention's 1x1 convs), so nothing is read
until a tensor is bound and an error still names the original tensor. Tensors the programs do not read (the
VAE encoder, OpenCLIP's last resblock, projection and logit scale, EMA copies) are ignored by pattern.
"""

from __future__ import annotations

from pathlib import Path

from dif.errors import CheckpointError
from dif.weights import MappedSource, Rule, TensorSource, open_safetensors
from dif.weights.remap import Chunk, DropUnitAxes
from dif_frontend_sdturbo.config import ClipTextConfig, UNetConfig, VaeConfig

UNET = "model.diffusion_model."
VAE = "first_stage_model."
CLIP_PREFIXES = ("conditioner.embedders.0.model.", "cond_stage_model.model.")
RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "time_emb_proj": "emb_layers.1", "norm2": "out_layers.0",
          "conv2": "out_layers.3", "conv_shortcut": "skip_connection"}  # fmt: skip
VAE_RESNET = {"norm1": "norm1", "conv1": "conv1", "norm2": "norm2", "conv2": "conv2", "conv_shortcut": "nin_shortcut"}
VAE_ATTN = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}


def is_ldm_file(source: TensorSource) -> bool:
    return f"{UNET}input_blocks.0.0.weight" in source


def unet_rules(cfg: UNetConfig) -> dict[str, str]:
    """diffusers UNet module prefix -> LDM module prefix (both without the trailing dot)."""
    per = cfg.layers_per_block
    levels = len(cfg.block_out_channels)
    out = {"time_embedding.linear_1": "time_embed.0", "time_embedding.linear_2": "time_embed.2",
           "conv_in": "input_blocks.0.0", "conv_norm_out": "out.0", "conv_out": "out.2",
           "mid_block.resnets.0": "middle_block.0", "mid_block.attentions.0": "middle_block.1",
           "mid_block.resnets.1": "middle_block.2"}  # fmt: skip
    for i in range(levels):
        for j in range(per):
            k = i * (per + 1) + j + 1
            out[f"down_blocks.{i}.resnets.{j}"] = f"input_blocks.{k}.0"
            if cfg.down_cross[i]:
                out[f"down_blocks.{i}.attentions.{j}"] = f"input_blocks.{k}.1"
        if i < levels - 1:
            out[f"down_blocks.{i}.downsamplers.0.conv"] = f"input_blocks.{(i + 1) * (per + 1)}.0.op"
        for j in range(per + 1):
            k = i * (per + 1) + j
            out[f"up_blocks.{i}.resnets.{j}"] = f"output_blocks.{k}.0"
            if cfg.up_cross[i]:
                out[f"up_blocks.{i}.attentions.{j}"] = f"output_blocks.{k}.1"
        if i < levels - 1:
            k = i * (per + 1) + per
            out[f"up_blocks.{i}.upsamplers.0.conv"] = f"output_blocks.{k}.{2 if cfg.up_cross[i] else 1}.conv"
    return out


def _unet_tensor(name: str, modules: dict[str, str]) -> str | None:
    """The LDM tensor name of diffusers UNet tensor `name`, or None when no module rule covers it."""
    for prefix in sorted(modules, key=len, reverse=True):
        if name.startswith(prefix + "."):
            rest = name[len(prefix) + 1 :]
            if ".resnets." in prefix:
                leaf, _, tail = rest.partition(".")
                rest = f"{RESNET.get(leaf, leaf)}.{tail}"
            return f"{UNET}{modules[prefix]}.{rest}"
    return None


def vae_rules(cfg: VaeConfig) -> dict[str, str]:
    """diffusers decoder module prefix -> LDM module prefix (decoder half and post_quant_conv)."""
    levels = len(cfg.block_out_channels)
    out = {"post_quant_conv": "post_quant_conv", "decoder.conv_in": "decoder.conv_in",
           "decoder.conv_norm_out": "decoder.norm_out", "decoder.conv_out": "decoder.conv_out",
           "decoder.mid_block.resnets.0": "decoder.mid.block_1", "decoder.mid_block.resnets.1": "decoder.mid.block_2",
           "decoder.mid_block.attentions.0": "decoder.mid.attn_1"}  # fmt: skip
    for i in range(levels):
        up = levels - 1 - i  # LDM numbers the up levels from the lowest resolution's opposite end
        for j in range(cfg.layers_per_block + 1):
            out[f"decoder.up_blocks.{i}.resnets.{j}"] = f"decoder.up.{up}.block.{j}"
        if i < levels - 1:
            out[f"decoder.up_blocks.{i}.upsamplers.0.conv"] = f"decoder.up.{up}.upsample.conv"
    return out


def _vae_rule(name: str, modules: dict[str, str]) -> Rule | None:
    for prefix in sorted(modules, key=len, reverse=True):
        if name.startswith(prefix + "."):
            rest = name[len(prefix) + 1 :]
            leaf, _, tail = rest.rpartition(".")
            if ".attentions." in prefix:
                conv = tail == "weight" and leaf != "group_norm"  # q / k / v / proj_out are 1x1 convs in LDM
                return Rule(f"{VAE}{modules[prefix]}.{VAE_ATTN[leaf]}.{tail}", DropUnitAxes() if conv else None)
            if ".resnets." in prefix:
                return Rule(f"{VAE}{modules[prefix]}.{VAE_RESNET.get(leaf, leaf)}.{tail}")
            return Rule(f"{VAE}{modules[prefix]}.{rest}")
    return None


def clip_rules(cfg: ClipTextConfig, prefix: str) -> dict[str, Rule]:
    """diffusers CLIPTextModel tensor (`text_model.` naming) -> Rule on the OpenCLIP tensor."""
    out = {"text_model.embeddings.token_embedding.weight": Rule(f"{prefix}token_embedding.weight"),
           "text_model.embeddings.position_embedding.weight": Rule(f"{prefix}positional_embedding"),
           "text_model.final_layer_norm.weight": Rule(f"{prefix}ln_final.weight"),
           "text_model.final_layer_norm.bias": Rule(f"{prefix}ln_final.bias")}  # fmt: skip
    for i in range(cfg.num_hidden_layers):
        d, o = f"text_model.encoder.layers.{i}.", f"{prefix}transformer.resblocks.{i}."
        for leaf in ("weight", "bias"):
            for k, part in enumerate("qkv"):
                out[f"{d}self_attn.{part}_proj.{leaf}"] = Rule(f"{o}attn.in_proj_{leaf}", Chunk(k, 3))
            for dn, on in (("self_attn.out_proj", "attn.out_proj"), ("layer_norm1", "ln_1"), ("layer_norm2", "ln_2"),
                           ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj")):  # fmt: skip
                out[f"{d}{dn}.{leaf}"] = Rule(f"{o}{on}.{leaf}")
    return out


def ldm_names(diffusers_names: list[str], component: str, cfg: UNetConfig | VaeConfig) -> dict[str, Rule]:
    """Rules for every diffusers tensor name of the UNet or the VAE decoder; `CheckpointError` for one
    no rule covers (a config the mapping does not know)."""
    out: dict[str, Rule] = {}
    if component == "unet":
        assert isinstance(cfg, UNetConfig)
        modules = unet_rules(cfg)
        for n in diffusers_names:
            ldm = _unet_tensor(n, modules)
            if ldm is None:
                raise CheckpointError(f"no LDM name for UNet tensor '{n}'")
            out[n] = Rule(ldm)
    else:
        assert isinstance(cfg, VaeConfig)
        vmodules = vae_rules(cfg)
        for n in diffusers_names:
            rule = _vae_rule(n, vmodules)
            if rule is None:
                raise CheckpointError(f"no LDM name for VAE tensor '{n}'")
            out[n] = rule
    return out


def open_ldm_file(
    path: Path, unet_names: list[str], vae_names: list[str], unet: UNetConfig, vae: VaeConfig, text: ClipTextConfig
) -> tuple[TensorSource, TensorSource, TensorSource]:
    """(text encoder, UNet, VAE) sources of an original single file under the diffusers names. `unet_names` /
    `vae_names`: the diffusers tensor names of those models (from the programs' parameters)."""
    base = open_safetensors(path)
    if not is_ldm_file(base):
        raise CheckpointError(
            f"{path}: not an original Stable Diffusion single file (no '{UNET}input_blocks.0.0.weight')"
        )
    prefix = next((p for p in CLIP_PREFIXES if f"{p}token_embedding.weight" in base), None)
    if prefix is None:
        if any(n.startswith("cond_stage_model.transformer.") for n in base.names()):
            raise CheckpointError(
                f"{path}: an SD 1.x single file (OpenAI CLIP-L); dif reads SD 1.x as a diffusers folder",
                hint="convert it with diffusers, or use the diffusers folder",
            )
        raise CheckpointError(f"{path}: no OpenCLIP text tower ('{CLIP_PREFIXES[0]}token_embedding.weight')")
    sources = []
    for label, rules in (
        ("text encoder", clip_rules(text, prefix)),
        ("UNet", ldm_names(unet_names, "unet", unet)),
        ("VAE", ldm_names(vae_names, "vae", vae)),
    ):
        missing = sorted({r.source for r in rules.values() if r.source not in base})
        if missing:
            raise CheckpointError(f"{path}: {label} tensors missing, e.g. '{missing[0]}' ({len(missing)} in all)")
        mapped = MappedSource(base, rules, keep_unmapped=False)
        mapped.label = f"{path} ({label}, original naming)"
        sources.append(mapped)
    return sources[0], sources[1], sources[2]
