"""Train the embedded demo model's transformer: `dif train full`'s session (`dif_frontend_flux2.train`).

Training recipe stage 3 (outside the package): the klein full fine-tune of every transformer weight on
the shapes data (latents from the trained VAE's encoder, text features from the frozen text encoder),
exactly what `dif train full --data DATA -m CHECKPOINT --resolution 256 [--timestep-shift S]` runs, driven
from Python for the report (the kit's `FeatureCache` encodes each distinct caption once: the dataset has
~190 captions over 810 images; its per-sample files under RUN/cache make a restart encode nothing).

    python train_transformer.py --data DATA -m CHECKPOINT --out RUN [--steps 20000] [--lr 1e-3]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from dif.train.tasks import LoraSettings
from dif_frontend_flux2.train import full_session


def train(data: Path, model: Path, out: Path, *, steps: int, lr: float, warmup: int, seed: int,
          save_every: int, shift: float | None = None) -> dict[str, Any]:  # fmt: skip
    # shift: train on the sigmas the 4-step sampler visits (256 tokens: 1, .955, .877, .704)
    settings = LoraSettings(steps=steps, lr=lr, warmup=warmup, resolution=256, seed=seed, weight_decay=0.0,
                            cache_dir=out / "cache", timestep_shift=shift)  # fmt: skip
    session = full_session(model, data, settings, backend="cpu")
    captions = len({sample.caption for sample in session.task.samples})
    t0 = time.time()
    session.encode_all()
    encode_seconds = time.time() - t0
    print(f"encoded {len(session.task.samples)} samples ({captions} captions) in {encode_seconds:.0f}s", flush=True)
    resume = out / "last.diftrain"
    if resume.is_file():
        session.trainer.resume(resume)
    t1 = time.time()

    def log(r: Any) -> None:
        if r.step % 200 == 0:
            recent = float(np.mean(session.trainer.losses[-200:]))
            print(f"step {r.step}/{steps} loss(200) {recent:.4f} lr {r.lr:.2e} {time.time() - t1:.0f}s", flush=True)

    session.trainer.run(steps, on_step=log, save_every=save_every, save_path=resume)
    seconds = time.time() - t1
    session.export(out / "model")
    report = {"steps": steps, "lr": lr, "shift": session.task.shift, "model": str(model), "warmup": warmup,
              "samples": len(session.task.samples),
              "captions": captions, "encode_seconds": round(encode_seconds, 1), "train_seconds": round(seconds, 1),
              "loss_first_200": float(np.mean(session.trainer.losses[:200])),
              "loss_last_200": float(np.mean(session.trainer.losses[-200:]))}  # fmt: skip
    (out / "train_transformer.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("-m", "--model", type=Path, required=True)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=20000)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save-every", type=int, default=2000)
    ap.add_argument(
        "--shift",
        type=float,
        default=None,
        help="shift of the uniform training sigmas (default: the scheduler's; 1 for a dynamic shift)",
    )
    a = ap.parse_args(argv)
    print(train(a.data, a.model, a.out, steps=a.steps, lr=a.lr, warmup=a.warmup, seed=a.seed,
                save_every=a.save_every, shift=a.shift))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
