"""`dif h3 ...`: the MiniMax-H3 commands (added to `dif` by plugin.py's register_commands).

    dif h3 generate -p "a cat" [-o out.mp4] [-m MODEL] [--frames 17n+5] [-W W -H H] [--steps N] [--seed S]
                    [--rng numpy|torch-cpu|torch-cuda] [--first-frame IMG] [--last-frame IMG]
                    [--backend NAME] [--dtype D] [--vram-budget SIZE] [--save-latents F] [--latents-only] [--json]
    dif h3 info [MODEL | --variant h3] [--json]
Settings are `plugin.INFO`'s; a setting not given takes the checkpoint's `dif_defaults` (the embedded tiny
model: a small canvas) or the published defaults (124 frames, 1344x768, 50 grid points). Every request is
checked before anything loads beyond configs and the tokenizer: frames 17n + 5, sizes multiples of 32,
fps 24, both VAEs present, a writable .mp4 path; a refused request writes nothing. Without --model the
embedded tiny checkpoint (random weights) is used.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import click
from attrs import evolve

from dif.cli_support import DTYPE_CHOICES, VRAM_BUDGET_HELP, telemetry_text, unwritable_reason
from dif.errors import UsageError
from dif.kit.commands import setting_option
from dif_frontend_h3 import DEFAULT_CHECKPOINT
from dif_frontend_h3.config import FPS
from dif_frontend_h3.plugin import INFO, PUBLISHED_DEFAULTS


def _byte_size(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    from dif.cli_support import parse_byte_size

    try:
        return None if value is None else parse_byte_size(value)
    except UsageError as exc:
        raise click.BadParameter(str(exc)) from None


def checkpoint_defaults(root: Path) -> dict[str, Any]:
    """The published defaults updated with the checkpoint's own `dif_defaults` (model_index.json)."""
    from dif_frontend_h3.config import read_json

    own = read_json(root / "model_index.json").get("dif_defaults") or {}
    return {**PUBLISHED_DEFAULTS, **{k: v for k, v in own.items() if k in PUBLISHED_DEFAULTS}}


@click.group("h3", help="MiniMax-H3: text to video with sound (MP4), and checkpoint inspection.")
def h3() -> None:
    pass


def _settings(root: Path, given: dict[str, Any]) -> dict[str, Any]:
    settings = INFO.resolve_settings(given)
    defaults = checkpoint_defaults(root)
    return {k: (defaults[k] if v is None and k in defaults else v) for k, v in settings.items()}


def _apply(fn: Any, decorators: list[Any]) -> Any:
    for decorator in reversed(decorators):
        fn = decorator(fn)
    return fn


OPTIONS = [
    click.option("-p", "--prompt", required=True, help="What to film (and hear), verbatim: no template is applied."),
    click.option("-m", "--model", type=click.Path(exists=True, file_okay=False, path_type=Path),
                 help="MiniMax-H3 diffusers folder (default: the embedded tiny demo model)."),
    click.option("--weight-variant", help="Weight files to load, e.g. fp16."),
    *(setting_option(spec) for spec in INFO.settings),
    click.option("--first-frame", type=click.Path(dir_okay=False, path_type=Path),
                 help="fl2va: an image at the video's size the video starts from (through the video VAE encoder)."),
    click.option("--last-frame", type=click.Path(dir_okay=False, path_type=Path),
                 help="fl2va: an image at the video's size the video ends on."),
    click.option("--fps", type=int, default=FPS, show_default=True, help="Frame rate: MiniMax-H3 is fixed at 24."),
    click.option("--backend", help="dif backend (default: DIF_BACKEND or the best available; 'interp' = reference)."),
    click.option("--dtype", type=click.Choice(DTYPE_CHOICES), default="auto", show_default=True,
                 help="Run precision (auto: the DiT's storage dtype)."),
    click.option("--vram-budget", metavar="SIZE", callback=_byte_size, help=VRAM_BUDGET_HELP),
    click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
                 help="MP4 path (default: h3-SEED.mp4)."),
    click.option("--save-latents", type=click.Path(dir_okay=False, path_type=Path),
                 help="Also save the final video and audio latents and the initial noise (safetensors)."),
    click.option("--latents-only", is_flag=True, help="Stop after sampling (needs --save-latents): no VAE, no MP4."),
    click.option("--json", "as_json", is_flag=True, help="Print one dif-telemetry/1 JSON document on stdout."),
]  # fmt: skip


