"""`dif krea2 ...`: the Krea 2 commands (added to `dif` by plugin.py's register_commands).

    dif krea2 generate -p "a cat" [-m MODEL] [-n NEG] [--steps N] [--guidance G] [--seed S]
                       [-W 1024 -H 1024] [--init-noise F] [--save-latents F] [--backend NAME]
                       [--vram-budget SIZE] [-o out.png] [--json]
    dif krea2 info [MODEL] [--json]
Same options and output conventions as `dif flux2`. Sizes are rounded up to multiples of 16 (with
a warning), as the reference pipeline does. Without --model the embedded tiny checkpoint (random
weights, Turbo) is used, so the whole path runs anywhere in seconds. Progress goes to stderr,
results to stdout (`--json`: one dif-telemetry/1 document). Files are written atomically. Heavy
modules load inside the commands.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from dif.cli_support import DTYPE_CHOICES, VRAM_BUDGET_HELP
from dif_frontend_krea2 import DEFAULT_CHECKPOINT, __version__


def _open(model: Path | None, variant: str | None) -> Any:
    from dif_frontend_krea2.weights import open_checkpoint

    return open_checkpoint(model or DEFAULT_CHECKPOINT, variant=variant)


def _byte_size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from dif.cli_support import parse_byte_size
    from dif.errors import UsageError

    try:
        return None if value is None else parse_byte_size(value)
    except UsageError as exc:
        raise click.BadParameter(str(exc)) from None

@click.group("krea2")
def krea2() -> None:
    """Krea 2 (Raw and Turbo): text-to-image and checkpoint inspection."""


@krea2.command("generate")
@click.option("-p", "--prompt", required=True, help="What to draw.")
@click.option("-n", "--negative-prompt", default="", help="Negative prompt (used when CFG is on, guidance > 0).")
@click.option(
    "-m",
    "--model",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    help="Krea 2 diffusers folder (default: the embedded tiny demo model).",
)
@click.option("--variant", help="Weight variant to load, e.g. fp16 (diffusion_pytorch_model.fp16.safetensors).")
@click.option("--steps", type=click.IntRange(min=1), help="Denoising steps (default: 8 Turbo, 28 Raw).")
@click.option(
    "--guidance", "--cfg-scale", type=click.FloatRange(min=0.0),
    help="CFG scale g, v = cond + g (cond - uncond), on when g > 0 (default: 0 Turbo, 4.5 Raw).",
)
@click.option("--seed", type=click.IntRange(0, 2**32 - 1), help="Noise seed, numpy PCG64 (default: random).")
@click.option("-W", "--width", type=click.IntRange(min=1), help="Width (rounded up to a multiple of 16).")
@click.option("-H", "--height", type=click.IntRange(min=1), help="Height (rounded up to a multiple of 16).")
@click.option(
    "--init-noise",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="Initial noise (safetensors) [1,16,H/8,W/8] or packed [1,N,64]: exact parity with another tool.",
)
@click.option("--save-latents", type=click.Path(dir_okay=False, path_type=Path), help="Also save final latents.")
@click.option("--backend", help="dif backend (default: DIF_BACKEND or the best available; 'interp' = reference).")
@click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default="auto", show_default=True, help="Run precision.")
@click.option("--vram-budget", metavar="SIZE", callback=_byte_size, help=VRAM_BUDGET_HELP)
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="PNG path (default: krea2-SEED.png)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one dif-telemetry/1 JSON document on stdout.")
def generate(model: Path | None, variant: str | None, **options: Any) -> None:
    """Generate one image from a prompt and write it as PNG (A1111 `parameters` + `dif` JSON chunks)."""
    from dif.cli_support import ImageOptions, generate_image
    from dif_frontend_krea2.pipeline import GenerationRequest, Krea2Pipeline, round_size

    opts = ImageOptions.parse("krea2", options)
    if (missing := opts.missing_folder()) is not None:
        raise click.BadParameter(f"folder {missing.resolve().parent} does not exist", param_hint=str(missing))
    checkpoint = _open(model, variant)
    click.echo(generate_image(opts, checkpoint, Krea2Pipeline, GenerationRequest, version=__version__,
                              tool=click.get_current_context().command_path,
                              describe=lambda s: f"{s['model']} ({s['variant']})",
                              size_warnings=lambda request: round_size(request.width, request.height)[2]))


@krea2.command("info")
@click.argument("model", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--variant", help="Weight variant, e.g. fp16.")
@click.option("--json", "as_json", is_flag=True, help="Print one dif-telemetry/1 JSON document on stdout.")
def info(model: Path | None, variant: str | None, as_json: bool) -> None:
    """Describe a Krea 2 checkpoint: variant, configs, tensors, defaults (default: embedded model)."""
    from dif.checkpoint import decoder_summary, native_size, source_summary, storage_dtype
    from dif.cli_support import info_text
    from dif_frontend_krea2.config import TURBO_MU
    from dif_frontend_krea2.pipeline import default_steps_guidance

    ck = _open(model, variant)
    cfgs = ck.configs
    t, q, v = cfgs.transformer, cfgs.text_encoder, cfgs.vae
    steps, guidance = default_steps_guidance(cfgs)
    data = {
        "path": str(ck.root),
        "name": ck.name,
        "variant": ck.variant,
        "distilled": ck.is_distilled,
        "defaults": {
            "steps": steps,
            "guidance": guidance,
            "shift": f"mu {TURBO_MU}" if ck.is_distilled else "resolution-dependent mu",
            "size": native_size(ck.root),
            "dtype": storage_dtype(ck.transformer).value,
        },
        "transformer": {
            "blocks": t.num_layers,
            "heads": t.num_attention_heads,
            "kv_heads": t.num_key_value_heads,
            "head_dim": t.attention_head_dim,
            "width": t.hidden_size,
            "text_fusion": f"{t.num_layerwise_text_blocks} layerwise + {t.num_refiner_text_blocks} refiner",
            **source_summary(ck.transformer),
        },
        "text_encoder": {
            **decoder_summary(q),
            "taps": list(cfgs.pipeline.text_encoder_select_layers),
            "prefix": ck.text_prefix or "(none)",
            **source_summary(ck.text_encoder),
        },
        "vae": {"base_dim": v.base_dim, "dim_mult": list(v.dim_mult), "z_dim": v.z_dim, **source_summary(ck.vae)},
        "tokenizer": str(ck.tokenizer_dir) if ck.tokenizer_dir.is_dir() else None,
    }
    dflt = data["defaults"]
    cfg = "no CFG" if not dflt["guidance"] else f"guidance {dflt['guidance']}"
    click.echo(info_text(data, kind="krea2.info", tool=click.get_current_context().command_path, as_json=as_json,
                         title=f"{data['name']}: Krea 2 {'Turbo (distilled)' if ck.is_distilled else 'Raw'}",
                         defaults=f"{dflt['steps']} steps, {cfg}, {dflt['shift']}, {dflt['size']}x{dflt['size']}, "
                                  f"{dflt['dtype']}"))
