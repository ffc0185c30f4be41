"""`dif train lora`: train a LoRA through dif's own programs (forward, autodiff, AdamW: one program per step).

    dif train lora --data DIR --output DIR [-m MODEL] [--rank 16] [--alpha 16] [--target PATTERN ...]
                   [--steps N] [--lr LR] [--warmup N] [--accumulate K] [--max-grad-norm G] [--resolution PX]
                   [--dtype f32|bf16] [--checkpoint-blocks PATTERN ...] [--save-every N] [--resume FILE]
                   [--backend NAME] [--seed S] [--json]

DIR holds images with one caption .txt each (same stem). OUTPUT gets `lora.safetensors` (diffusers /
PEFT keys: `pipe.load_lora_weights` reads it, so does `dif ... --lora`), `last.diftrain` (resume with
--resume), `loss.png` and `train.json`. Progress (loss, it/s, ETA) goes to stderr; with --json the
result document is the only thing on stdout. The model family comes from the checkpoint (the
frontend that recognises it registers its trainer).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from dif_tools.output import emit_document


@click.group(help="Train through dif's programs (LoRA adapters).")
def train() -> None:
    pass


def _progress(text: str, *, quiet: bool) -> None:
    if not quiet:
        click.echo(text, err=True)


def _clock(seconds: float) -> str:
    s = int(round(seconds))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


@train.command("lora", help="Train a LoRA on a folder of captioned images.")
@click.option(
    "--data",
    "data",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    required=True,
    help="Folder of images, each with a caption .txt of the same name.",
)
@click.option(
    "--output",
    "-o",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder for lora.safetensors, last.diftrain, loss.png, train.json.",
)
@click.option(
    "--model",
    "-m",
    type=click.Path(exists=True, path_type=Path),
    default=None,
    help="Diffusers folder of the base model (default: the embedded tiny FLUX.2 klein).",
)
@click.option("--rank", type=click.IntRange(1), default=16, show_default=True)
@click.option("--alpha", type=click.FloatRange(min=0, min_open=True), default=None, help="LoRA alpha (default: rank).")
@click.option(
    "--target",
    "targets",
    multiple=True,
    help="Target modules: a name suffix (to_q), an fnmatch glob or re:REGEX; repeatable "
    "(default: every attention projection).",
)
@click.option("--steps", type=click.IntRange(1), default=1000, show_default=True, help="Optimizer steps.")
@click.option("--lr", type=click.FloatRange(min=0, min_open=True), default=1e-4, show_default=True)
@click.option("--warmup", type=click.IntRange(0), default=0, show_default=True, help="Linear warm-up steps.")
@click.option("--constant-lr", is_flag=True, help="No cosine decay after the warm-up.")
@click.option("--weight-decay", type=click.FloatRange(0), default=1e-2, show_default=True)
@click.option("--accumulate", type=click.IntRange(1), default=1, show_default=True, help="Micro-batches per step.")
@click.option(
    "--max-grad-norm",
    type=click.FloatRange(min=0),
    default=1.0,
    show_default=True,
    help="Clip gradients to this global norm (0: no clipping).",
)
@click.option(
    "--resolution",
    type=click.IntRange(16),
    default=512,
    show_default=True,
    help="Bucket area is about this squared; aspect ratios keep their bucket.",
)
@click.option(
    "--dtype",
    type=click.Choice(["f32", "bf16"]),
    default="f32",
    show_default=True,
    help="Compute dtype (master weights and optimizer state stay fp32).",
)
@click.option(
    "--checkpoint-blocks", multiple=True, help="Recompute these blocks in the backward (fnmatch on block names)."
)
@click.option(
    "--timestep-sampling", type=click.Choice(["uniform", "logit_normal"]), default="uniform", show_default=True
)
@click.option(
    "--max-text-tokens",
    type=click.IntRange(1),
    default=None,
    help="Pad / cut captions to this many tokens where the model allows it (Krea 2; klein uses 512).",
)
@click.option("--save-every", type=click.IntRange(0), default=0, help="Also write last.diftrain every N steps.")
@click.option(
    "--resume",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Continue a run from its .diftrain (same model, rank, targets).",
)
@click.option(
    "--cache/--no-cache", default=True, show_default=True, help="Cache latents and text features in OUTPUT/cache."
)
@click.option("--backend", default=None, help="dif backend (default: the best available).")
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the result as a JSON document.")
def lora(data: Path, output: Path, model: Path | None, rank: int, alpha: float | None, targets: tuple[str, ...],
         steps: int, lr: float, warmup: int, constant_lr: bool, weight_decay: float, accumulate: int,
         max_grad_norm: float, resolution: int, dtype: str, checkpoint_blocks: tuple[str, ...],
         timestep_sampling: str, max_text_tokens: int | None, save_every: int, resume: Path | None,
         cache: bool, backend: str | None, seed: int, as_json: bool) -> None:  # fmt: skip
    from dif.cli_support import unwritable_reason
    from dif.errors import UsageError
    from dif.frontend import detect_frontend
    from dif.plugins.manager import frontends
    from dif.train.loop import eta_seconds
    from dif.train.plot import write_loss_curve
    from dif.train.tasks import LoraSettings, lora_trainer

    infos = frontends()
    if model is None:
        if "flux2" not in infos or infos["flux2"].default_checkpoint is None:
            raise UsageError("no --model given and the FLUX.2 frontend (embedded default) is not installed")
        model = Path(infos["flux2"].default_checkpoint)
    family = detect_frontend(model, infos).name
    output.mkdir(parents=True, exist_ok=True)
    reason = unwritable_reason(output / "lora.safetensors")
    if reason:
        raise UsageError(f"{output}: {reason}")
    settings = LoraSettings(
        rank=rank, alpha=alpha or float(rank), targets=targets, steps=steps, lr=lr, warmup=warmup,
        cosine=not constant_lr, accumulate=accumulate, max_grad_norm=max_grad_norm or None,
        weight_decay=weight_decay, resolution=resolution, seed=seed, dtype=dtype,
        checkpoint_blocks=checkpoint_blocks, timestep_sampling=timestep_sampling,
        cache_dir=output / "cache" if cache else None, max_text_tokens=max_text_tokens,
    )  # fmt: skip
    quiet = False
    started = time.perf_counter()
    session = lora_trainer(family)(model, data, settings, backend=backend)
    trainer = session.trainer
    _progress(f"{family}: LoRA rank {rank} alpha {settings.alpha:g} on {len(session.modules)} modules, "
              f"{len(session.task.samples)} images", quiet=quiet)  # fmt: skip
    session.encode_all(
        lambda i, sample, size: _progress(f"  encoded {sample.image.name} at {size[0]}x{size[1]}", quiet=quiet)
    )
    if resume is not None:
        trainer.resume(resume)
        _progress(f"resumed {resume} at step {trainer.step}", quiet=quiet)
    reports: list[Any] = []
    ckpt = output / "last.diftrain"

    def on_step(r: Any) -> None:
        reports.append(r)
        left = steps - r.step
        rate = 1.0 / r.seconds if r.seconds > 0 else float("inf")
        if r.step == 1 or r.step % max(1, steps // 50) == 0 or left == 0:
            _progress(f"step {r.step}/{steps}  loss {r.loss:.5f}  grad-norm {r.grad_norm:.3g}  lr {r.lr:.3g}  "
                      f"{rate:.2f} it/s  ETA {_clock(eta_seconds(reports, left))}", quiet=quiet)  # fmt: skip

    trainer.run(steps, on_step=on_step, save_every=save_every, save_path=ckpt)
    trainer.save(ckpt)
    lora_path = session.export(output / "lora.safetensors")
    curve = write_loss_curve(output / "loss.png", trainer.losses)
    result = {
        "family": family,
        "model": str(model),
        "lora": str(lora_path),
        "checkpoint": str(ckpt),
        "loss_curve": str(curve),
        "steps": trainer.step,
        "modules": list(session.modules),
        "rank": rank,
        "alpha": settings.alpha,
        "first_loss": trainer.losses[0] if trainer.losses else None,
        "last_loss": trainer.losses[-1] if trainer.losses else None,
        "losses": trainer.losses,
        "seconds": round(time.perf_counter() - started, 3),
        "plans": [
            {
                "shape": str(key),
                "program": which,
                "peak_bytes": plan.peak_bytes,
                "min_memory_bytes": plan.binding.min_memory_bytes,
            }
            for (key, which), plan in trainer.plans.items()
        ],
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in _fields(settings).items()},
    }
    tmp = output / ".train.json.tmp"
    tmp.write_text(json.dumps(result, indent=2))
    tmp.replace(output / "train.json")
    if as_json:
        emit_document("train.lora", result)
    else:
        peaks = ", ".join(f"{p['shape']} {p['program']} {p['peak_bytes'] / 2**20:.1f} MiB" for p in result["plans"])
        click.echo(f"wrote {lora_path} ({len(session.modules)} modules), {ckpt}, {curve}")
        if peaks:
            click.echo(f"planned activation + gradient peak per step program: {peaks}")
    sys.stdout.flush()


def _fields(obj: Any) -> dict[str, Any]:
    import attrs

    return attrs.asdict(obj)
