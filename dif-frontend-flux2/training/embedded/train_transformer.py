"""Train the embedded demo model's transformer: `dif train full`'s session (`dif_frontend_flux2.train`).

Training recipe stage 3 (outside the package): the klein full fine-tune of every transformer weight on
the shapes data (latents from the trained VAE's encoder, text features from the frozen text encoder),
what `dif train full --data DATA -m CHECKPOINT --resolution 256 --timestep-shift S` runs, driven from
Python for the report and the time box (the kit's `FeatureCache` encodes each distinct caption once; its
per-sample files under RUN/cache make a restart encode nothing). What makes the text learnable:
  - micro-batches of `--batch` images: one step program of that batch (on CUDA one graph per step);
  - the checkpoint's `max_sequence_length` (32 for the embedded model, `base_checkpoint.py`): few pad rows;
  - the training sigmas shifted by the 4-step sampler's own shift at the training size (exp(mu), mu =
    `empirical_mu(tokens, 4)`: 7.1 at 256², so the uniform draws put the sampler's sigmas 1, .955, .877, .704
    at the quantiles 1, .75, .5, .25) — the high-noise steps where only the caption says what to draw;
  - `--sampler-share P`: a share P of the sigmas are the 4-step sampler's own four instead, the only ones it
    ever evaluates the model at (its last step goes from .704 to 0, so that prediction is the image).
Every `--eval-every` steps the loss on fixed held batches is measured at the sampler's sigmas with the right
captions and with wrong ones (each image given a caption of another colour and third): the text is used
when the first falls below the second.

    python train_transformer.py --data DATA -m CHECKPOINT --out RUN [--steps 20000] [--minutes M]
        [--batch 32] [--lr 1e-3] [--backend cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import time
from pathlib import Path
from typing import Any

import numpy as np
from shapes import describe
from timebox import run_until

from dif.train.flow import sample_sigmas
from dif.train.tasks import LoraSettings
from dif_frontend_flux2.pipeline import empirical_mu, klein_schedule
from dif_frontend_flux2.train import FullSession, full_session

SAMPLER_STEPS = 4  # the distilled klein's default steps (plugin.INFO), the judge's


def sampler_shift(tokens: int, steps: int = SAMPLER_STEPS) -> float:
    """The shift S with S*s / (1 + (S-1)*s) = the klein sampler's exponential time shift: exp(mu)."""
    return math.exp(empirical_mu(tokens, steps))


def content(caption: str) -> tuple[str | None, str | None, str | None]:
    """(colour, position, shape) named by a shapes caption ("" where none is)."""
    scene = describe(caption)
    return scene.colour, scene.position, scene.shape


def sampler_sigma_draw(session: FullSession, sampler: np.ndarray, share: float) -> Any:
    """The session's sigma draw with a share `share` of the sigmas taken from `sampler` (uniformly), the rest
    from its shifted uniform draw (`KleinLoraTask.sigma_draw`)."""
    task = session.task

    def draw(rng: np.random.Generator, n: int) -> np.ndarray:
        drawn = sample_sigmas(rng, n, scheme=task.scheme, shift=task.shift)
        return np.where(rng.random(n) < share, rng.choice(sampler, n), drawn).astype(np.float32)

    return draw


