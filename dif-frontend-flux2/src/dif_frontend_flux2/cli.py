"""`dif flux2 ...`: the FLUX.2 [klein] commands (added to `dif` by plugin.py's register_commands).

    dif flux2 generate -p "a cat" [-m MODEL] [-n NEG] [--steps N] [--guidance G] [--seed S]
                       [-W 1024 -H 1024] [--init-noise F] [--save-latents F] [--backend NAME]
                       [--vram-budget SIZE] [-o out.png] [--json]
    dif flux2 info [MODEL] [--json]
Without --model the embedded tiny checkpoint (random weights) is used, so the whole path runs
anywhere in seconds. Progress goes to stderr, results to stdout (`--json`: one dif-telemetry/1
document). Files are written atomically. Heavy modules load inside the commands.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import click

from dif.cli_support import DTYPE_CHOICES, VRAM_BUDGET_HELP
from dif_frontend_flux2 import DEFAULT_CHECKPOINT, __version__


def _check_multiple_of_16(ctx: click.Context, param: click.Parameter, value: int | None) -> int | None:
    if value is not None and (value <= 0 or value % 16):
        lo = max(16, value // 16 * 16)
        raise click.BadParameter(f"{value} is not a positive multiple of 16 (FLUX.2 uses 16x16-pixel tokens; try {lo})")
    return value


def _model_options(fn: Any) -> Any:
    for option in reversed(
        [
            click.option(
                "-m",
                "--model",
                type=click.Path(exists=True, path_type=Path),
                help="Diffusers folder or BFL transformer .safetensors (default: the embedded tiny demo model).",
            ),
            click.option(
                "--base",
                type=click.Path(exists=True, file_okay=False, path_type=Path),
                help="Diffusers folder supplying text encoder, VAE, tokenizer when --model is a single file.",
            ),
            click.option(
                "--transformer",
                "transformer_file",
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                help="Transformer single file (BFL or diffusers names) replacing the folder's.",
            ),
            click.option(
                "--vae",
                "vae_file",
                type=click.Path(exists=True, dir_okay=False, path_type=Path),
                help="VAE single file (BFL or diffusers names) replacing the folder's.",
            ),
            click.option(
                "--variant", help="Weight variant to load, e.g. fp16 (diffusion_pytorch_model.fp16.safetensors)."
            ),
        ]
    ):
        fn = option(fn)
    return fn


def _open(
    model: Path | None, base: Path | None, transformer_file: Path | None, vae_file: Path | None, variant: str | None
) -> Any:
    from dif_frontend_flux2.weights import open_checkpoint

    return open_checkpoint(
        model or DEFAULT_CHECKPOINT, variant=variant, base=base, transformer_file=transformer_file, vae_file=vae_file
    )


def _byte_size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from dif.cli_support import parse_byte_size
    from dif.errors import UsageError

    try:
        return None if value is None else parse_byte_size(value)
    except UsageError as exc:
        raise click.BadParameter(str(exc)) from None

@click.group("flux2")
def flux2() -> None:
    """FLUX.2 [klein] (4B/9B, base and distilled): text-to-image and checkpoint inspection."""


@flux2.command("generate")
@click.option("-p", "--prompt", required=True, help="What to draw.")
@click.option("-n", "--negative-prompt", default="", help="Negative prompt (base models with CFG only).")
@_model_options
@click.option("--steps", type=click.IntRange(min=1), help="Denoising steps (default: 4 distilled, 50 base).")
@click.option("--guidance", "--cfg-scale", type=click.FloatRange(min=0.0), help="CFG scale (base; default 4.0).")
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), help="Noise seed, numpy PCG64 (default: random).")
@click.option("-W", "--width", type=int, callback=_check_multiple_of_16, help="Width, multiple of 16.")
@click.option("-H", "--height", type=int, callback=_check_multiple_of_16, help="Height, multiple of 16.")
@click.option(
    "--init-noise",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Initial noise (safetensors) [1,128,H/16,W/16] or packed [1,N,128]: exact parity with another tool.",
)
@click.option("--save-latents", type=click.Path(dir_okay=False, path_type=Path), help="Also save final latents.")
@click.option("--backend", help="dif backend (default: DIF_BACKEND or the best available; 'interp' = reference).")
@click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default="auto", show_default=True, help="Run precision.")
@click.option("--vram-budget", metavar="SIZE", callback=_byte_size, help=VRAM_BUDGET_HELP)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="PNG path (default: flux2-SEED.png)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one dif-telemetry/1 JSON document on stdout.")
def generate(
    model: Path | None,
    base: Path | None,
    transformer_file: Path | None,
    vae_file: Path | None,
    variant: str | None,
    **options: Any,
) -> None:
    """Generate one image from a prompt and write it as PNG (A1111 `parameters` + `dif` JSON chunks)."""
    from dif.cli_support import ImageOptions, generate_image
    from dif_frontend_flux2.pipeline import Flux2Pipeline, GenerationRequest

    opts = ImageOptions.parse("flux2", options)
    if (missing := opts.missing_folder()) is not None:
        raise click.BadParameter(f"folder {missing.resolve().parent} does not exist", param_hint=str(missing))
    checkpoint = _open(model, base, transformer_file, vae_file, variant)

    def describe(s: Mapping[str, Any]) -> str:
        return f"{s['model']} ({s['layout']}, {'distilled' if s['distilled'] else 'base'})"

    tool = click.get_current_context().command_path
    text = generate_image(
        opts,
        checkpoint,
        Flux2Pipeline,
        GenerationRequest,
        version=__version__,
        tool=tool,
        describe=describe,
        auto_dtype="first",
    )
    click.echo(text)


@flux2.command("info")
@click.argument("model", required=False, type=click.Path(exists=True, path_type=Path))
@click.option("--variant", help="Weight variant, e.g. fp16.")
@click.option("--json", "as_json", is_flag=True, help="Print one dif-telemetry/1 JSON document on stdout.")
def info(model: Path | None, variant: str | None, as_json: bool) -> None:
    """Describe a FLUX.2 [klein] checkpoint: layout, configs, tensors, defaults (default: embedded model)."""
    from dif.checkpoint import decoder_summary, native_size, source_summary, storage_dtype
    from dif.cli_support import info_text
    from dif_frontend_flux2.pipeline import BASE_GUIDANCE, BASE_STEPS, DISTILLED_STEPS

    ck = _open(model, None, None, None, variant)
    t, q, v = ck.configs.transformer, ck.configs.text_encoder, ck.configs.vae
    data = {
        "path": str(ck.root),
        "name": ck.name,
        "layout": ck.layout,
        "distilled": ck.is_distilled,
        "defaults": {
            "steps": DISTILLED_STEPS if ck.is_distilled else BASE_STEPS,
            "guidance": None if ck.is_distilled else BASE_GUIDANCE,
            "size": native_size(ck.root),
            "dtype": storage_dtype(ck.transformer, by="first").value,
        },
        "transformer": {
            "double_blocks": t.num_layers,
            "single_blocks": t.num_single_layers,
            "heads": t.num_attention_heads,
            "head_dim": t.attention_head_dim,
            "width": t.inner_dim,
            "text_dim": t.joint_attention_dim,
            **source_summary(ck.transformer),
        },
        "text_encoder": {**decoder_summary(q), "vocab": q.vocab_size, **source_summary(ck.text_encoder)},
        "vae": {"channels": list(v.block_out_channels), "latent_channels": v.latent_channels, **source_summary(ck.vae)},
        "tokenizer": str(ck.tokenizer_dir) if ck.tokenizer_dir.is_dir() else None,
    }
    dflt = data["defaults"]
    guidance = "no CFG" if dflt["guidance"] is None else f"guidance {dflt['guidance']}"
    click.echo(
        info_text(
            data,
            kind="flux2.info",
            tool=click.get_current_context().command_path,
            as_json=as_json,
            title=f"{data['name']}: FLUX.2 [klein] {'distilled' if ck.is_distilled else 'base'}, {ck.layout} layout",
            defaults=f"{dflt['steps']} steps, {guidance}, {dflt['size']}x{dflt['size']}, {dflt['dtype']}",
        )
    )
