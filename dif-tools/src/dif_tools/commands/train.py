"""`dif train lora|full`: train through dif's own programs (forward, autodiff, AdamW: one program per step).

    dif train lora --data DIR --output DIR [-m MODEL] [--rank 16] [--alpha 16] [--target PATTERN ...]
                   [--steps N] [--lr LR] [--warmup N] [--accumulate K] [--batch-size B] [--max-grad-norm G]
                   [--resolution PX] [--dtype f32|bf16] [--checkpoint-blocks PATTERN ...] [--timestep-shift S]
                   [--save-every N] [--resume FILE]
                   [--backend NAME] [--seed S] [--json]
    dif train full --data DIR --output DIR [-m MODEL] [same options, no LoRA ones]

DIR holds images with one caption .txt each (same stem). OUTPUT gets `lora.safetensors` (diffusers /
PEFT keys: `pipe.load_lora_weights` reads it, so does `dif ... --lora`) or, for `full`, `model/` (a
diffusers folder: the trained transformer, the other components linked), and `last.diftrain` (resume
with --resume), `loss.png` and `train.json`. Progress (loss, it/s, ETA) goes to stderr; with --json the
result document is the only thing on stdout. The model family comes from the checkpoint (the frontend
that recognises it registers its trainers).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from dif_tools.output import emit_document


@click.group(help="Train through dif's programs: LoRA adapters (lora) or every weight of a small model (full).")
def train() -> None:
    pass


def _progress(text: str) -> None:
    click.echo(text, err=True)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


COMMON: list[Callable[[Any], Any]] = [
    click.option("--data", type=click.Path(exists=True, file_okay=False, path_type=Path), required=True,
                 help="Folder of images, each with a caption .txt of the same name."),
    click.option("--output", "-o", type=click.Path(file_okay=False, path_type=Path), required=True,
                 help="Folder for the result, last.diftrain, loss.png, train.json."),
    click.option("--model", "-m", type=click.Path(exists=True, path_type=Path), default=None,
                 help="Diffusers folder of the base model (default: the embedded tiny FLUX.2 klein)."),
    click.option("--steps", type=click.IntRange(1), default=1000, show_default=True, help="Optimizer steps."),
    click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=1e-4, show_default=True),
    click.option("--warmup", type=click.IntRange(0), default=0, show_default=True, help="Linear warm-up steps."),
    click.option("--constant-lr", is_flag=True, help="No cosine decay after the warm-up."),
    click.option("--weight-decay", type=click.FloatRange(0), default=1e-2, show_default=True),
    click.option("--accumulate", type=click.IntRange(1), default=1, show_default=True, help="Micro-batches per step."),
    click.option("--batch-size", type=click.IntRange(1), default=1, show_default=True,
                 help="Images per micro-batch, run as one step program (they must share an aspect-ratio bucket)."),
    click.option("--max-grad-norm", type=click.FloatRange(min=0), default=1.0, show_default=True,
                 help="Clip gradients to this global norm (0: no clipping)."),
    click.option("--resolution", type=click.IntRange(16), default=512, show_default=True,
                 help="Bucket area is about this squared; aspect ratios keep their bucket."),
    click.option("--dtype", type=click.Choice(["f32", "bf16"]), default="f32", show_default=True,
                 help="Compute dtype (master weights and optimizer state stay fp32)."),
    click.option("--checkpoint-blocks", multiple=True,
                 help="Recompute these blocks in the backward (fnmatch on block names, repeatable)."),
    click.option("--timestep-sampling", type=click.Choice(["uniform", "logit_normal"]), default="uniform",
                 show_default=True),
    click.option("--timestep-shift", type=float, default=None,
                 help="Shift the training sigmas: s*sigma/(1+(s-1)*sigma), s > 0 (default: the scheduler's training "
                      "shift, 1 where it shifts dynamically; a resumed run keeps its checkpoint's)."),
    click.option("--max-text-tokens", type=click.IntRange(1), default=None,
                 help="Pad / cut captions to this many tokens where the model allows it (Krea 2; klein uses 512)."),
    click.option("--save-every", type=click.IntRange(0), default=0, help="Also write last.diftrain every N steps."),
    click.option("--resume", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
                 help="Continue a run from its .diftrain (same model, and for LoRA the same rank and targets)."),
    click.option("--cache/--no-cache", default=True, show_default=True,
                 help="Cache latents and text features in OUTPUT/cache."),
    click.option("--backend", default=None, help="dif backend (default: the best available)."),
    click.option("--seed", type=int, default=0, show_default=True),
    click.option("--json", "as_json", is_flag=True, help="Print the result as a JSON document."),
]  # fmt: skip

LORA: list[Callable[[Any], Any]] = [
    click.option("--rank", type=click.IntRange(1), default=16, show_default=True),
    click.option("--alpha", type=click.FloatRange(min=0, min_open=True), default=None,
                 help="LoRA alpha (default: rank)."),
    click.option("--target", "targets", multiple=True,
                 help="Target modules: a name suffix (to_q), an fnmatch glob or re:REGEX; repeatable "
                      "(default: every attention projection)."),
]  # fmt: skip


def _options(decorators: list[Callable[[Any], Any]]) -> Callable[[Any], Any]:
    def wrap(fn: Any) -> Any:
        for d in reversed(decorators):
            fn = d(fn)
        return fn

    return wrap


@train.command("lora", help="Train a LoRA on a folder of captioned images.")
@_options(COMMON + LORA)
def lora(**opts: Any) -> None:
    _run("lora", opts)


@train.command("full", help="Train every transformer weight of a (small) model on a folder of captioned images.")
@_options(COMMON)
def full(**opts: Any) -> None:
    _run("full", opts)


def _run(kind: str, o: dict[str, Any]) -> None:
    from dif.cli_support import unwritable_reason
    from dif.errors import UsageError
    from dif.frontend import detect_frontend
    from dif.plugins.manager import frontends
    from dif.train.checkpoint import recorded_settings
    from dif.train.loop import eta_seconds
    from dif.train.plot import write_loss_curve
    from dif.train.tasks import LoraSettings, full_trainer, lora_trainer

    infos = frontends()
    model = o["model"]
    if model is None:
        if "flux2" not in infos or infos["flux2"].default_checkpoint is None:
            raise UsageError("no --model given and the FLUX.2 frontend (embedded default) is not installed")
        model = Path(infos["flux2"].default_checkpoint)
    family = detect_frontend(model, infos).name
    output: Path = o["output"]
    rank = o.get("rank", 16)
    steps = o["steps"]
    shift = o["timestep_shift"]
    if shift is None and o["resume"] is not None:  # a resumed run trains on the sigmas it started with
        shift = recorded_settings(o["resume"]).get("timestep_shift")
    settings = LoraSettings(
        rank=rank, alpha=o.get("alpha") or float(rank), targets=o.get("targets", ()), steps=steps, lr=o["lr"],
        warmup=o["warmup"], cosine=not o["constant_lr"], accumulate=o["accumulate"],
        max_grad_norm=o["max_grad_norm"] or None, weight_decay=o["weight_decay"], resolution=o["resolution"],
        seed=o["seed"], dtype=o["dtype"], checkpoint_blocks=o["checkpoint_blocks"],
        timestep_sampling=o["timestep_sampling"], cache_dir=output / "cache" if o["cache"] else None,
        max_text_tokens=o["max_text_tokens"], timestep_shift=shift, batch_size=o["batch_size"],
    )  # fmt: skip
    output.mkdir(parents=True, exist_ok=True)
    reason = unwritable_reason(output / "train.json")
    if reason:
        raise UsageError(f"{output}: {reason}")
    started = time.perf_counter()
    factory = lora_trainer(family) if kind == "lora" else full_trainer(family)
    session = factory(model, o["data"], settings, backend=o["backend"])
    trainer = session.trainer
    what = f"LoRA rank {rank} alpha {settings.alpha:g} on {len(session.modules)} modules" if kind == "lora" else (
        f"full fine-tune of {len(session.modules)} tensors")  # fmt: skip
    _progress(f"{family}: {what}, {len(session.task.samples)} images")
    session.encode_all(lambda i, sample, size: _progress(f"  encoded {sample.image.name} at {size[0]}x{size[1]}"))
    if o["resume"] is not None:
        trainer.resume(o["resume"])
        _progress(f"resumed {o['resume']} at step {trainer.step}")
    reports: list[Any] = []
    ckpt = output / "last.diftrain"

    def on_step(r: Any) -> None:
        reports.append(r)
        left = steps - r.step
        rate = 1.0 / r.seconds if r.seconds > 0 else float("inf")
        if r.step == 1 or r.step % max(1, steps // 50) == 0 or left == 0:
            _progress(f"step {r.step}/{steps}  loss {r.loss:.5f}  grad-norm {r.grad_norm:.3g}  lr {r.lr:.3g}  "
                      f"{rate:.2f} it/s  ETA {_clock(eta_seconds(reports, left))}")  # fmt: skip

    trainer.run(steps, on_step=on_step, save_every=o["save_every"], save_path=ckpt)
    trainer.save(ckpt)
    result_path = session.export(output / ("lora.safetensors" if kind == "lora" else "model"))
    curve = write_loss_curve(output / "loss.png", trainer.losses)
    plans = [
        {"shape": str(key), "program": which, "peak_bytes": plan.peak_bytes,
         "min_memory_bytes": plan.binding.min_memory_bytes}
        for (key, which), plan in trainer.plans.items()
    ]  # fmt: skip
    result = {
        "family": family,
        "kind": kind,
        "model": str(model),
        kind: str(result_path),
        "checkpoint": str(ckpt),
        "loss_curve": str(curve),
        "steps": trainer.step,
        "modules": list(session.modules) if kind == "lora" else len(session.modules),
        "rank": rank if kind == "lora" else None,
        "alpha": settings.alpha if kind == "lora" else None,
        "timestep_shift": trainer.settings.get("timestep_shift"),
        "first_loss": trainer.losses[0] if trainer.losses else None,
        "last_loss": trainer.losses[-1] if trainer.losses else None,
        "losses": trainer.losses,
        "seconds": round(time.perf_counter() - started, 3),
        "plans": plans,
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in _fields(settings).items()},
    }
    tmp = output / ".train.json.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(output / "train.json")
    if o["as_json"]:
        emit_document(f"train.{kind}", result)
        return
    click.echo(f"wrote {result_path}, {ckpt}, {curve}")
    peaks = ", ".join(f"{p['shape']} {p['program']} {p['peak_bytes'] / 2**20:.1f} MiB" for p in plans)
    if peaks:
        click.echo(f"planned activation + gradient peak per step program: {peaks}")


def _fields(obj: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(obj)
