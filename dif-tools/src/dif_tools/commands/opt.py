"""`dif opt`: the optimizer's measured searches over a checkpoint's pipeline. `--formats` runs the format search
(`dif.passes.formats_search`): each requested physical format judged capability -> verify -> execute ->
numerical gate -> memory -> time against the baseline run, every verdict recorded, the first accepted chosen."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from dif_tools.output import emit_document, table


def _formats(value: str) -> list[str]:
    return [f.strip() for f in value.split(",") if f.strip()]


@click.command("opt")
@click.argument("checkpoint", required=False, type=click.Path(path_type=Path))
@click.option(
    "--formats",
    "formats",
    required=True,
    help="Comma-separated formats in preference order, e.g. fp8-e4m3,int8,int4-group; fp8-e4m3+attention puts "
    "attention on fp8 too.",
)
@click.option("--backend", "backend_name", default=None, help="Backend name (default: DIF_BACKEND or the best).")
@click.option("--prompt", default="a photograph of a red fox in the snow", show_default=True)
@click.option("--steps", default=4, show_default=True, type=click.IntRange(1, 200))
@click.option("--width", default=None, type=click.IntRange(16, 8192), help="Default: the checkpoint's native size.")
@click.option("--height", default=None, type=click.IntRange(16, 8192))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option(
    "--dtype", default="bf16", show_default=True, type=click.Choice(["bf16", "f16", "f32"]), help="The baseline."
)
@click.option(
    "--cosine-min", default=0.995, show_default=True, type=float, help="Gate: per-step denoiser output cosine."
)
@click.option("--rel-l2-max", default=5e-2, show_default=True, type=float, help="Gate: per-step relative L2.")
@click.option("--psnr-min", default=None, type=float, help="Gate: final image PSNR in dB (default: reported only).")
@click.option(
    "--ssim-min", default=None, type=float, help="Gate: final image 8x8-window SSIM (default: reported only)."
)
@click.option("--no-gate", is_flag=True, help="Skip the numerical gate (a forced format; warns).")
@click.option(
    "--emulate", is_flag=True, help="Judge formats the target lacks matrix units for on a backend that emulates them."
)
@click.option(
    "--stages",
    default="denoise",
    show_default=True,
    help="Pipeline stages whose programs a format converts: comma-separated (encode, denoise, decode) or all.",
)
@click.option(
    "--block-runs",
    default=16,
    show_default=True,
    type=click.IntRange(0),
    help="Runs a format the gate rejects may spend on a per-block candidate (its most sensitive blocks held in "
    "the baseline dtype); 0: none.",
)
@click.option("--vram-budget", default=None, type=click.IntRange(1), help="Bytes the denoiser may hold (memory stage).")
@click.option("--report", "report_path", default=None, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--json", "as_json", is_flag=True, help="Print a dif-telemetry/1 document.")
def opt(
    checkpoint: Path | None,
    formats: str,
    backend_name: str | None,
    prompt: str,
    steps: int,
    width: int | None,
    height: int | None,
    seed: int,
    dtype: str,
    cosine_min: float,
    rel_l2_max: float,
    psnr_min: float | None,
    ssim_min: float | None,
    no_gate: bool,
    emulate: bool,
    stages: str,
    block_runs: int,
    vram_budget: int | None,
    report_path: Path | None,
    as_json: bool,
) -> None:
    """Search the physical formats of CHECKPOINT's linears (default: the embedded FLUX.2 checkpoint): the
    baseline (--dtype) and each format run the same prompt, seed and schedule; the plan's decisions and the
    gate's numbers are printed (--report writes the document to a file as well)."""
    import dif
    from dif.passes.formats_search import pipeline_candidates, search_formats
    from dif.passes.quantize import format_stages
    from dif.quality.format_gate import GateConfig
    from dif.serialize.container import write_atomic
    from dif.telemetry import build_document, dumps, hardware_entry

    scope = format_stages(stages)  # an unknown stage fails here, before any run
    stages = "all" if scope is None else ",".join(scope)

    def load() -> Any:
        return dif.load(checkpoint, backend=backend_name, dtype=dtype).pipeline

    probe = load()
    size = probe.native_size
    w, h = width or size, height or size
    profile_backend = probe.backend_name
    del probe
    from dif.runtime import get_backend

    backend = get_backend(profile_backend)
    profile = backend.profile()
    gate = GateConfig(cosine_min, rel_l2_max, psnr_min, ssim_min)
    run = pipeline_candidates(load, prompt, width=w, height=h, steps=steps, seed=seed, stages=stages)
    result = search_formats(
        _formats(formats),
        profile=profile,
        run=run,
        gate=gate,
        emulate=emulate,
        no_gate=no_gate,
        budget_bytes=vram_budget,
        block_runs=block_runs,
    )
    data = {
        "checkpoint": str(checkpoint) if checkpoint is not None else None,
        "backend": profile.backend,
        "settings": {
            "prompt": prompt,
            "steps": steps,
            "width": w,
            "height": h,
            "seed": seed,
            "dtype": dtype,
            "stages": stages,
            "block_runs": block_runs,
        },
        **result.to_dict(),
    }
    hardware = [hardware_entry(profile.backend, profile=profile)]
    if report_path is not None:
        doc = build_document("opt.formats", tool="dif opt", data=data, hardware=hardware)
        write_atomic(report_path, (dumps(doc) + "\n").encode())
    if as_json:
        emit_document("opt.formats", data, hardware=hardware)
        return
    rows = []
    for c in result.candidates:
        g = c.gate
        gate_cell = "-" if g is None else f"cos {g.worst_cosine:.4f} relL2 {g.worst_rel_l2:.3g}"
        if g is not None:
            gate_cell += f" PSNR {'inf' if g.psnr is None else f'{g.psnr:.1f}'} SSIM {g.ssim:.3f}"
        rows.append([c.label, c.verdict + (" (emulated)" if c.emulated else ""), gate_cell, c.reason[:110]])
    click.echo(table(["format", "verdict", "gate (worst step, image)", "why"], rows))
    click.echo(f"chosen: {result.chosen or 'baseline (' + dtype + ')'}")
    if result.chosen_held:
        click.echo(f"run it with: DIF_FORMAT_KEEP={','.join(result.chosen_held)}")
