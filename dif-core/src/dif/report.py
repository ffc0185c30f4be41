"""What a finished text-to-image run leaves behind: the PNG (with its `parameters` text), optionally
the latents, the summary document and the lines printed for people.

Where it sits: the end of a frontend's `generate` command, after the pipeline returned. Every
function reads the settings dict that image pipelines build with `image_settings`.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from attrs import frozen

from dif.media.image_file import write_image
from dif.media.png import format_parameters
from dif.runstats import StageTimer


@frozen(eq=False)
class ImageRun:
    """What an image pipeline's `generate` returns: the image plus what is needed to report and
    reproduce it."""

    pixels: np.ndarray  # (H, W, 3) uint8
    latents: np.ndarray  # final packed latents (1, N, C), run dtype
    noise: np.ndarray  # initial packed latents (1, N, C), run dtype
    settings: dict[str, Any]  # `image_settings`
    timings: dict[str, float]  # seconds per stage
    warnings: tuple[str, ...]
    peak_rss_bytes: int
    plan_peak_bytes: int


def save_image_run(
    run: ImageRun, output: Path, *, latents: Path | None, frontend: str, version: str, started: float
) -> tuple[dict[str, Any], dict[str, float]]:
    """Write `output` in the format its extension names (`dif.media.image_file`: PNG, JPEG or WebP, each
    with `png_parameters` + the settings as JSON, generator "dif-frontend-{frontend} {version}") and,
    when `latents` is given, a plain safetensors file with the final `latents` and the initial `noise`
    (reload the latter with `--init-noise`).

    Returns (the `generation_summary`, stage timings in seconds with "save" added); `started` is
    the command's `time.perf_counter()` at its start."""
    from dif.serialize.diftensor import save_tensors

    s = run.settings
    timer = StageTimer(timings=dict(run.timings))
    with timer.stage("save"):
        metadata = {**s, "generator": f"dif-frontend-{frontend} {version}", "frontend": frontend}
        write_image(output, run.pixels, parameters=png_parameters(s, version=f"dif {version}"), metadata=metadata)
        if latents is not None:
            saved = {"latents": run.latents, "noise": run.noise}
            save_tensors(latents, saved, {"format": "pt"}, dif_metadata=False)
    summary = generation_summary(
        output=output,
        latents=latents,
        settings=s,
        warnings=run.warnings,
        timings=timer.timings,
        total_s=time.perf_counter() - started,
        peak_rss_bytes=run.peak_rss_bytes,
        plan_peak_bytes=run.plan_peak_bytes,
    )
    return summary, timer.timings


def image_settings(
    *,
    prompt: str,
    negative_prompt: str,
    steps: int,
    guidance: float,
    cfg: bool,
    seed: int,
    init_noise: bool,
    width: int,
    height: int,
    dtype: str,
    mu: float | None,
    model: str,
    backend: str,
    sampler: str = "euler",
    scheduler: str = "simple",
    rng: str = "numpy",
    **extra: Any,
) -> dict[str, Any]:
    """The settings of a flow-match text-to-image run, as the PNG's JSON chunk and the summary record
    them: the negative prompt only when CFG used it, the seed and its generator `rng` only when they
    made the noise (None when the noise came from a file), mu None under a static shift, the sampler
    and sigma schedule by their `--sampling-method` / `--scheduler` names; `extra` holds the frontend's
    own keys (variant, layout, ...)."""
    return {
        "prompt": prompt,
        "negative_prompt": negative_prompt if cfg else "",
        "steps": steps,
        "guidance": guidance,
        "cfg": cfg,
        "seed": None if init_noise else seed,
        "init_noise": init_noise,
        "width": width,
        "height": height,
        "dtype": dtype,
        "mu": mu,
        "sampler": sampler,
        "scheduler": scheduler,
        "rng": None if init_noise else rng,
        "model": model,
        "backend": backend,
        **extra,
    }


A1111_SAMPLERS = {"euler": "Euler", "heun": "Heun", "dpm++2m": "DPM++ 2M"}
A1111_SCHEDULES = {"simple": "Simple", "karras": "Karras", "exponential": "Exponential", "beta": "Beta"}
A1111_RNGS = {"numpy": "NumPy PCG64", "torch-cpu": "CPU", "torch-cuda": "GPU"}  # A1111's "RNG" values


