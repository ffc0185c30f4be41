"""Train the embedded demo model's VAE as an autoencoder through dif's own programs.

Training recipe stage 2 (outside the package): the klein VAE encoder and decoder programs of the
frontend (`dif_frontend_flux2.vae`) are spliced into one forward (image -> posterior mean z ->
z + sigma * noise -> decoder), whose output is [reconstruction | k * z] against [image | 0]: the MSE of
`dif.train.step` is then reconstruction error plus a small latent penalty, and the noise keeps the decoder
tolerant of the imprecise latents a 4-step sampler hands it. `build_step_programs` adds the gradients
(dif's autodiff) and AdamW; `dif.train.loop.Trainer` runs them on `--backend` (cpu, or cuda: one step is
one program, one CUDA graph), for `--steps` or until `--minutes` have passed (`timebox.py`). Afterwards
`bn.running_mean/var` are set from the trained encoder's patchified latents over the data, so the
transformer sees unit-variance latents.

    python train_vae.py --data DATA --source CHECKPOINT --out VAE_DIR [--steps 1500] [--batch 4] [--crop 128]
        [--backend cpu] [--minutes M]
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from collections.abc import Hashable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
from attrs import define, field
from timebox import run_until

from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.train.loop import Trainer
from dif.train.schedule import AdamW, LrSchedule
from dif.train.step import TARGET, StepPrograms, build_step_programs, model_fingerprint
from dif_frontend_flux2.config import Flux2VaeConfig
from dif_frontend_flux2.vae import build_vae_decoder, build_vae_encoder

NOISE_SIGMA = 0.1  # latent noise during training, relative to the penalised latent scale (~1)
LATENT_WEIGHT = 0.1  # k: loss += k^2 * sum(z^2) / N, the same N as the reconstruction's


def build_autoencoder(cfg: Flux2VaeConfig, *, batch: int, size: int) -> Program:
    """image (B, 3, S, S) in [-1, 1], noise (B, C, S/8, S/8) -> (B, 3*S*S + C*(S/8)^2): the flattened
    reconstruction then k * z (the training target is the flattened image then zeros)."""
    enc = build_vae_encoder(cfg, batch=batch, height=size, width=size)
    lat = size // cfg.scale_factor
    dec = build_vae_decoder(cfg, batch=batch, latent_h=lat, latent_w=lat)
    b = ProgramBuilder("flux2_vae_autoencoder")
    b.meta.update({"family": "flux2", "component": "vae"})
    image = b.input("image", (batch, cfg.in_channels, size, size), "f32")
    noise = b.input("noise", (batch, cfg.latent_channels, lat, lat), "f32")
    (z,) = b.inline(enc, {"image": image})
    with b.scope(module="train", block="latent", section="noise"):
        noisy = b.emit("add", z, b.emit("scalar_affine", noise, scale=NOISE_SIGMA, bias=0.0))
    (recon,) = b.inline(dec, {"latent": noisy})
    with b.scope(module="train", block="loss", section="pack"):
        flat = b.emit("reshape", recon, shape=(batch, cfg.out_channels * size * size))
        zk = b.emit("scalar_affine", b.emit("reshape", z, shape=(batch, cfg.latent_channels * lat * lat)),
                    scale=LATENT_WEIGHT, bias=0.0)  # fmt: skip
        b.output(b.emit("concat", flat, zk, axis=1))
    return b.build()


def load_images(folder: Path) -> np.ndarray:
    """(N, 3, H, W) float32 in [-1, 1] of every PNG in `folder`."""
    from PIL import Image

    arrs = [np.asarray(Image.open(p).convert("RGB"), np.float32) for p in sorted(folder.glob("*.png"))]
    return (np.stack(arrs).transpose(0, 3, 1, 2) / 127.5 - 1.0).astype(np.float32)


@define
class AutoencoderTask:
    """`dif.train.loop.Task`: batches of random crops (random flips) from the images."""

    cfg: Flux2VaeConfig
    images: np.ndarray
    batch: int
    crop: int
    opt: AdamW
    trainable: list[str]
    model_key: str = ""
    _programs: dict[Hashable, StepPrograms] = field(init=False, factory=dict)

    def forward(self) -> Program:
        return build_autoencoder(self.cfg, batch=self.batch, size=self.crop)

    def programs(self, key: Hashable) -> StepPrograms:
        if key not in self._programs:
            self._programs[key] = build_step_programs(self.forward(), self.trainable, opt=self.opt, max_grad_norm=1.0)
        return self._programs[key]

    def micro_batch(self, rng: np.random.Generator, data: dict[str, Any]) -> tuple[Hashable, dict[str, np.ndarray]]:
        n, _, h, w = self.images.shape
        idx = rng.integers(0, n, self.batch)
        ys, xs = rng.integers(0, h - self.crop + 1, self.batch), rng.integers(0, w - self.crop + 1, self.batch)
        c = self.crop
        crops = np.stack([self.images[i, :, y : y + c, x : x + c] for i, y, x in zip(idx, ys, xs, strict=True)])
        crops = np.where(rng.random((self.batch, 1, 1, 1)) < 0.5, crops, crops[..., ::-1]).astype(np.float32)
        lat = self.crop // self.cfg.scale_factor
        noise = rng.standard_normal((self.batch, self.cfg.latent_channels, lat, lat)).astype(np.float32)
        target = np.concatenate([crops.reshape(self.batch, -1), np.zeros((self.batch, noise[0].size), np.float32)], 1)
        return "ae", {"image": np.ascontiguousarray(crops), "noise": noise, TARGET: target}


def latent_stats(cfg: Flux2VaeConfig, weights: Mapping[str, np.ndarray], images: np.ndarray,
                 backend: str = "cpu") -> tuple[np.ndarray, ...]:  # fmt: skip
    """Per-channel mean and variance of the trained encoder's patchified latents (C*4 channels, in
    the packing order of `vae._emit_pack`) over `images`, on `backend`."""
    from dif.plan.planner import plan_program
    from dif.runtime import get_backend

    n, _, h, w = images.shape
    prog = build_vae_encoder(cfg, batch=1, height=h, width=w)
    device = get_backend(backend, program=prog)
    run = device.prepare(prog, plan_program(prog, device.profile(), device.budget()),
                          {p.name: weights[p.name] for p in prog.params}).run  # fmt: skip
    rows = []
    for i in range(n):
        z = next(iter(run({"image": images[i : i + 1]}).values()))  # (1, C, h/8, w/8)
        c, lh, lw = z.shape[1:]
        x = z.reshape(c, lh // 2, 2, lw // 2, 2).transpose(1, 3, 0, 2, 4).reshape(-1, 4 * c)
        rows.append(x)
    allz = np.concatenate(rows)
    return allz.mean(0).astype(np.float32), allz.var(0).astype(np.float32)


def colour_check(cfg: Flux2VaeConfig, weights: Mapping[str, np.ndarray], backend: str = "cpu",
                 size: int = 128) -> dict[str, float]:  # fmt: skip
    """Mean |error| (0..255) of the reconstructed colour inside a clean circle of each colour, through the
    autoencoder without latent noise: the latent codes colour in far smaller steps than position, and a VAE
    trained too briefly decodes every colour as one brown (the transformer can then draw no colour)."""
    import random

    from shapes import COLOURS, draw

    from dif.plan.planner import plan_program
    from dif.runtime import get_backend

    prog = build_autoencoder(cfg, batch=1, size=size)
    device = get_backend(backend, program=prog)
    run = device.prepare(prog, plan_program(prog, device.profile(), device.budget()),
                         {p.name: weights[p.name] for p in prog.params}).run  # fmt: skip
    lat = size // cfg.scale_factor
    errors = {}
    for colour, rgb in COLOURS.items():
        background = "gray" if colour == "white" else "white"  # a white circle on white is no circle
        image = draw(colour, "circle", "centre", random.Random(0), size, background=background)
        x = np.ascontiguousarray((image.astype(np.float32) / 127.5 - 1).transpose(2, 0, 1)[None])
        noise = np.zeros((1, cfg.latent_channels, lat, lat), np.float32)
        out = next(iter(run({"image": x, "noise": noise}).values()))[0, : 3 * size * size]
        recon = (out.reshape(3, size, size).transpose(1, 2, 0).clip(-1, 1) + 1) * 127.5
        inside = (image != image[0, 0]).any(-1)
        errors[colour] = round(float(np.abs(recon[inside] - np.array(rgb, np.float32)).mean()), 1)
    return errors


def train(data: Path, source: Path, out: Path, *, steps: int, batch: int, crop: int, lr: float, seed: int,
          backend: str = "cpu", minutes: float | None = None) -> dict:  # fmt: skip
    from dif.serialize.diftensor import load_tensors, save_tensors

    cfg_json = json.loads((source / "config.json").read_text())
    cfg = Flux2VaeConfig.from_dict(cfg_json)
    start, _ = load_tensors(source / "diffusion_pytorch_model.safetensors")
    images = load_images(data)
    opt = AdamW(lr=lr, weight_decay=0.0)
    probe = build_autoencoder(cfg, batch=1, size=cfg.scale_factor * 2)
    names = [p.name for p in probe.params if not p.name.startswith("bn.")]
    task = AutoencoderTask(cfg, images, batch, crop, opt, names)
    task.model_key = model_fingerprint(task.forward(), names)
    params = {n: np.array(start[n], np.float32) for n in names}
    trainer = Trainer(task, {}, params, opt, LrSchedule(lr, steps, warmup=min(100, steps // 10)), backend=backend,
                      seed=seed)  # fmt: skip
    t0 = time.time()
    deadline = None if minutes is None else t0 + 60 * minutes

    def log(r: Any) -> None:
        if r.step % 50 == 0 or r.step == 1:
            took = time.time() - t0
            print(f"vae step {r.step}/{steps} loss {r.loss:.5f} |g| {r.grad_norm:.3f} {took:.0f}s", flush=True)

    run = run_until(trainer, steps, deadline=deadline, on_step=log)
    seconds = time.time() - t0
    weights = {**{n: np.array(v) for n, v in start.items()}, **trainer.params}
    mean, var = latent_stats(cfg, weights, images[:: max(1, len(images) // 200)], backend)
    weights["bn.running_mean"], weights["bn.running_var"] = mean, var
    out.mkdir(parents=True, exist_ok=True)
    save_tensors(out / "diffusion_pytorch_model.safetensors", {n: np.asarray(v) for n, v in weights.items()},
                 dif_metadata=False)  # fmt: skip
    if (source / "config.json").resolve() != (out / "config.json").resolve():
        shutil.copyfile(source / "config.json", out / "config.json")
    colours = colour_check(cfg, weights, backend)
    print(f"vae colour error inside clean circles (0-255): {colours}", flush=True)
    report = {"colour_error": colours, "steps": trainer.step, "stopped": run["stopped"], "backend": backend,
              "batch": batch, "crop": crop,
              "lr": lr, "seconds": round(seconds, 1),
              "final_loss": float(np.mean(trainer.losses[-50:])), "first_loss": trainer.losses[0]}  # fmt: skip
    (out / "train_vae.json").write_text(json.dumps(report, indent=2) + "\n")
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--source", type=Path, required=True, help="the checkpoint's vae/ folder (config + init)")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--steps", type=int, default=1500)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--crop", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--backend", default="cpu", help="dif backend the step programs run on (cpu, cuda, ...)")
    ap.add_argument("--minutes", type=float, default=None, help="stop after this much training time (then save)")
    a = ap.parse_args(argv)
    print(train(a.data, a.source, a.out, steps=a.steps, batch=a.batch, crop=a.crop, lr=a.lr, seed=a.seed,
                backend=a.backend, minutes=a.minutes))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