def held_batches(session: FullSession, samples: int, sigmas: np.ndarray, seed: int = 1234) -> dict[str, list]:
    """Fixed evaluation micro-batches: `samples` images spread over the data, each sigma of `sigmas`, with
    the right captions ("right"), with each image given the caption of one of another colour and another
    third ("wrong"), and of one of the same shape and third in another colour ("colour": whether the colour
    word is used); the same noise for all."""
    task = session.task
    n = len(task.samples)
    b = task.batch
    count = max(b, samples // b * b)
    picks = [int(i) for i in np.linspace(0, n - 1, count).round()]
    tags = [content(task.samples[i].caption) for i in range(n)]
    partners: dict[str, list[int]] = {"wrong": [], "colour": []}
    for k, i in enumerate(picks):
        c, p, s = tags[i]
        wrong = [j for j in range(n) if tags[j][0] != c and tags[j][1] != p]
        colour = [j for j in range(n) if tags[j][0] != c and tags[j][1:] == (p, s)]
        for name, others in (("wrong", wrong), ("colour", colour)):
            partners[name].append(others[k % len(others)] if others else (i + 1) % n)
    out: dict[str, list] = {"right": [], "wrong": [], "colour": []}
    for s_i, sigma in enumerate(sigmas):
        for start in range(0, count, b):
            idx = picks[start : start + b]
            sig = np.full(len(idx), sigma, np.float32)
            kinds = [("right", None)] + [(name, partners[name][start : start + b]) for name in ("wrong", "colour")]
            for name, captions in kinds:
                rng = np.random.default_rng([seed, s_i, start])
                out[name].append((sigma, task.batch_inputs(idx, rng, sigmas=sig, captions_of=captions)))
    return out


def evaluate(session: FullSession, held: dict[str, list]) -> dict[str, Any]:
    """Mean held loss per caption kind and sigma."""
    doc: dict[str, Any] = {}
    for name, batches in held.items():
        by_sigma: dict[str, list[float]] = {}
        for sigma, batch in batches:
            by_sigma.setdefault(f"{sigma:.3f}", []).append(session.trainer.evaluate([batch]))
        doc[name] = {k: round(float(np.mean(v)), 5) for k, v in by_sigma.items()}
        doc[name + "_mean"] = round(float(np.mean([np.mean(v) for v in by_sigma.values()])), 5)
    doc["wrong_minus_right"] = round(doc["wrong_mean"] - doc["right_mean"], 5)
    doc["colour_minus_right"] = round(doc["colour_mean"] - doc["right_mean"], 5)
    return doc


def export_model(session: FullSession, folder: Path) -> None:
    """The model folder written next to `folder` and moved into place, so a kill never leaves half a file."""
    tmp = folder.with_name(folder.name + ".new")
    shutil.rmtree(tmp, ignore_errors=True)
    session.export(tmp)
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)


