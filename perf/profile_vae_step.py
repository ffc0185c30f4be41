"""Where one training step of the embedded model's VAE goes on a backend: the autoencoder step program of
`dif-frontend-flux2/training/embedded/train_vae.py` (forward, dif's autodiff, AdamW), timed as a median of
fresh runs and, on CUDA, profiled by op and by op + shape.

    python perf/profile_vae_step.py [--source VAE_DIR | --channels 8,8,8,8 --groups 4] [--batch 16]
        [--crop 128] [--backend cuda] [--iters 5] [--top 25] [--out FILE.json]

--source takes the config and weights of a VAE folder (the installed default's by default); with
--channels the weights are random (0.05 N(0, 1)) in the config that names.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "dif-frontend-flux2" / "training" / "embedded"))

from train_vae import build_autoencoder  # noqa: E402

from dif.plan.planner import plan_program  # noqa: E402
from dif.runtime import get_backend  # noqa: E402
from dif.train.optim import BC1, BC2, GRAD_SCALE, LR, moment_names  # noqa: E402
from dif.train.schedule import AdamW  # noqa: E402
from dif.train.step import build_step_programs  # noqa: E402
from dif_frontend_flux2.config import Flux2VaeConfig  # noqa: E402


def config(channels: list[int], groups: int) -> Flux2VaeConfig:
    return Flux2VaeConfig.from_dict({
        "block_out_channels": channels, "latent_channels": 32, "layers_per_block": 1, "norm_num_groups": groups,
        "mid_block_add_attention": False, "patch_size": [2, 2], "sample_size": 256,
        "down_block_types": ["DownEncoderBlock2D"] * len(channels),
        "up_block_types": ["UpDecoderBlock2D"] * len(channels),
    })  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument(
        "--source", type=Path, default=HERE.parent / "dif-frontend-flux2/src/dif_frontend_flux2/default/vae"
    )
    ap.add_argument("--channels", default=None)
    ap.add_argument("--groups", type=int, default=4)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--crop", type=int, default=128)
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--iters", type=int, default=5)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    weights: dict[str, np.ndarray] = {}
    if args.channels:
        cfg = config([int(c) for c in args.channels.split(",")], args.groups)
    else:
        from dif.serialize.diftensor import load_tensors

        cfg = Flux2VaeConfig.from_dict(json.loads((args.source / "config.json").read_text()))
        weights = {
            k: np.asarray(v, np.float32)
            for k, v in load_tensors(args.source / "diffusion_pytorch_model.safetensors")[0].items()
        }
    t0 = time.perf_counter()
    forward = build_autoencoder(cfg, batch=args.batch, size=args.crop)
    trainable = [p.name for p in forward.params if not p.name.startswith("bn.")]
    step = build_step_programs(forward, trainable, opt=AdamW(lr=1e-3, weight_decay=0.0), max_grad_norm=1.0)
    build_s = time.perf_counter() - t0
    program = step.step
    backend = get_backend(args.backend, program=program)
    rng = np.random.default_rng(0)
    shapes = {p.name: p.type.shape for p in forward.params}
    feed: dict[str, np.ndarray] = {}
    for i in program.inputs:
        shape = i.type.shape
        if i.name in (LR, BC1, BC2, GRAD_SCALE):
            feed[i.name] = np.array([1e-3 if i.name == LR else 1.0], np.float32)
        elif i.name.startswith("adam."):
            feed[i.name] = np.zeros(shape, np.float32)
        elif i.name in weights:
            feed[i.name] = weights[i.name]
        elif i.name in shapes:  # a trainable value: small random weights
            feed[i.name] = (0.05 * rng.standard_normal(shape)).astype(np.float32)
        else:  # image, noise, target
            feed[i.name] = rng.uniform(-1, 1, shape).astype(np.float32)
    frozen = {p.name: np.zeros(p.type.shape, np.float32) for p in program.params}
    t1 = time.perf_counter()
    plan = plan_program(program, backend.profile(), backend.budget(), decisions=step.grad.decisions)
    exe = backend.prepare(program, plan, frozen)
    prepare_s = time.perf_counter() - t1
    exe.run(feed)  # warm: kernels built, graph captured
    times = []
    for _ in range(args.iters):
        t = time.perf_counter()
        exe.run(feed)
        times.append((time.perf_counter() - t) * 1e3)
    result = {
        "config": {"channels": list(cfg.block_out_channels), "groups": cfg.norm_num_groups, "batch": args.batch,
                   "crop": args.crop, "weights": "random" if args.channels else str(args.source)},
        "backend": args.backend, "nodes": len(program.nodes), "build_s": round(build_s, 2),
        "prepare_s": round(prepare_s, 2), "step_ms_median": round(float(np.median(times)), 2),
        "step_ms": [round(t, 2) for t in times], "trainable_values": len(trainable),
        "moments": sum(1 for n in trainable for _ in moment_names(n)),
    }  # fmt: skip
    if hasattr(exe, "profile"):
        result["by_op"] = {k: round(v["ms"], 2) for k, v in exe.profile(iters=1, by="op").items()}
        by_shape = exe.profile(iters=1, by="shape")
        result["by_shape"] = {k: round(v["ms"], 3) for k, v in list(by_shape.items())[: args.top]}
    print(json.dumps(result, indent=1))
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
