"""`dif sdturbo ...`: the SD-Turbo commands (added to `dif` by plugin.py's register_commands).

    dif sdturbo generate -p "a cat" [-m MODEL] [--fast-vae [--taesd F]] [--steps N] [--guidance G]
                         [--seed S] [-W W -H H] [--init-noise F] [--save-latents F] [--backend NAME]
                         [--unet F] [--vae F] [--text-encoder F] ...
    dif sdturbo info [MODEL | --variant sd-turbo] [--json]
The commands are `dif.kit.commands.image_commands` of `plugin.INFO`, with the same options and
output conventions as `dif flux2` / `dif krea2`; what is SD-Turbo's own is --fast-vae / --taesd and
what `info` shows of a checkpoint. Without --model the embedded tiny checkpoint (random weights,
with a TAESD) is used: 256x256 by default, a second or two on the CPU.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from dif.kit.commands import image_commands
from dif_frontend_sdturbo import DEFAULT_CHECKPOINT
from dif_frontend_sdturbo.plugin import INFO


def _file_option(flag: str, dest: str, what: str) -> Any:
    return click.option(
        flag,
        dest,
        type=click.Path(exists=True, dir_okay=False, path_type=Path),
        help=f"{what} single file (safetensors, diffusers names) replacing the folder's.",
    )


CHECKPOINT_OPTIONS = [
    _file_option("--unet", "unet_file", "UNet"),
    _file_option("--vae", "vae_file", "VAE (AutoencoderKL)"),
    _file_option("--text-encoder", "text_encoder_file", "CLIP text encoder"),
    click.option(
        "--fast-vae",
        is_flag=True,
        help="Decode with TAESD (raw latents, tanh(x/3)*3, output in [0, 1]) instead of the KL VAE: "
        "much faster, slightly softer images.",
    ),
    click.option(
        "--taesd",
        type=click.Path(exists=True, path_type=Path),
        help="TAESD for --fast-vae: a diffusers AutoencoderTiny folder or a safetensors file (diffusers or "
        "madebyollin's taesd_decoder naming); default: the checkpoint's taesd/ folder. SDXL's taesdxl is refused.",
    ),
]


def describe(
    path: Path | None, *, variant: str | None = None, weight_variant: str | None = None
) -> tuple[str, dict[str, Any]]:
    """(title, data) of `info`: a checkpoint (default: the embedded one), or with `variant` the
    architecture of the published SD-Turbo configs (no weights)."""
    from dif.checkpoint import source_summary, storage_dtype
    from dif_frontend_sdturbo.config import load_configs
    from dif_frontend_sdturbo.configs import published
    from dif_frontend_sdturbo.weights import default_taesd, open_checkpoint

    if variant is not None:
        root, ck = published(variant), None
        cfgs, name, dtype = load_configs(root), variant, "f16"
        summaries: dict[str, dict[str, Any]] = {"unet": {}, "text_encoder": {}, "vae": {}}
    else:
        ck = open_checkpoint(path or DEFAULT_CHECKPOINT, variant=weight_variant)
        root, cfgs, name = ck.root, ck.configs, ck.name
        dtype = storage_dtype(ck.unet).value
        summaries = {p: source_summary(getattr(ck, p)) for p in ("unet", "text_encoder", "vae")}
    kind, u, t, v, s = cfgs.kind, cfgs.unet, cfgs.text_encoder, cfgs.vae, cfgs.scheduler
    guidance = INFO.default("guidance", kind)
    size = u.sample_size * v.scale_factor
    taesd = default_taesd(ck) if ck is not None else None
    data = {
        "path": str(root),
        "name": name,
        "variant": kind,
        "turbo": kind == "turbo",
        "defaults": {
            "steps": INFO.default("steps", kind),
            "guidance": guidance,
            "cfg": guidance > 1,
            "sampler": f"euler ({s.timestep_spacing} spacing, {s.beta_schedule} betas; checkpoint: {s.class_name})",
            "size": size,
            "dtype": dtype,
        },
        "unet": {
            "channels": list(u.block_out_channels),
            "heads": list(u.heads),
            "layers_per_block": u.layers_per_block,
            "cross_attention_dim": u.cross_attention_dim,
            "linear_projection": u.use_linear_projection,
            **summaries["unet"],
        },
        "text_encoder": {
            "layers": t.num_hidden_layers,
            "hidden": t.hidden_size,
            "heads": t.num_attention_heads,
            "act": t.hidden_act,
            **summaries["text_encoder"],
        },
        "vae": {
            "channels": list(v.block_out_channels),
            "latent_channels": v.latent_channels,
            "scaling_factor": v.scaling_factor,
            **summaries["vae"],
        },
        "taesd": None if taesd is None else str(taesd),
        "tokenizer": str(ck.tokenizer_dir) if ck is not None and ck.tokenizer_dir.is_dir() else None,
    }
    what = "SD-Turbo (1 step, no CFG)" if kind == "turbo" else "Stable Diffusion (epsilon, Euler + CFG)"
    return f"{name}: {what}", data


sdturbo = image_commands(
    INFO,
    help="SD-Turbo (and SD 1.x / 2.x): text-to-image and checkpoint inspection.",
    model_help="Stable Diffusion diffusers folder or UNet single file (default: the embedded tiny demo model).",
    describe_run=lambda s: f"{s['model']} ({s['variant']}, {s['vae']})",
    checkpoint_options=CHECKPOINT_OPTIONS,
)