def train(data: Path, model: Path, out: Path, *, steps: int, lr: float, warmup: int, seed: int, batch: int = 1,
          resolution: int = 256, shift: float | None = None, backend: str = "cpu", minutes: float | None = None,
          save_minutes: float = 2.0, eval_every: int = 200, eval_samples: int = 16,
          sampler_share: float = 0.0) -> dict[str, Any]:  # fmt: skip
    t_start = time.time()
    deadline = None if minutes is None else t_start + 60 * minutes
    tokens = (resolution // 16) ** 2
    shift = sampler_shift(tokens) if shift is None else shift
    settings = LoraSettings(steps=steps, lr=lr, warmup=warmup, resolution=resolution, seed=seed, weight_decay=0.0,
                            cache_dir=out / "cache", timestep_shift=shift, batch_size=batch)  # fmt: skip
    session = full_session(model, data, settings, backend=backend)
    captions = len({sample.caption for sample in session.task.samples})
    session.encode_all()
    encode_seconds = time.time() - t_start
    print(f"encoded {len(session.task.samples)} samples ({captions} captions, {session.task.text_length} text rows) "
          f"in {encode_seconds:.0f}s; shift {shift:.3f}, batch {batch}, backend {backend}", flush=True)  # fmt: skip
    resume = out / "last.diftrain"
    session.trainer.settings["sampler_share"] = sampler_share  # saved with the state, checked on resume
    if resume.is_file():
        session.trainer.resume(resume)
    sigmas = klein_schedule(tokens, SAMPLER_STEPS).sigmas[:SAMPLER_STEPS].astype(np.float32)
    held = held_batches(session, eval_samples, sigmas)
    if sampler_share > 0:
        session.task.sigma_draw = sampler_sigma_draw(session, sigmas, sampler_share)
    history: list[dict[str, Any]] = []
    t1 = time.time()

    def log_eval() -> None:
        doc = {"step": session.trainer.step, "seconds": round(time.time() - t1, 1), **evaluate(session, held)}
        history.append(doc)
        print(f"eval step {doc['step']}: held loss right {doc['right_mean']:.4f} wrong {doc['wrong_mean']:.4f} "
              f"(wrong - right {doc['wrong_minus_right']:+.4f}) colour {doc['colour_mean']:.4f} "
              f"(colour - right {doc['colour_minus_right']:+.4f}) by sigma right {doc['right']} wrong {doc['wrong']} "
              f"colour {doc['colour']}", flush=True)  # fmt: skip

    def on_step(r: Any) -> None:
        if r.step % 50 == 0 or r.step == 1:
            recent = float(np.mean(session.trainer.losses[-50:]))
            print(f"step {r.step} loss(50) {recent:.4f} lr {r.lr:.2e} |g| {r.grad_norm:.3f} "
                  f"{time.time() - t1:.0f}s", flush=True)  # fmt: skip
        if eval_every and r.step % eval_every == 0:
            log_eval()

    def checkpoint() -> None:
        session.trainer.save(resume)
        export_model(session, out / "model")
        print(f"saved step {session.trainer.step}: {resume}, {out / 'model'}", flush=True)

    log_eval()
    run = run_until(session.trainer, steps, deadline=deadline, on_step=on_step, checkpoint=checkpoint,
                    save_seconds=60 * save_minutes)  # fmt: skip
    if not history or history[-1]["step"] != session.trainer.step:
        log_eval()
    losses = session.trainer.losses
    report = {"steps": session.trainer.step, "stopped": run["stopped"], "lr_horizon": run["horizon"], "lr": lr,
              "batch": batch, "resolution": resolution, "shift": session.task.shift, "backend": backend,
              "text_rows": session.task.text_length, "model": str(model), "warmup": warmup,
              "sampler_share": sampler_share, "samples": len(session.task.samples), "captions": captions,
              "encode_seconds": round(encode_seconds, 1),
              "train_seconds": run["seconds"], "eval_sigmas": [round(float(s), 4) for s in sigmas],
              "loss_first_50": float(np.mean(losses[:50])) if losses else None,
              "loss_last_50": float(np.mean(losses[-50:])) if losses else None,
              "loss_by_50": [round(float(np.mean(losses[i : i + 50])), 5) for i in range(0, len(losses), 50)],
              "eval": history}  # fmt: skip
    (out / "train_transformer.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("-m", "--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=20000, help="at most this many optimizer steps")
    ap.add_argument("--minutes", type=float, default=None, help="stop after this much time in all (then save)")
    ap.add_argument("--save-minutes", type=float, default=2.0, help="save the model and last.diftrain this often")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=100)
    ap.add_argument("--batch", type=int, default=1, help="images per micro-batch (one step program of that batch)")
    ap.add_argument("--resolution", type=int, default=256)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="cpu", help="dif backend the step programs run on (cpu, cuda, ...)")
    ap.add_argument("--eval-every", type=int, default=200, help="held right- vs wrong-caption loss every N steps")
    ap.add_argument("--eval-samples", type=int, default=16)
    ap.add_argument("--shift", type=float, default=None,
                    help="shift of the uniform training sigmas (default: the 4-step sampler's)")  # fmt: skip
    ap.add_argument("--sampler-share", type=float, default=0.0,
                    help="share of the training sigmas that are the 4-step sampler's own four")  # fmt: skip
    a = ap.parse_args(argv)
    report = train(a.data, a.model, a.out, steps=a.steps, lr=a.lr, warmup=a.warmup, seed=a.seed, batch=a.batch,
                   resolution=a.resolution, shift=a.shift, backend=a.backend, minutes=a.minutes,
                   save_minutes=a.save_minutes, eval_every=a.eval_every, eval_samples=a.eval_samples,
                   sampler_share=a.sampler_share)  # fmt: skip
    print(json.dumps({k: v for k, v in report.items() if k not in ("eval", "loss_by_50")}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