def _keyframes(first: Path | None, last: Path | None) -> tuple[Any, ...]:
    """The keyframes given, decoded before anything loads (RGB uint8), first before last (packed order)."""
    import numpy as np

    from dif.media.image_input import read_image
    from dif_frontend_h3.pipeline import Keyframe

    out = []
    for anchor, path in (("first", first), ("last", last)):
        if path is not None:
            img = read_image(path, what=f"--{anchor}-frame").image.convert("RGB")
            out.append(Keyframe(anchor, np.asarray(img, dtype=np.uint8), f"--{anchor}-frame {path}"))
    return tuple(out)


def generate(
    prompt: str, model: Path | None, weight_variant: str | None, first_frame: Path | None,
    last_frame: Path | None, fps: int, backend: str | None, dtype: str,
    vram_budget: int | None, output: Path | None, save_latents: Path | None, latents_only: bool, as_json: bool,
    **given: Any,
) -> None:  # fmt: skip
    """Generate a video with its soundtrack from a prompt and write it as MP4 (H.264 + AAC, metadata inside)."""
    from dif.noise import random_seed
    from dif.progress import ProgressBar
    from dif_frontend_h3.pipeline import VideoRequest

    started = time.perf_counter()
    root = model or DEFAULT_CHECKPOINT
    if fps != FPS:
        raise click.BadParameter(f"MiniMax-H3 generates at {FPS} fps only, got {fps}", param_hint="--fps")
    if latents_only and save_latents is None:
        raise click.BadParameter("--latents-only writes nothing without --save-latents", param_hint="--latents-only")
    keyframes = _keyframes(first_frame, last_frame)
    settings = _settings(root, given)
    seed = settings["seed"] if settings["seed"] not in (None, -1) else random_seed()
    out = output or Path(f"h3-{seed}.mp4")
    for path, flag in ((None if latents_only else out, "--output"), (save_latents, "--save-latents")):
        if path is None:
            continue
        if flag == "--output" and path.suffix.lower() != ".mp4":
            raise click.BadParameter(f"{path}: the output is an MP4 file (.mp4)", param_hint=flag)
        if not path.parent.is_dir():
            raise click.BadParameter(f"folder {path.resolve().parent} does not exist", param_hint=flag)
        if (why := unwritable_reason(path)) is not None:
            raise click.BadParameter(why, param_hint=flag)
    assert INFO.pipeline is not None
    pipe = INFO.pipeline(root, dtype=dtype, backend=backend, vram_budget=vram_budget, weight_variant=weight_variant)
    req = VideoRequest(prompt, settings["frames"], settings["width"], settings["height"], settings["steps"], seed,
                       keyframes=keyframes, rng=settings["rng"])  # fmt: skip
    layout = pipe.check(req, decode=not latents_only)  # every refusal before any program is built
    tty = sys.stderr.isatty() and not as_json
    with ProgressBar(quiet=as_json) as bar:
        pipe.on_step = lambda done, total, *_: bar.step(done, total)
        if tty:
            pipe.on_tile = lambda done, total: print(f"\rdecode tile {done}/{total}", end="", file=sys.stderr,
                                                     flush=True)  # fmt: skip
        noise = pipe.initial_noise(req, layout)  # drawn again inside from the same seed: the same values
        req = evolve(req, video_noise=noise.video, audio_noise=noise.audio)
        result = pipe.generate(req, decode=not latents_only)
    if tty and not latents_only:
        print(file=sys.stderr)
    run = {**result.settings, "version": INFO.revision}
    written: dict[str, str] = {}
    if save_latents is not None:
        from dif.serialize.diftensor import save_tensors

        tensors = {"video_latents": result.video_latents, "audio_latents": result.audio_latents,
                   "video_noise": noise.video, "audio_noise": noise.audio}  # fmt: skip
        save_tensors(save_latents, tensors, dif_metadata=False)
        written["latents"] = str(save_latents)
    if not latents_only:
        pipe.save_mp4(result, out, version=INFO.revision)
        written["output"] = str(out)
    timings = {**result.timings, "total": time.perf_counter() - started}
    summary = {
        **run,
        **written,
        "timings_s": {k: round(v, 3) for k, v in timings.items()},
        "memory": pipe.memory_report(),
    }
    if as_json:
        click.echo(telemetry_text("h3.generate", click.get_current_context().command_path, summary, result.timings))
        return
    for what, where in written.items():
        click.echo(f"wrote {where}" + ("" if what == "latents" else f"  (seed {seed})"))
    click.echo(f"  {run['model']}: {req.frames} frames {req.width}x{req.height} @ {FPS} fps, {req.steps} grid points, "
               f"{layout.seq_len} rows; " + ", ".join(f"{k} {v:.2f} s" for k, v in timings.items()))  # fmt: skip


h3.command("generate")(_apply(generate, OPTIONS))


