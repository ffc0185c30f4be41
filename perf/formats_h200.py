"""Physical formats on the H200 (issue 17): FLUX.2 [klein] denoiser one forward at 1024^2 in bf16 against fp8-e4m3 /
int8 / int4-group W8A8 / weight-only (dif.passes.quantize), and prompt -> PNG, 4 steps, bf16 against fp8 with the
format search's numerical gate over the whole schedule. Random weights from the real configs.

Phases (one device call each; both write JSON under perf/results/formats/ and $OUT when set):

- `step`: the denoiser (perf/denoiser_models.py builds diffusers' model with seeded random weights and dif's
  program; dif gets the same tensors as host arrays, so the fp8 / int8 / int4 weights are derived at load as in
  the product path). Per format: prepare time (incl. the load-time quantization), median CUDA-event forward,
  parameter and arena bytes, the lowering's choices, cosine / rel-L2 of the output against dif bf16 and against
  diffusers eager; diffusers eager (and `--compile`: torch.compile) forward in the same run.
- `pipeline`: dif's Flux2Pipeline over seeded random tensors for the transformer, the Qwen3 text encoder and the
  VAE (pools of N(0, 1/fan_in) values, no torch model, no file written), bf16 and each format in turn: the gate
  (per-step teacher-forced cosine / rel-L2, final image PSNR / SSIM against bf16) and the warm prompt -> PNG wall
  (median of `--runs`), side-by-side JPEGs. A format converts the denoiser's programs only (the default
  `DIF_FORMAT_STAGES`); `fp8-e4m3@all` in `--formats` runs it over every program, the text encoder's included.

`fp8-e4m3+attention` also puts the attention on fp8 matrix units (`quantize_fp8_attention`, cuDNN's fp8 flash
attention), as the format search names that candidate.

`--tiny` runs both on the CPU at miniature configs (fp8 / int8 emulated by the references) to check the script
(results to $OUT only).

    python perf/formats_h200.py --phase step --models klein-9b,klein-4b --formats fp8-e4m3,int8,int4-group
    python perf/formats_h200.py --phase pipeline --models klein-9b --formats fp8-e4m3,fp8-e4m3@all
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import os
import sys
import time
import traceback
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

RESULTS = HERE / "results" / "formats"
TINY = False  # set by main: --tiny results go to $OUT only
PROMPT = "a red fox sitting in fresh snow at golden hour, photograph, shallow depth of field"


def destinations() -> list[Path]:
    """perf/results/formats/ (not for --tiny checks) and $OUT when set."""
    out = [Path(os.environ["OUT"])] if os.environ.get("OUT") else []
    return out if TINY else [RESULTS, *out]


def save(name: str, data: dict[str, Any]) -> None:
    text = json.dumps(data, indent=1, default=str)
    for folder in destinations():
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{name}.tmp"
        tmp.write_text(text)
        tmp.replace(folder / name)


def format_passes(fmt: str) -> tuple[str, ...]:
    """The format passes of `fmt`: a format search candidate (`fp8-e4m3+attention`: the linears and the
    attention in fp8, `dif.passes.quantize.candidate_passes`), or `bf16` for none."""
    from dif.passes.quantize import candidate_passes

    return () if fmt == "bf16" else candidate_passes(fmt)


def compare(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    from dif.quality.format_gate import cosine, rel_l2

    return {"cosine": round(cosine(a, b), 6), "rel_l2": round(rel_l2(a, b), 6)}


def choice_counts(exe: Any) -> dict[str, int]:
    """How many nodes took each path (the lowering's choice text up to its first parenthesis)."""
    choices = getattr(exe, "choices", {}) or {}
    return dict(Counter(str(c).split(" (")[0] for c in choices.values()))


# -- phase step: one denoiser forward ----------------------------------------------------------------------


def step_phase(args: argparse.Namespace) -> None:
    import torch
    from denoiser_models import canonical, make_case, to_numpy
    from dif_device_bridge import Device, cuda_event_times

    from dif.passes import DEFAULT_PASSES, optimize, summarize
    from dif.plan.planner import plan_program
    from dif.weights.quantized import with_quantized_weights

    dev = Device("cpu" if args.tiny else "cuda")
    backend = dev.backend()
    profile = backend.profile()
    formats = [f for f in args.formats.split(",") if f]
    for name in [canonical(m) for m in args.models.split(",")]:
        out: dict[str, Any] = {"model": name, "tiny": args.tiny, "device": dev.name(), "formats": {}}
        out["profile"] = {"arch": profile.arch, "tensor_core_formats": list(profile.tensor_core_formats),
                          "libraries": dict(profile.libraries)}  # fmt: skip
        torch.set_grad_enabled(False)
        case = make_case(name, dev.torch_device, args.tiny)
        out["tokens"] = case.tokens
        ref = to_numpy(case.model(**case.kwargs)[0])
        ms, _ = dev.torch_median(functools.partial(case.model, **case.kwargs), args.iters, 3)
        out["diffusers_eager_ms"] = round(ms, 3)
        if args.compile:
            compiled = functools.partial(torch.compile(case.model), **case.kwargs)
            t0 = time.perf_counter()
            compiled()
            out["diffusers_compile_s"] = round(time.perf_counter() - t0, 1)
            out["diffusers_compile_ms"] = round(dev.torch_median(compiled, args.iters, 3)[0], 3)
            del compiled
        state = case.model.state_dict()
        weights = {p.name: to_numpy(state[p.name]) for p in case.program.params}
        del state, case.model
        gc.collect()
        dev.empty_cache()
        save(f"step_{name}{'-tiny' if args.tiny else ''}.json", out)
        base_out = None
        for fmt in ["bf16", *formats]:
            res: dict[str, Any] = {}
            passes = DEFAULT_PASSES + format_passes(fmt)
            try:
                program, decisions = optimize(case.program, target=profile, passes=passes)
                res["pass_decisions"] = [f"{d.what}: {d.why}" for d in summarize(decisions, passes)
                                         if d.what.startswith(("quantize", "passes"))]  # fmt: skip
                plan = plan_program(program, profile, backend.budget())
                res.update(param_bytes=plan.param_bytes, arena_bytes=plan.arena_bytes)
                free0 = dev.free_bytes()
                t0 = time.perf_counter()
                exe = backend.prepare(program, plan, with_quantized_weights(program, weights))
                res["prepare_s"] = round(time.perf_counter() - t0, 2)
                res["device_gib"] = round((free0 - dev.free_bytes()) / 2**30, 2) if free0 else None
                got = np.asarray(exe.run(case.inputs)[program.outputs[0]])
                if dev.kind == "cuda":
                    times = cuda_event_times(exe, args.iters, 3)
                else:
                    times = []
                    for _ in range(max(1, min(args.iters, 3))):
                        t0 = time.perf_counter()
                        exe.run(case.inputs)
                        times.append((time.perf_counter() - t0) * 1e3)
                res["ms"] = round(float(np.median(times)), 3)
                res["times_ms"] = [round(t, 3) for t in times]
                res["choices"] = choice_counts(exe)
                if dev.kind == "cuda":  # eager, an event after every step: where the graph's time goes
                    res["by_op"] = {k: round(v["ms"], 3) for k, v in exe.profile(iters=2).items()}
                    by_shape = list(exe.profile(iters=2, by="shape").items())[:16]
                    res["by_shape"] = {k: round(v["ms"], 3) for k, v in by_shape}
                    by_step = list(exe.profile(iters=2, by="step").items())[:24]  # the steps of each lowering
                    res["by_step"] = {k: round(v["ms"], 3) for k, v in by_step}
                res["vs_diffusers_eager"] = compare(got, ref)
                if base_out is None:
                    base_out = got
                else:
                    res["vs_dif_bf16"] = compare(got, base_out)
                del exe
            except Exception as exc:  # one format failing must not lose the others
                res["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                res["traceback"] = traceback.format_exc()[-4000:]
            gc.collect()
            out["formats"][fmt] = res
            save(f"step_{name}{'-tiny' if args.tiny else ''}.json", out)
        print_step(out)


def print_step(out: dict[str, Any]) -> None:
    print(f"\n{out['model']} one forward ({out['tokens']}), diffusers eager {out['diffusers_eager_ms']} ms"
          + (f", compile {out['diffusers_compile_ms']} ms" if "diffusers_compile_ms" in out else ""))  # fmt: skip
    print(f"{'format':12} {'ms':>9} {'params GiB':>11} {'prepare s':>10} {'cos vs bf16':>12} {'relL2':>8}  choices")
    for fmt, r in out["formats"].items():
        if "error" in r:
            print(f"{fmt:12} error: {r['error'][:200]}")
            continue
        v = r.get("vs_dif_bf16", {"cosine": 1.0, "rel_l2": 0.0})
        print(f"{fmt:12} {r['ms']:9.2f} {r['param_bytes'] / 2**30:11.2f} {r['prepare_s']:10.1f} "
              f"{v['cosine']:12.5f} {v['rel_l2']:8.4f}  {r['choices']}")  # fmt: skip


# -- phase pipeline: prompt -> PNG with the gate over the schedule --------------------------------------------


class Pools:
    """Seeded N(center, scale^2) values, one pool per key, grown to the largest tensor asked of it: tensors are
    views into them (another window for every tensor), so a 30 GB checkpoint costs a few GB of draws."""

    def __init__(self, seed: int) -> None:
        self._pools: dict[tuple[Any, ...], np.ndarray] = {}
        self._rng = np.random.default_rng(seed)

    def get(self, key: tuple[Any, ...], size: int, scale: float, center: float, dtype: str) -> np.ndarray:
        import ml_dtypes

        have = self._pools.get(key)
        if have is None or have.size < size:
            raw = self._rng.standard_normal(size + (1 << 16), dtype=np.float32) * np.float32(scale)
            raw += np.float32(center)
            have = self._pools[key] = raw.astype(ml_dtypes.bfloat16 if dtype == "BF16" else np.float32)
        return have


def pool_source(table: dict[str, tuple[tuple[int, ...], str]], label: str, seed: int) -> Any:
    """A dif tensor source of seeded random tensors of `table` (name -> (shape, safetensors dtype)): weights
    N(0, 1/fan_in), 1-D norm weights and running variances 1 + N(0, 0.1^2), other 1-D tensors N(0, 0.02^2),
    integer tensors zero. Nothing is copied until a backend reads a tensor."""
    from dif.weights import TensorInfo, TensorSource

    class Source(TensorSource):
        def __init__(self) -> None:
            self.label = label
            self._pools = Pools(seed)
            self._order = {name: i for i, name in enumerate(table)}

        def names(self) -> list[str]:
            return list(table)

        def __contains__(self, name: object) -> bool:
            return name in table

        def info(self, name: str) -> TensorInfo:
            shape, dtype = table[name]
            nbytes = int(np.prod(shape)) * {"BF16": 2, "F32": 4, "I64": 8}[dtype]
            return TensorInfo(name, dtype, shape, 0, nbytes, Path(label))

        def _load(self, name: str) -> np.ndarray:
            shape, dtype = table[name]
            if dtype == "I64":
                return np.zeros(shape, np.int64)
            size = int(np.prod(shape))
            if len(shape) <= 1:
                one = ("norm" in name and name.endswith("weight")) or "running_var" in name
                pool = self._pools.get(("1d", one, dtype), size, 0.1 if one else 0.02, 1.0 if one else 0.0, dtype)
            else:
                fan_in = int(np.prod(shape[1:]))
                pool = self._pools.get(("w", fan_in, dtype), size, fan_in**-0.5, 0.0, dtype)
            start = (self._order[name] * 7919) % (pool.size - size + 1)
            return pool[start : start + size].reshape(shape)

    return Source()


def state_table(cls: Any, config: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str]]:
    """name -> (shape, safetensors dtype) of `cls.from_config(config)`'s state dict, built on the meta device
    (no memory), bf16 except the modules the class keeps in fp32."""
    import torch

    with torch.device("meta"):
        model = cls.from_config(config) if hasattr(cls, "from_config") else cls(config)
    keep = set(getattr(model, "_keep_in_fp32_modules", None) or [])
    out = {}
    for name, t in model.state_dict().items():
        if not t.is_floating_point():
            out[name] = (tuple(t.shape), "I64")
            continue
        fp32 = any(k in name.split(".") for k in keep)
        out[name] = (tuple(t.shape), "F32" if fp32 else "BF16")
    return out


def pipeline_phase(args: argparse.Namespace) -> None:
    import tempfile

    from pipeline_wall import TEXT_ENCODERS, dif_once, klein_configs, write_config_folder

    from dif.dtypes import DType
    from dif.passes.formats_search import passes_appended
    from dif.quality.format_gate import GateConfig, judge, record_run
    from dif_frontend_flux2.config import load_configs
    from dif_frontend_flux2.pipeline import Flux2Pipeline
    from dif_frontend_flux2.weights import Flux2Checkpoint

    formats = [f for f in args.formats.split(",") if f]
    size = 256 if args.tiny else 1024
    backend = "cpu" if args.tiny else "cuda"
    for name in args.models.split(","):
        name = {"9b": "klein-9b", "4b": "klein-4b"}.get(name, name)
        root = write_config_folder(Path(tempfile.mkdtemp(prefix=f"formats-{name}-")), klein_configs(name, args.tiny))
        configs = load_configs(root)
        sources = component_sources(root, name, args.tiny, TEXT_ENCODERS)
        checkpoint = Flux2Checkpoint(root, name, "diffusers", configs, root / "tokenizer", sources["transformer"],
                                     sources["text_encoder"], sources["vae"])  # fmt: skip
        out: dict[str, Any] = {"model": name, "size": size, "steps": 4, "tiny": args.tiny, "formats": {}}
        noise = np.random.default_rng(0).standard_normal((1, (size // 16) ** 2, 128)).astype(DType.BF16.np)
        base = None
        images: dict[str, np.ndarray] = {}
        for spec in ["bf16", *formats]:
            fmt, _, scope = spec.partition("@")  # fp8-e4m3@all: the text encoder (and decoder) in fp8 too
            scope = scope or "denoise"
            res: dict[str, Any] = {"format_stages": scope}
            try:
                with passes_appended(format_passes(fmt), scope):
                    pipe = Flux2Pipeline(checkpoint, dtype=DType.BF16, backend=backend)
                    t0 = time.perf_counter()
                    pipe.prepare_all(size, size)
                    res["prepare_s"] = round(time.perf_counter() - t0, 2)
                    record = record_run(pipe, PROMPT, width=size, height=size, steps=4, seed=0, teacher=base)
                    res["forward_ms"] = [round(t * 1e3, 2) for t in record.forward_seconds]
                    dif_once(pipe, noise, size)  # warm
                    totals, stages = [], []
                    for _ in range(args.runs):
                        st, pixels = dif_once(pipe, noise, size)
                        totals.append(st["total"])
                        stages.append(st)
                    res["total_s"] = round(float(np.median(totals)), 4)
                    res["totals_s"] = [round(t, 4) for t in totals]
                    res["stages_s"] = {k: round(float(np.median([s[k] for s in stages])), 4) for k in stages[0]}
                    res["memory"] = pipe.memory_report()
                    res["decode_probe"] = decode_probe(pipe, noise, size)
                    images[spec.replace("@", "-")] = record.image
                    if base is None:
                        base = record
                    else:
                        gate = judge(base.step_outputs, record.forced_outputs, GateConfig(),
                                     reference_image=base.image, candidate_image=record.image)  # fmt: skip
                        res["gate"] = gate.to_dict()
                    del pipe
            except Exception as exc:
                res["error"] = f"{type(exc).__name__}: {exc}"[:2000]
                res["traceback"] = traceback.format_exc()[-4000:]
            gc.collect()
            out["formats"][spec] = res
            save(f"pipeline_{name}{'-tiny' if args.tiny else ''}.json", out)
        save_jpegs(name + ("-tiny" if args.tiny else ""), images)
        print(f"\n{name} prompt -> PNG, {size}^2, 4 steps, warm")
        for fmt, r in out["formats"].items():
            if "error" in r:
                print(f"{fmt:12} error: {r['error'][:300]}")
                continue
            g = r.get("gate")
            gate = ""
            if g is not None:
                gate = f"gate {'pass' if g['passed'] else 'FAIL'}: cos {g['worst_cosine']:.5f} "
                gate += f"relL2 {g['worst_rel_l2']:.4f} PSNR {g['psnr_db']} SSIM {g['ssim']}"
            print(f"{fmt:12} {r['total_s']:.3f} s  {gate}")


def decode_probe(pipe: Any, noise: np.ndarray, size: int) -> dict[str, Any]:
    """Where the pipeline's decode stage goes, on its own prepared decoder: `pipe.decode` timed alone, and on
    CUDA the decoder's executable (graph captured or not, its replay time, the eager per-op split by shape)."""
    grid = size // pipe.pixels_per_token
    times = []
    for _ in range(4):
        t0 = time.perf_counter()
        pipe.decode(noise, grid, grid)
        times.append(time.perf_counter() - t0)
    out: dict[str, Any] = {"decode_s": [round(t, 4) for t in times]}
    exe = pipe._programs.prepared().get("flux2_vae_decoder")
    if getattr(exe, "backend", None) is None or not hasattr(exe, "describe"):  # the CUDA executable's only
        return out
    from dif_device_bridge import cuda_event_times

    out["describe"] = exe.describe()
    out["replay_ms"] = [round(t, 3) for t in cuda_event_times(exe, 5, 0)]
    out["profile_by_shape"] = dict(list(exe.profile(iters=2, by="shape").items())[:20])
    return out


def component_sources(root: Path, name: str, tiny: bool, text_encoders: dict[str, Any]) -> dict[str, Any]:
    from diffusers import AutoencoderKLFlux2, Flux2Transformer2DModel
    from transformers import Qwen3Config, Qwen3ForCausalLM

    def read(rel: str) -> dict[str, Any]:
        return dict(json.loads((root / rel).read_text()))

    te_cfg = Qwen3Config(**{k: v for k, v in read("text_encoder/config.json").items() if not k.startswith("_")})

    def te_table() -> dict[str, tuple[tuple[int, ...], str]]:
        import torch

        with torch.device("meta"):
            model = Qwen3ForCausalLM(te_cfg)
        return {n: (tuple(t.shape), "BF16") for n, t in model.state_dict().items()}

    return {
        "transformer": pool_source(state_table(Flux2Transformer2DModel, read("transformer/config.json")),
                                   f"<random transformer of {name}>", 1),
        "text_encoder": pool_source(te_table(), f"<random text encoder of {name}>", 2),
        "vae": pool_source(state_table(AutoencoderKLFlux2, read("vae/config.json")), f"<random vae of {name}>", 3),
    }  # fmt: skip


def save_jpegs(name: str, images: dict[str, np.ndarray]) -> None:
    """Each format's image and one side by side (bf16 first), small JPEGs (quality 85, at most 512 px tall)."""
    from PIL import Image

    if not images:
        return
    row = np.concatenate(list(images.values()), axis=1)
    for folder in destinations():
        folder.mkdir(parents=True, exist_ok=True)
        img = Image.fromarray(row)
        if img.height > 512:
            img = img.resize((img.width * 512 // img.height, 512))
        img.save(folder / f"pipeline_{name}_{'_vs_'.join(images)}.jpg", quality=85)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--phase", choices=("step", "pipeline", "both"), default="both")
    ap.add_argument("--models", default="klein-9b")
    ap.add_argument("--formats", default="fp8-e4m3,int8,int4-group")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--runs", type=int, default=3, help="timed prompt -> PNG runs per format")
    ap.add_argument("--compile", action="store_true", help="also time diffusers under torch.compile (step)")
    ap.add_argument("--tiny", action="store_true", help="miniature configs on the CPU (checks the script)")
    args = ap.parse_args(argv)
    global TINY
    TINY = args.tiny
    if args.phase in ("step", "both"):
        step_phase(args)
    if args.phase in ("pipeline", "both"):
        pipeline_phase(args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