def png_parameters(settings: Mapping[str, Any], *, version: str) -> str:
    """The A1111 `parameters` text of a flow-match run (`version`: e.g. "dif 0.1.0"): A1111's sampler,
    schedule-type and RNG labels, none with a comma (parsers split the line on ", "); mu, when the
    schedule was shifted by it, as its own "Shift mu" pair."""
    s = settings
    mu = s.get("mu")
    sampler = s.get("sampler", "euler")
    scheduler = s.get("scheduler", "simple")
    rng = s.get("rng")
    return format_parameters(
        s["prompt"],
        s["negative_prompt"] or None,
        {
            "Steps": s["steps"],
            "Sampler": A1111_SAMPLERS.get(sampler, sampler),
            "Schedule type": A1111_SCHEDULES.get(scheduler, scheduler),
            "Shift mu": None if mu is None else f"{mu:.4f}",
            "CFG scale": s["guidance"],
            "Seed": s["seed"],
            "Size": f"{s['width']}x{s['height']}",
            "Model": s["model"],
            "RNG": None if rng is None else A1111_RNGS.get(rng, rng),
            "Version": version,
        },
    )


def generation_summary(
    *,
    output: Path,
    latents: Path | None,
    settings: Mapping[str, Any],
    warnings: Sequence[str],
    timings: Mapping[str, float],
    total_s: float,
    peak_rss_bytes: int,
    plan_peak_bytes: int,
) -> dict[str, Any]:
    """The `data` of a `*.generate` telemetry document; `timings` in seconds, with a "denoise" stage."""
    denoise = timings.get("denoise", 0.0)
    return {
        "output": str(output),
        "latents": str(latents) if latents is not None else None,
        "settings": dict(settings),
        "warnings": list(warnings),
        "timings_s": {k: round(v, 4) for k, v in timings.items()},
        "total_s": round(total_s, 4),
        "steps_per_s": round(settings["steps"] / denoise, 4) if denoise > 0 else None,
        "peak_rss_bytes": peak_rss_bytes,
        "plan_peak_bytes": plan_peak_bytes,
    }


def summary_lines(summary: Mapping[str, Any], *, model: str) -> list[str]:
    """Human lines of a `generation_summary`: what was written, the stage times, where it ran and
    the peak memory; `model` describes the checkpoint (e.g. "name (diffusers, distilled)")."""
    s, t = summary["settings"], summary["timings_s"]
    cfg = f"CFG {s['guidance']}" if s["cfg"] else "no CFG"
    if (parallel := s.get("parallel")) is not None:  # dif.parallel.cfg.CfgParallel.record()
        cfg += f" on {parallel['degree']} ranks"
    noise = "init noise from file" if s["init_noise"] else f"seed {s['seed']}"
    if not s["init_noise"] and s.get("rng", "numpy") != "numpy":
        noise += f" ({s['rng']})"
    sampling = [s[k] for k, plain in (("sampler", "euler"), ("scheduler", "simple")) if s.get(k, plain) != plain]
    steps = f"{s['steps']} steps" + (f" {' '.join(sampling)}" if sampling else "")
    rate = summary["steps_per_s"]
    speed = "" if rate is None else (f" ({rate:.2f} it/s)" if rate >= 1 else f" ({1 / rate:.2f} s/it)")
    stages = " | ".join(f"{k} {v:.2f} s{speed if k == 'denoise' else ''}" for k, v in t.items())
    lines = [
        f"wrote {summary['output']}  ({s['width']}x{s['height']}, {steps}, {cfg}, {noise})",
        f"  {stages} | total {summary['total_s']:.2f} s",
        f"  model {model}, {s['dtype']} on {s['backend']}; peak memory: process "
        f"{summary['peak_rss_bytes'] / 2**20:.0f} MiB, largest plan {summary['plan_peak_bytes'] / 2**20:.1f} MiB",
    ]
    if summary["latents"]:
        lines.append(f"  latents -> {summary['latents']}")
    return lines
