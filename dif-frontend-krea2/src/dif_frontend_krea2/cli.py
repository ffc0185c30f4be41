"""`dif krea2 ...`: the Krea 2 commands (added to `dif` by plugin.py's register_commands).

    dif krea2 generate -p "a cat" [-m MODEL] [-n NEG] [--steps N] [--guidance G] [--seed S]
                       [-W W -H H] [--init-noise F] [--save-latents F] [--backend NAME]
                       [--transformer F] [--vae F] [--text-encoder F] [--config-variant raw|turbo]
                       [--lora FILE[:SCALE] ...] [--lora-allow-unmatched] ...
    dif krea2 info [MODEL | --variant raw|turbo] [--json]
The commands are `dif.kit.commands.image_commands` of `plugin.INFO`, with the same options and
output conventions as `dif flux2`; what is Krea 2's own is what `info` shows of a checkpoint.
Sizes are rounded up to the token size (with a warning), as the reference pipeline does. Without
--model the embedded tiny checkpoint (random weights, Turbo) is used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from dif.kit.commands import LORA_OPTIONS, image_commands
from dif_frontend_krea2 import DEFAULT_CHECKPOINT
from dif_frontend_krea2.plugin import INFO


def _file_option(flag: str, dest: str, what: str) -> Any:
    return click.option(
        flag,
        dest,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help=f"{what} single file (safetensors or GGUF, diffusers names) replacing the folder's.",
    )


CHECKPOINT_OPTIONS = [
    _file_option("--transformer", "transformer_file", "Transformer"),
    _file_option("--vae", "vae_file", "VAE"),
    _file_option("--text-encoder", "text_encoder_file", "Qwen3-VL text encoder"),
    click.option(
        "--config-variant",
        type=click.Choice(INFO.variants),
        help="Published configs for single files with no Krea 2 folder (default: turbo; weights cannot tell "
        "Raw from Turbo).",
    ),
    *LORA_OPTIONS,
]


def describe(
    path: Path | None, *, variant: str | None = None, weight_variant: str | None = None
) -> tuple[str, dict[str, Any]]:
    """(title, data) of `info`: a checkpoint (default: the embedded one), or with `variant` the
    architecture of that published variant (configs shipped with the package, no weights)."""
    from dif.checkpoint import decoder_summary, native_size, source_summary, storage_dtype
    from dif_frontend_krea2.config import TURBO_MU, load_configs
    from dif_frontend_krea2.configs import published
    from dif_frontend_krea2.weights import open_checkpoint

    if variant is not None:
        root, ck = published(variant), None
        cfgs, name, dtype, prefix = load_configs(root), f"Krea 2 [{variant}]", "bf16", None
        summaries: dict[str, dict[str, Any]] = {"transformer": {}, "text_encoder": {}, "vae": {}}
    else:
        ck = open_checkpoint(path or DEFAULT_CHECKPOINT, variant=weight_variant)
        root, cfgs, name, prefix = ck.root, ck.configs, ck.name, ck.text_prefix
        dtype = storage_dtype(ck.transformer).value
        summaries = {p: source_summary(getattr(ck, p)) for p in ("transformer", "text_encoder", "vae")}
    distilled, kind = cfgs.pipeline.is_distilled, cfgs.pipeline.variant
    t, q, v = cfgs.transformer, cfgs.text_encoder, cfgs.vae
    guidance = INFO.default("guidance", kind)
    data = {
        "path": str(root),
        "name": name,
        "variant": kind,
        "distilled": distilled,
        "defaults": {
            "steps": INFO.default("steps", kind),
            "guidance": guidance,
            "cfg": guidance > 0,
            "shift": f"mu {TURBO_MU}" if distilled else "resolution-dependent mu",
            "size": native_size(root, multiple=cfgs.pixels_per_token),
            "dtype": dtype,
        },
        "transformer": {
            "blocks": t.num_layers,
            "heads": t.num_attention_heads,
            "kv_heads": t.num_key_value_heads,
            "head_dim": t.attention_head_dim,
            "width": t.hidden_size,
            "text_fusion": f"{t.num_layerwise_text_blocks} layerwise + {t.num_refiner_text_blocks} refiner",
            **summaries["transformer"],
        },
        "text_encoder": {
            **decoder_summary(q),
            "taps": list(cfgs.pipeline.text_encoder_select_layers),
            **({} if prefix is None else {"prefix": prefix or "(none)"}),
            **summaries["text_encoder"],
        },
        "vae": {
            "base_dim": v.base_dim,
            "dim_mult": list(v.dim_mult),
            "z_dim": v.z_dim,
            "pixels_per_token": cfgs.pixels_per_token,
            **summaries["vae"],
        },
        "tokenizer": str(ck.tokenizer_dir) if ck is not None and ck.tokenizer_dir.is_dir() else None,
    }
    return f"{name}: Krea 2 {'Turbo (distilled)' if distilled else 'Raw'}", data


krea2 = image_commands(
    INFO,
    help="Krea 2 (Raw and Turbo): text-to-image and checkpoint inspection.",
    model_help="Krea 2 diffusers folder or transformer single file (default: the embedded tiny demo model).",
    describe_run=lambda s: f"{s['model']} ({s['variant']})",
    checkpoint_options=CHECKPOINT_OPTIONS,
)
