"""One denoiser forward on 1 GPU vs N GPUs with Ulysses sequence parallelism (dif.parallel + NCCL).

    python perf/ulysses_forward.py --model klein-9b --gpus 1,2 [--iters 3] [--out perf/results]
    python perf/ulysses_forward.py --model h3 --gpus 1,2,4
    python perf/ulysses_forward.py --model klein-9b --dry-run     # CPU: tiny config, in-process ranks

klein-9b: FLUX.2 klein 9B at 1024x1024 (4,096 image + 512 text rows); h3: MiniMax-H3 at its default canvas
(768x1344, 124 frames, 256 text rows: 37,966 rows). bf16, random weights (views of one seeded buffer, so
every process binds the same weights without 18-66 GB of generation), random inputs from one seed.
Each N > 1 starts N processes (dif.parallel.launch: torchrun-style RANK / WORLD_SIZE / LOCAL_RANK,
MASTER_ADDR / MASTER_PORT), rank r on GPU r (`CudaBackend(device=LOCAL_RANK)`), the all-to-alls and the
final gather through `dif_backend_cuda.nccl`. Writes ulysses_<model>.json: per N the forward times
(median of --iters after one warm-up), speed-up vs N = 1 and the cosine of the output vs N = 1.

Today the rank programs are cut at each collective and every piece is its own prepared program (its own CUDA
graph), with activations crossing host memory at each all-to-all: the numbers measure that path, not an
all-to-all inside one graph.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from dif.dtypes import DType

KLEIN_9B = {"attention_head_dim": 128, "axes_dims_rope": [32, 32, 32, 32], "eps": 1e-06, "guidance_embeds": False,
            "in_channels": 128, "mlp_ratio": 3.0, "out_channels": None, "patch_size": 1, "rope_theta": 2000,
            "timestep_guidance_channels": 256, "num_attention_heads": 32, "num_layers": 8, "num_single_layers": 24,
            "joint_attention_dim": 12288}  # fmt: skip
KLEIN_TINY = {**KLEIN_9B, "attention_head_dim": 32, "axes_dims_rope": [8, 8, 8, 8], "num_attention_heads": 4,
              "num_layers": 1, "num_single_layers": 2, "joint_attention_dim": 24, "in_channels": 16,
              "timestep_guidance_channels": 32}  # fmt: skip
H3_TINY = {"num_attention_heads": 4, "attention_head_dim": 32, "hidden_size": 48, "num_layers": 2,
           "num_refiner_layers": 1, "ffn_dim": 64, "in_channels": 4, "audio_in_channels": 8, "patch_size": (1, 2, 2),
           "text_dim": 16, "freq_dim": 32, "time_embed_hidden_dim": 40, "time_embed_dim": 24, "rope_freq_dim": 4,
           "rope_theta": 10000.0}  # fmt: skip
BUFFER = 1 << 27  # elements of the shared random weight buffer


def build(model: str, tiny: bool) -> tuple[Any, dict[str, int], dict[str, np.ndarray]]:
    """(program, sequence inputs for ulysses, feeds) of one forward."""
    rng = np.random.default_rng(0)
    dt = DType.F32 if tiny else DType.BF16
    if model == "klein-9b":
        from dif_frontend_flux2.config import Flux2TransformerConfig
        from dif_frontend_flux2.model import build_transformer, flux2_rope_tables, flux2_timestep_proj

        cfg = Flux2TransformerConfig.from_dict(KLEIN_TINY if tiny else KLEIN_9B)
        side, n_txt = (4, 6) if tiny else (64, 512)  # 1024 px / 16 px per token
        program = build_transformer(cfg, batch=1, n_img=side * side, n_txt=n_txt, dtype=dt)
        cos, sin = flux2_rope_tables(n_txt, side, side, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
        t_proj = flux2_timestep_proj([900.0], dtype=dt, channels=cfg.timestep_guidance_channels)
        feeds = {"rope_cos": cos, "rope_sin": sin, "timestep_proj": t_proj}
        seq = {"latents": 1, "text_features": 1}
    elif model == "h3":
        import dif_frontend_h3
        from dif_frontend_h3.config import H3TransformerConfig, load_configs
        from dif_frontend_h3.layout import build_layout, layout_for
        from dif_frontend_h3.model import build_denoiser, rope_tables, time_proj

        configs = load_configs(Path(dif_frontend_h3.__file__).parent / "configs" / "h3")
        if tiny:  # 5 text rows, 2 latent frames of 3x3 tokens, 3 audio latents
            cfg, layout = H3TransformerConfig.from_dict(H3_TINY), build_layout(np.ones(5, int), 2, 6, 6, 3)
        else:
            cfg, layout = configs.transformer, layout_for(configs, 256, 124, 1344, 768)
        program = build_denoiser(cfg, layout, dtype=dt)
        cos, sin = rope_tables(cfg, layout.position_ids, dtype=dt)
        feeds = {
            "rope_cos": cos,
            "rope_sin": sin,
            "time_proj": time_proj(np.linspace(0.1, 0.9, layout.num_slots), cfg.freq_dim),
        }
        seq = {"video_latents": 1, "audio_latents": 1, "text_embeds": 1}
    else:
        raise SystemExit(f"unknown --model {model!r}: klein-9b or h3")
    for v in program.inputs:
        if v.name not in feeds:
            feeds[v.name] = rng.standard_normal(v.type.shape).astype(np.float32).astype(v.type.dtype.np)
    return program, seq, feeds


def weights_for(program: Any, size: int = BUFFER) -> dict[str, np.ndarray]:
    """Views of one seeded N(0, 0.02) buffer per dtype, each parameter at its own offset."""
    buffers: dict[str, np.ndarray] = {}
    out = {}
    for i, p in enumerate(program.params):
        key = p.type.dtype.value
        if key not in buffers:
            raw = np.random.default_rng(1).standard_normal(size).astype(np.float32) * np.float32(0.02)
            buffers[key] = raw.astype(p.type.dtype.np)
        n = p.type.numel
        if n > size:
            out[p.name] = np.resize(buffers[key], p.type.shape)
            continue
        start = (i * 7919) % (size - n + 1)
        out[p.name] = buffers[key][start : start + n].reshape(p.type.shape)
    return out


def worker(args: argparse.Namespace) -> None:
    """One rank (or the single-GPU baseline): prepare, time, save rank 0's output."""
    from dif.parallel import ulysses
    from dif.parallel.launch import RankEnv, prepare_rank, run_rank
    from dif.parallel.local import prepare_segment
    from dif_backend_cuda.device import CudaBackend

    env = RankEnv.from_env()
    program, seq, feeds = build(args.model, tiny=False)
    weights = weights_for(program)
    backend = CudaBackend(device=env.local_rank)
    started = time.perf_counter()
    if env.world == 1:
        exe, _ = prepare_segment(program, weights, backend, [])

        def forward() -> dict[str, np.ndarray]:
            return exe.run(feeds)

        barrier = lambda: None  # noqa: E731
    else:
        from dif_backend_cuda.nccl import NcclCommunicator

        plan = ulysses(program, env.world, seq)
        prepared = prepare_rank(plan, env.rank, weights, backend)
        comm = NcclCommunicator.from_env()

        def forward() -> dict[str, np.ndarray]:
            return run_rank(plan, env.rank, prepared, feeds, comm)

        def barrier() -> None:
            comm.all_gather(np.zeros(1, np.float32))

    prepare_s = time.perf_counter() - started
    forward()  # warm-up (first replays, lazy allocations)
    times = []
    for _ in range(args.iters):
        barrier()
        t = time.perf_counter()
        out = forward()
        times.append(time.perf_counter() - t)
    if env.rank == 0:
        work = Path(args.work)
        for i, name in enumerate(program.outputs):
            np.save(work / f"out{env.world}_{i}.npy", out[name].astype(np.float32))
        report = {"gpus": env.world, "prepare_s": prepare_s, "forward_s": times, "median_s": float(np.median(times))}
        (work / f"time{env.world}.json").write_text(json.dumps(report))


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    a, b = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def in_process(model: str, *, tiny: bool, backend: str, ranks: list[int]) -> list[dict[str, Any]]:
    """Every rank on one device, in this process (dif.parallel.local): the split's pieces prepared and run on
    `backend`, the all-to-alls on the host; cosine of each output vs the unsplit program on that backend."""
    from dif.parallel import ulysses
    from dif.parallel.local import prepare_segment, run_ranks
    from dif.runtime import get_backend

    program, seq, feeds = build(model, tiny=tiny)
    weights = weights_for(program, 1 << 16 if tiny else BUFFER)
    exe = prepare_segment(program, weights, get_backend(backend), [])[0]
    want = exe.run(feeds)
    getattr(exe, "release", lambda: None)()  # the split's pieces get the device to themselves
    rows = []
    for n in ranks:
        t = time.perf_counter()
        got, _ = run_ranks(ulysses(program, n, seq), weights, feeds, backend=backend)
        cos = min(cosine(got[o], want[o]) for o in program.outputs)
        rows.append({"ranks": n, "cosine_vs_unsplit": cos, "seconds": time.perf_counter() - t})
        print(f"{model}{' (tiny)' if tiny else ''}: {n} ranks in one process on {backend}: cosine {cos:.9f}")
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="klein-9b", choices=("klein-9b", "h3"))
    ap.add_argument("--gpus", default="1,2", help="GPU counts to compare, 1 first (e.g. 1,2,4)")
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", Path(__file__).parent / "results")))
    ap.add_argument("--dry-run", action="store_true", help="tiny config on the CPU, ranks in-process")
    ap.add_argument("--in-process", default=None, help="rank counts run in one process on --backend (e.g. 2,4)")
    ap.add_argument("--backend", default="cuda", help="with --in-process: the backend (cuda on one GPU, cpu)")
    ap.add_argument("--tiny", action="store_true", help="with --in-process: the tiny config")
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # a rank's work folder
    args = ap.parse_args()
    if args.dry_run or args.in_process:
        ranks = [int(c) for c in (args.in_process or "2,4").split(",")]
        tiny, backend = (True, "cpu") if args.dry_run else (args.tiny, args.backend)
        rows = in_process(args.model, tiny=tiny, backend=backend, ranks=ranks)
        if not args.dry_run:
            args.out.mkdir(parents=True, exist_ok=True)
            path = args.out / f"ulysses_inprocess_{args.model}{'_tiny' if tiny else ''}_{backend}.json"
            path.write_text(json.dumps({"tool": "perf/ulysses_forward.py --in-process", "runs": rows}, indent=2))
            print(f"-> {path}")
        if min(r["cosine_vs_unsplit"] for r in rows) < 0.999:
            raise SystemExit("the split's output is off (cosine < 0.999)")
        return
    if args.worker is not None:
        args.work = args.worker
        worker(args)
        return
    from dif.parallel.launch import launch

    counts = [int(c) for c in args.gpus.split(",")]
    if counts[0] != 1:
        raise SystemExit("--gpus must start with 1 (the baseline)")
    report: dict[str, Any] = {"tool": "perf/ulysses_forward.py", "model": args.model, "iters": args.iters, "runs": []}
    with tempfile.TemporaryDirectory() as work:
        argv = [sys.executable, __file__, "--model", args.model, "--iters", str(args.iters), "--worker", work]
        for n in counts:
            code = (
                subprocess.call(argv, env={**os.environ, "WORLD_SIZE": "1", "RANK": "0"}) if n == 1 else launch(n, argv)
            )
            if code:
                report["runs"].append({"gpus": n, "failed": f"exit status {code}"})
                continue
            run = json.loads((Path(work) / f"time{n}.json").read_text())
            outs = sorted(Path(work).glob(f"out{n}_*.npy"))
            base = sorted(Path(work).glob("out1_*.npy"))
            run["cosine_vs_1"] = min(cosine(np.load(a), np.load(b)) for a, b in zip(outs, base, strict=True))
            first = report["runs"][0].get("median_s") if report["runs"] else None
            run["speedup_vs_1"] = first / run["median_s"] if first else None
            report["runs"].append(run)
            print(f"{args.model} on {n} GPU(s): {run['median_s'] * 1e3:.1f} ms/forward, "
                  f"speed-up {run['speedup_vs_1'] or 0:.2f}x, cosine {run['cosine_vs_1']:.6f}")  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    path = args.out / f"ulysses_{args.model}.json"
    path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"-> {path}")


if __name__ == "__main__":
    main()
