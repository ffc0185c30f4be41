"""`dif krea2 ...`: the Krea 2 commands (added to `dif` by plugin.py's register_commands).

    dif krea2 generate -p "a cat" [-m MODEL] [-n NEG] [--steps N] [--guidance G] [--seed S]
                       [-W 1024 -H 1024] [--init-noise F] [--save-latents F] [--backend NAME] [-o out.png] [--json]
    dif krea2 info [MODEL] [--json]
Same options and output conventions as `dif flux2`. Sizes are rounded up to multiples of 16 (with
a warning), as the reference pipeline does. Without --model the embedded tiny checkpoint (random
weights, Turbo) is used, so the whole path runs anywhere in seconds. Progress goes to stderr,
results to stdout (`--json`: one dif-telemetry/1 document). Files are written atomically. Heavy
modules load inside the commands.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click

from dif_frontend_krea2 import DEFAULT_CHECKPOINT, __version__

DTYPES = ("auto", "f32", "bf16", "f16")


def _open(model: Path | None, variant: str | None) -> Any:
    from dif_frontend_krea2.weights import open_checkpoint

    return open_checkpoint(model or DEFAULT_CHECKPOINT, variant=variant)


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
@click.option("--dtype", type=click.Choice(DTYPES), default="auto", show_default=True, help="Run precision.")
@click.option(
    "-o", "--output", type=click.Path(dir_okay=False, path_type=Path), help="PNG path (default: krea2-SEED.png)."
)
@click.option("--json", "as_json", is_flag=True, help="Print one dif-telemetry/1 JSON document on stdout.")
def generate(
    prompt: str,
    negative_prompt: str,
    model: Path | None,
    variant: str | None,
    steps: int | None,
    guidance: float | None,
    seed: int | None,
    width: int | None,
    height: int | None,
    init_noise: Path | None,
    save_latents: Path | None,
    backend: str | None,
    dtype: str,
    output: Path | None,
    as_json: bool,
) -> None:
    """Generate one image from a prompt and write it as PNG (A1111 `parameters` + `dif` JSON chunks)."""
    from dif.checkpoint import native_size, storage_dtype
    from dif.dtypes import DType
    from dif.noise import load_noise_file, random_seed
    from dif.progress import ProgressBar
    from dif.report import save_image_run, summary_lines
    from dif_frontend_krea2.pipeline import GenerationRequest, Krea2Pipeline, round_size

    started = time.perf_counter()
    seed = random_seed() if seed is None else seed
    output = output or Path(f"krea2-{seed}.png")
    for path in (output, save_latents):
        if path is not None and not path.resolve().parent.is_dir():
            raise click.BadParameter(f"folder {path.resolve().parent} does not exist", param_hint=str(path))
    checkpoint = _open(model, variant)
    size = native_size(checkpoint.root)
    run_dtype = storage_dtype(checkpoint.transformer) if dtype == "auto" else DType(dtype)
    noise = load_noise_file(init_noise) if init_noise is not None else None
    request = GenerationRequest(
        prompt, negative_prompt, steps, guidance, seed, width or size, height or size, init_noise=noise
    )
    with ProgressBar(quiet=as_json) as bar:
        pipe = Krea2Pipeline(checkpoint, dtype=run_dtype, backend=backend, on_step=bar.step)
        for warning in round_size(request.width, request.height)[2] + pipe.resolve(request)[3]:
            click.echo(f"warning: {warning}", err=True)
        result = pipe.generate(request)
    summary, timings = save_image_run(
        result, output, latents=save_latents, frontend="krea2", version=__version__, started=started
    )
    s = result.settings
    if as_json:
        _emit_json("krea2.generate", "dif krea2 generate", summary, timings)
        return
    for line in summary_lines(summary, model=f"{s['model']} ({s['variant']})"):
        click.echo(line)


def _emit_json(kind: str, default_tool: str, data: dict[str, Any], timings: dict[str, float] | None = None) -> None:
    from dif.runstats import stage_events
    from dif.telemetry import build_document, dumps

    ctx = click.get_current_context(silent=True)
    tool = ctx.command_path if ctx is not None else default_tool
    click.echo(dumps(build_document(kind, tool=tool, data=data, events=stage_events(timings or {}))))


@krea2.command("info")
@click.argument("model", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option("--variant", help="Weight variant, e.g. fp16.")
@click.option("--json", "as_json", is_flag=True, help="Print one dif-telemetry/1 JSON document on stdout.")
def info(model: Path | None, variant: str | None, as_json: bool) -> None:
    """Describe a Krea 2 checkpoint: variant, configs, tensors, defaults (default: embedded model)."""
    from dif.checkpoint import component_line, native_size, source_summary, storage_dtype
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
            "layers": q.num_hidden_layers,
            "hidden": q.hidden_size,
            "heads": q.num_attention_heads,
            "kv_heads": q.num_key_value_heads,
            "taps": list(cfgs.pipeline.text_encoder_select_layers),
            "prefix": ck.text_prefix or "(none)",
            **source_summary(ck.text_encoder),
        },
        "vae": {"base_dim": v.base_dim, "dim_mult": list(v.dim_mult), "z_dim": v.z_dim, **source_summary(ck.vae)},
        "tokenizer": str(ck.tokenizer_dir) if ck.tokenizer_dir.is_dir() else None,
    }
    if as_json:
        _emit_json("krea2.info", "dif krea2 info", data)
        return
    kind = "Turbo (distilled)" if ck.is_distilled else "Raw"
    click.echo(f"{data['name']}: Krea 2 {kind}")
    click.echo(f"  path {data['path']}")
    for part in ("transformer", "text_encoder", "vae"):
        click.echo(component_line(part, data[part]))
    dflt = data["defaults"]
    cfg = "no CFG" if not dflt["guidance"] else f"guidance {dflt['guidance']}"
    click.echo(
        f"  defaults: {dflt['steps']} steps, {cfg}, {dflt['shift']}, {dflt['size']}x{dflt['size']}, {dflt['dtype']}"
    )
    click.echo(f"  tokenizer: {data['tokenizer'] or 'missing'}")