def describe(
    path: Path | None, *, variant: str | None = None, weight_variant: str | None = None
) -> tuple[str, dict[str, Any]]:
    """(title, data) of `info`: a checkpoint (default: the embedded one), or with `variant` the published
    architecture (configs shipped with the package, no weights)."""
    from dif.checkpoint import source_summary, storage_dtype
    from dif_frontend_h3.config import load_configs
    from dif_frontend_h3.configs import published
    from dif_frontend_h3.weights import open_checkpoint

    if variant is not None:
        root, ck = published(variant), None
        cfgs, name, dtype = load_configs(root), "MiniMax-H3", "bf16"
        sums: dict[str, dict[str, Any]] = {p: {} for p in ("transformer", "text_encoder", "vae", "audio_vae")}
    else:
        ck = open_checkpoint(path or DEFAULT_CHECKPOINT, variant=weight_variant)
        root, cfgs, name, dtype = ck.root, ck.configs, ck.name, storage_dtype(ck.transformer).value
        sums = {p: ({} if getattr(ck, p) is None else source_summary(getattr(ck, p)))
                for p in ("transformer", "text_encoder", "vae", "audio_vae")}  # fmt: skip
    t, q = cfgs.transformer, cfgs.text_encoder
    defaults = checkpoint_defaults(root)
    data = {
        "path": str(root),
        "name": name,
        "variant": "h3",
        "defaults": {**defaults, "fps": FPS, "dtype": dtype, "video_shift": cfgs.scheduler.shift,
                     "audio_shift": cfgs.audio_scheduler.shift},  # fmt: skip
        "transformer": {"blocks": t.num_layers, "refiner_blocks": t.num_refiner_layers, "heads": t.num_attention_heads,
                        "head_dim": t.attention_head_dim, "width": t.hidden_size, "ffn": t.ffn_dim,
                        "rotary_channels": t.rotary_dim, **sums["transformer"]},  # fmt: skip
        "text_encoder": {"layers": q.num_hidden_layers, "tap": cfgs.text_encoder_layer, "width": q.hidden_size,
                         "heads": q.num_attention_heads, "kv_heads": q.num_key_value_heads, **sums["text_encoder"]},
        "vae": {"latent_channels": cfgs.video_vae.latent_channels, "spatial": cfgs.video_vae.spatial_ratio,
                "temporal": cfgs.video_vae.temporal_ratio, "present": cfgs.vae_config is not None, **sums["vae"]},
        "audio_vae": {"latent_channels": cfgs.audio_vae.latent_channels, "sampling_rate": cfgs.audio_vae.sampling_rate,
                      "present": cfgs.audio_vae_config is not None, **sums["audio_vae"]},
        "tokenizer": str(ck.tokenizer_dir) if ck is not None else None,
    }  # fmt: skip
    return f"{name}: MiniMax-H3 (t2va, guidance-distilled)", data


@h3.command("info")
@click.argument("model", required=False, type=click.Path(exists=True, file_okay=False, path_type=Path))
@click.option(
    "--variant", type=click.Choice(INFO.variants), help="Describe the published architecture instead of MODEL."
)
@click.option("--weight-variant", help="Weight files to read, e.g. fp16.")
@click.option("--json", "as_json", is_flag=True, help="Print one dif-telemetry/1 JSON document on stdout.")
def info(model: Path | None, variant: str | None, weight_variant: str | None, as_json: bool) -> None:
    """Describe a checkpoint (default: the embedded model) or the published architecture."""
    if model is not None and variant is not None:
        raise click.UsageError("give MODEL or --variant, not both")
    title, data = describe(model, variant=variant, weight_variant=weight_variant)
    if as_json:
        click.echo(telemetry_text("h3.info", click.get_current_context().command_path, data))
        return
    lines = [title, f"  path {data['path']}"]
    for part in ("transformer", "text_encoder", "vae", "audio_vae"):
        desc = data[part]
        shape = ", ".join(f"{k} {v}" for k, v in desc.items() if k not in ("tensors", "bytes", "dtypes", "from"))
        weights = (f"; {desc['tensors']} tensors, {desc['bytes'] / 1e6:.1f} MB {'/'.join(desc['dtypes'])}"
                   if "tensors" in desc else "; no weights")  # fmt: skip
        lines.append(f"  {part}: {shape}{weights}")
    d = data["defaults"]
    lines.append(f"  defaults: {d['frames']} frames {d['width']}x{d['height']} @ {d['fps']} fps, {d['steps']} grid "
                 f"points, shifts {d['video_shift']:g} / {d['audio_shift']:g}, {d['dtype']}")  # fmt: skip
    lines.append(f"  tokenizer: {data['tokenizer'] or 'none'}")
    click.echo("\n".join(lines))
