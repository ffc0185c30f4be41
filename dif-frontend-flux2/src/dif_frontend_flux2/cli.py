"""`dif flux2 ...`: the FLUX.2 [klein] commands (added to `dif` by plugin.py's register_commands).

    dif flux2 generate -p "a cat" [-m MODEL] [--base DIR] [--transformer F] [--vae F] [--text-encoder F]
                       [--config-variant V] [-n NEG]
                       [--steps N] [--guidance G] [--seed S] [-W W -H H] [--init-noise F]
                       [--lora FILE[:SCALE] ...] [--lora-allow-unmatched] ...
    dif flux2 info [MODEL | --variant klein-9b] [--json]
The commands are `dif.kit.commands.image_commands` of `plugin.INFO`; what is FLUX.2's own is the
options that place a single-file checkpoint's parts and what `info` shows of one. Without --model
the embedded tiny checkpoint (random weights) is used, so the whole path runs anywhere in seconds.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from dif.kit.commands import LORA_OPTIONS, image_commands
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_frontend_flux2.plugin import INFO

CHECKPOINT_OPTIONS = [
    click.option(
        "--base",
        type=click.Path(exists=True, file_okay=False, path_type=Path),
        help="Diffusers folder supplying text encoder, VAE, tokenizer when --model is a single file.",
    ),
    click.option(
        "--transformer",
        "transformer_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Transformer single file (BFL or diffusers names, safetensors or GGUF) replacing the folder's.",
    ),
    click.option(
        "--vae",
        "vae_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="VAE single file (BFL or diffusers names, safetensors or GGUF) replacing the folder's.",
    ),
    click.option(
        "--text-encoder",
        "text_encoder_file",
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help="Qwen3 text encoder single file (safetensors, or llama.cpp GGUF) replacing the folder's.",
    ),
    click.option(
        "--config-variant",
        type=click.Choice(INFO.variants),
        help="Published configs for single files with no diffusers folder (default: inferred from the "
        "transformer's shapes, distilled; weights cannot tell base from distilled).",
    ),
    click.option(
        "--vae-tiling",
        type=click.Choice(["auto", "on", "off"]),
        default="auto",
        show_default=True,
        help="Decode the image tile by tile (diffusers' tiled decode: tiles of the VAE's sample_size, a quarter "
        "overlapped and blended): 'auto' when the whole decode does not fit the memory budget.",
    ),
    *LORA_OPTIONS,
]


def _run_model(s: Mapping[str, Any]) -> str:
    return f"{s['model']} ({s['layout']}, {'distilled' if s['distilled'] else 'base'})"


def describe(
    path: Path | None, *, variant: str | None = None, weight_variant: str | None = None
) -> tuple[str, dict[str, Any]]:
    """(title, data) of `info`: a checkpoint (default: the embedded one), or with `variant` the
    architecture of that published variant (configs shipped with the package, no weights)."""
    from dif.checkpoint import decoder_summary, native_size, source_summary, storage_dtype
    from dif_frontend_flux2.config import load_configs
    from dif_frontend_flux2.configs import published
    from dif_frontend_flux2.weights import open_checkpoint

    if variant is not None:
        root, ck = published(variant), None
        cfgs, name, layout, dtype = load_configs(root), f"FLUX.2 [{variant}]", "published config", "bf16"
        summaries: dict[str, dict[str, Any]] = {"transformer": {}, "text_encoder": {}, "vae": {}}
    else:
        ck = open_checkpoint(path or DEFAULT_CHECKPOINT, variant=weight_variant)
        root, cfgs, name, layout = ck.root, ck.configs, ck.name, ck.layout
        dtype = storage_dtype(ck.transformer, by="first").value
        summaries = {p: source_summary(getattr(ck, p)) for p in ("transformer", "text_encoder", "vae")}
    distilled = cfgs.pipeline.is_distilled
    kind = "distilled" if distilled else "base"
    t, q, v = cfgs.transformer, cfgs.text_encoder, cfgs.vae
    guidance = INFO.default("guidance", kind)
    data = {
        "path": str(root),
        "name": name,
        "layout": layout,
        "distilled": distilled,
        "kv_cache": cfgs.pipeline.kv_cache,  # a klein KV checkpoint: reference keys/values computed once by default
        "defaults": {
            "steps": INFO.default("steps", kind),
            "guidance": guidance,
            "cfg": not distilled and guidance > 1.0,
            "size": native_size(root, multiple=cfgs.pixels_per_token),
            "dtype": dtype,
        },
        "transformer": {
            "double_blocks": t.num_layers,
            "single_blocks": t.num_single_layers,
            "heads": t.num_attention_heads,
            "head_dim": t.attention_head_dim,
            "width": t.inner_dim,
            "text_dim": t.joint_attention_dim,
            **summaries["transformer"],
        },
        "text_encoder": {**decoder_summary(q), "vocab": q.vocab_size, **summaries["text_encoder"]},
        "vae": {
            "channels": list(v.block_out_channels),
            "latent_channels": v.latent_channels,
            "pixels_per_token": cfgs.pixels_per_token,
            **summaries["vae"],
        },
        "tokenizer": str(ck.tokenizer_dir) if ck is not None and ck.tokenizer_dir.is_dir() else None,
    }
    return f"{name}: FLUX.2 [klein] {kind}, {layout} layout", data


flux2 = image_commands(
    INFO,
    help="FLUX.2 [klein] (4B/9B, base and distilled): text-to-image and checkpoint inspection.",
    model_help="Diffusers folder, or a transformer single file (.safetensors / .gguf; with no folder beside it, "
    "also --text-encoder and --vae) (default: the embedded tiny demo model).",
    describe_run=_run_model,
    checkpoint_options=CHECKPOINT_OPTIONS,
)
