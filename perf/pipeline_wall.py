"""Prompt -> PNG wall time of FLUX.2 [klein], 4 steps: diffusers' Flux2KleinPipeline (eager, and with the
transformer under torch.compile) vs dif's own Flux2Pipeline, on the SAME seeded random weights, plus one run
of the real `dif flux2 generate` command in a fresh process.

Benchmark support, called by `perf/bench_denoiser.py --pipeline` (one script, one device call). The diffusers
pipeline is built from the full-size configs (transformer from denoiser_models, Qwen3 text encoder and VAE
below; shared/model-configs does not travel to the GPU machine) with the embedded demo checkpoint's real Qwen
tokenizer files. dif reads the same torch tensors through `TorchSource`, an in-memory `dif.weights`
source that `perf/dif_device_bridge.py` copies device to device, so no 34 GB of safetensors is written
(`--pipeline-cli-full` writes them, for a cold CLI run on the full-size folder). Both sides start from the
same bf16 initial noise. Measured warm (after one untimed run), per run: tokenize (also timed alone),
encode, each denoising step, VAE decode (+ conversion to pixels), PNG encode, total; peak device memory.
Stage times of diffusers come from CUDA events recorded at the stage boundaries (no added syncs); dif's
runs return host arrays, so its stages are wall-clock.
"""

from __future__ import annotations

import gc
import io
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from denoiser_models import CONFIGS, make_model, perturb_constants, to_numpy, to_torch
from dif_device_bridge import Device, DeviceWeight

from dif.weights import TensorInfo, TensorSource

PROMPT = "a red fox sitting in fresh snow at golden hour, photograph, shallow depth of field"
STEPS = 4
SEED = 0
FULL_SIZE, TINY_SIZE = 1024, 256  # pixels per side; the tiny CPU check keeps the VAE cheap

# The klein configs besides the transformer (shared/model-configs/flux2-klein-{4b,9b}); `layer_types` is left
# out (36 x "full_attention", transformers' default for Qwen3).
QWEN3_COMMON: dict[str, Any] = {
    "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0,
    "bos_token_id": 151643, "dtype": "bfloat16", "eos_token_id": 151645, "head_dim": 128, "hidden_act": "silu",
    "initializer_range": 0.02, "max_position_embeddings": 40960, "max_window_layers": 36, "model_type": "qwen3",
    "num_attention_heads": 32, "num_hidden_layers": 36, "num_key_value_heads": 8, "rms_norm_eps": 1e-06,
    "rope_scaling": None, "rope_theta": 1000000, "sliding_window": None, "use_cache": True,
    "use_sliding_window": False, "vocab_size": 151936,
}  # fmt: skip
TEXT_ENCODERS: dict[str, dict[str, Any]] = {
    "klein-4b": {**QWEN3_COMMON, "hidden_size": 2560, "intermediate_size": 9728, "tie_word_embeddings": True},
    "klein-9b": {**QWEN3_COMMON, "hidden_size": 4096, "intermediate_size": 12288, "tie_word_embeddings": False},
}
VAE: dict[str, Any] = {
    "_class_name": "AutoencoderKLFlux2", "act_fn": "silu", "batch_norm_eps": 0.0001, "batch_norm_momentum": 0.1,
    "block_out_channels": [128, 256, 512, 512], "down_block_types": ["DownEncoderBlock2D"] * 4, "force_upcast": True,
    "in_channels": 3, "latent_channels": 32, "layers_per_block": 2, "mid_block_add_attention": True,
    "norm_num_groups": 32, "out_channels": 3, "patch_size": [2, 2], "sample_size": 1024,
    "up_block_types": ["UpDecoderBlock2D"] * 4, "use_post_quant_conv": True, "use_quant_conv": True,
}  # fmt: skip
SCHEDULER: dict[str, Any] = {
    "_class_name": "FlowMatchEulerDiscreteScheduler", "base_image_seq_len": 256, "base_shift": 0.5,
    "invert_sigmas": False, "max_image_seq_len": 4096, "max_shift": 1.15, "num_train_timesteps": 1000, "shift": 3.0,
    "shift_terminal": None, "stochastic_sampling": False, "time_shift_type": "exponential", "use_beta_sigmas": False,
    "use_dynamic_shifting": True, "use_exponential_sigmas": False, "use_karras_sigmas": False,
}  # fmt: skip
MODEL_INDEX: dict[str, Any] = {
    "_class_name": "Flux2KleinPipeline", "is_distilled": True,
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"], "text_encoder": ["transformers", "Qwen3ForCausalLM"],
    "tokenizer": ["transformers", "Qwen2TokenizerFast"], "transformer": ["diffusers", "Flux2Transformer2DModel"],
    "vae": ["diffusers", "AutoencoderKLFlux2"],
}  # fmt: skip
CONFIG_FILES = {
    "model_index": "model_index.json",
    "transformer": "transformer/config.json",
    "text_encoder": "text_encoder/config.json",
    "vae": "vae/config.json",
    "scheduler": "scheduler/scheduler_config.json",
}


def klein_configs(name: str, tiny: bool) -> dict[str, dict[str, Any]]:
    """The five configs of one klein checkpoint: full size, or (tiny) those of dif's embedded demo model, whose
    transformer matches its 28-layer, 8-wide text encoder (the denoiser bench's tiny transformer does not)."""
    from dif_frontend_flux2 import DEFAULT_CHECKPOINT

    if tiny:
        return {k: json.loads((DEFAULT_CHECKPOINT / f).read_text()) for k, f in CONFIG_FILES.items()}
    return {"model_index": MODEL_INDEX, "transformer": CONFIGS[name], "text_encoder": TEXT_ENCODERS[name],
            "vae": VAE, "scheduler": SCHEDULER}  # fmt: skip


def write_config_folder(root: Path, configs: dict[str, dict[str, Any]]) -> Path:
    """A diffusers-layout folder with the configs and the demo checkpoint's Qwen tokenizer files, no weights:
    what dif's `Flux2Checkpoint` reads besides the tensors (which come from `TorchSource`)."""
    from dif_frontend_flux2 import DEFAULT_CHECKPOINT

    for key, rel in CONFIG_FILES.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(configs[key], indent=1))
    shutil.copytree(DEFAULT_CHECKPOINT / "tokenizer", root / "tokenizer", dirs_exist_ok=True)
    return root


# -- weights -----------------------------------------------------------------------------------------------


class TorchSource(TensorSource):
    """A torch module's state dict as a dif tensor source, by state-dict name: on CUDA each tensor is handed
    out as the bridge's `DeviceWeight` (copied device to device inside `Device.bridge()`), on CPU as a numpy
    array. Nothing is copied until dif's backend uploads it."""

    def __init__(self, module: Any, dev: Device, label: str) -> None:
        self._state = module.state_dict()
        self._cuda = dev.kind == "cuda"
        self.label = label

    def names(self) -> list[str]:
        return list(self._state)

    def __contains__(self, name: object) -> bool:
        return name in self._state

    def info(self, name: str) -> TensorInfo:
        t = self._state[name]
        nbytes = t.numel() * t.element_size()
        return TensorInfo(name, dtype_names(t.dtype)[0], tuple(t.shape), 0, nbytes, Path(self.label))

    def _load(self, name: str) -> Any:
        t = self._state[name]
        return DeviceWeight(t, dtype_names(t.dtype)[1]) if self._cuda else to_numpy(t)


def dtype_names(torch_dtype: Any) -> tuple[str, np.dtype]:
    """(safetensors dtype name, numpy dtype) of a floating torch dtype."""
    import ml_dtypes
    import torch

    table = {torch.bfloat16: ("BF16", ml_dtypes.bfloat16), torch.float32: ("F32", np.float32),
             torch.float16: ("F16", np.float16)}  # fmt: skip
    if torch_dtype not in table:
        raise TypeError(f"torch dtype {torch_dtype} has no dif equivalent here")
    name, np_dtype = table[torch_dtype]
    return name, np.dtype(np_dtype)


def make_text_encoder(config: dict[str, Any], device: Any, seed: int) -> Any:
    """Qwen3ForCausalLM with seeded init built directly in bf16 (as from_pretrained(torch_dtype=bf16) builds
    it, so the RoPE frequencies stay fp32), constant tensors (RMSNorm weights) perturbed."""
    import torch
    import transformers

    torch.manual_seed(seed)
    previous = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        with torch.device(device):
            model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**config))
    finally:
        torch.set_default_dtype(previous)
    model.eval()
    perturb_constants(model, device, seed + 1)
    return model


def make_vae(config: dict[str, Any], device: Any, seed: int) -> Any:
    """AutoencoderKLFlux2 like the transformer (`make_model`), with its BatchNorm statistics (buffers the
    pipeline uses to de-normalise latents) perturbed as well."""
    from diffusers import AutoencoderKLFlux2

    vae = make_model(AutoencoderKLFlux2, config, device, seed)
    perturb_constants(vae, device, seed + 2, buffers=True)
    return vae


# -- timing helpers ----------------------------------------------------------------------------------------


class Timeline:
    """Named marks on one run: CUDA events on torch's current stream (read after the run, so marking adds no
    sync) or wall clock on CPU. `durations()` gives the seconds between consecutive marks."""

    def __init__(self, dev: Device) -> None:
        self.cuda = dev.kind == "cuda"
        self.marks: list[tuple[str, Any]] = []
        self.mark("start")

    def mark(self, name: str) -> None:
        if self.cuda:
            import torch

            event = torch.cuda.Event(enable_timing=True)
            event.record()
            self.marks.append((name, event))
        else:
            self.marks.append((name, time.perf_counter()))

    def durations(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for (_, a), (name, b) in zip(self.marks, self.marks[1:], strict=False):
            if self.cuda:
                b.synchronize()
                out[name] = a.elapsed_time(b) / 1e3
            else:
                out[name] = b - a
        return out


def median_stages(runs: list[dict[str, float]]) -> dict[str, float]:
    """Per-key median (seconds, rounded) over runs with the same keys."""
    return {k: round(float(np.median([r[k] for r in runs])), 4) for k in runs[0]}


def tokenize_s(fn: Callable[[], Any], repeats: int = 5) -> float:
    """Median seconds of `fn` (tokenization alone: it is also inside each pipeline's encode stage)."""
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return round(float(np.median(times)), 5)


def pixel_parity(a: np.ndarray, b: np.ndarray) -> dict[str, Any]:
    """How far two uint8 images are apart: max / mean absolute difference and cosine of the centred values."""
    if a.shape != b.shape:
        return {"shapes": [list(a.shape), list(b.shape)]}
    fa, fb = a.astype(np.float64) - 127.5, b.astype(np.float64) - 127.5
    cos = float((fa * fb).sum() / max(np.linalg.norm(fa) * np.linalg.norm(fb), 1e-300))
    diff = np.abs(a.astype(np.int16) - b.astype(np.int16))
    return {"max_abs": int(diff.max()), "mean_abs": round(float(diff.mean()), 4), "cosine": cos,
            "within_2": round(float((diff <= 2).mean()), 5)}  # fmt: skip


# -- diffusers ---------------------------------------------------------------------------------------------


def diffusers_pipeline(transformer: Any, text_encoder: Any, vae: Any, configs: dict[str, Any], root: Path) -> Any:
    from diffusers import FlowMatchEulerDiscreteScheduler, Flux2KleinPipeline
    from transformers import Qwen2TokenizerFast

    pipe = Flux2KleinPipeline(
        scheduler=FlowMatchEulerDiscreteScheduler.from_config(configs["scheduler"]),
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=Qwen2TokenizerFast.from_pretrained(root / "tokenizer"),
        transformer=transformer,
        is_distilled=True,
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def diffusers_once(pipe: Any, noise: Any, size: int, dev: Device) -> tuple[dict[str, float], np.ndarray]:
    """One prompt -> PNG run with stage marks; (seconds by stage and total, the image as uint8 pixels).

    Stages: encode (tokenize + Qwen3), step_1..step_n (step 1 also prepares latents and timesteps), decode
    (unpack + BatchNorm de-normalisation + VAE), to_pixels (postprocess to PIL: device -> host), png."""
    line = Timeline(dev)
    encode, decode = pipe.encode_prompt, pipe.vae.decode

    def timed_encode(*a: Any, **k: Any) -> Any:
        out = encode(*a, **k)
        line.mark("encode")
        return out

    def timed_decode(*a: Any, **k: Any) -> Any:
        out = decode(*a, **k)
        line.mark("decode")
        return out

    def on_step(_pipe: Any, i: int, _t: Any, _kw: dict[str, Any]) -> dict[str, Any]:
        line.mark(f"step_{i + 1}")
        return {}

    pipe.encode_prompt, pipe.vae.decode = timed_encode, timed_decode
    try:
        t0 = time.perf_counter()
        image = pipe(prompt=PROMPT, height=size, width=size, num_inference_steps=STEPS, guidance_scale=1.0,
                     latents=noise, callback_on_step_end=on_step, output_type="pil").images[0]  # fmt: skip
        line.mark("to_pixels")
        t1 = time.perf_counter()
        buf = io.BytesIO()
        image.save(buf, format="PNG")
        png = time.perf_counter() - t1
        total = time.perf_counter() - t0
    finally:
        del pipe.encode_prompt, pipe.vae.decode  # the class methods again
    stages = line.durations()
    stages.update(png=png, total=total)
    return stages, np.asarray(image)


def timed_runs(once: Callable[[], dict[str, float]], runs: int, budget_s: float) -> list[dict[str, float]]:
    """Stage times of up to `runs` runs of `once`, stopping early (after at least one) once they have taken
    `budget_s` seconds: a slow pipeline must not eat the device call."""
    times: list[dict[str, float]] = []
    while len(times) < runs and (not times or sum(t["total"] for t in times) < budget_s):
        times.append(once())
    return times


def time_diffusers(pipe: Any, noise: Any, size: int, dev: Device, args: Any) -> tuple[dict[str, Any], np.ndarray]:
    """First run (untimed warm-up; with a compiled transformer it compiles), then the timed runs."""
    t0 = time.perf_counter()
    _, pixels = diffusers_once(pipe, noise, size, dev)
    res: dict[str, Any] = {"first_run_s": round(time.perf_counter() - t0, 2)}
    dev.reset_peak()
    times = timed_runs(lambda: diffusers_once(pipe, noise, size, dev)[0], args.pipeline_iters, args.budget_s)
    res["peak_gib"] = dev.peak_gib()
    res["stages_s"] = median_stages(times)
    res["total_s"] = res["stages_s"]["total"]
    res["totals_s"] = [round(t["total"], 4) for t in times]
    return res, pixels


# -- dif ---------------------------------------------------------------------------------------------------


def dif_pipeline(root: Path, parts: dict[str, Any], dev: Device, name: str) -> Any:
    """dif's Flux2Pipeline (bf16, dif's CUDA or CPU backend) over the torch tensors of `parts`."""
    from dif.dtypes import DType
    from dif_frontend_flux2.config import load_configs
    from dif_frontend_flux2.pipeline import Flux2Pipeline
    from dif_frontend_flux2.weights import Flux2Checkpoint

    sources = {k: TorchSource(parts[k], dev, f"<torch {k} of {name}>") for k in ("transformer", "text_encoder", "vae")}
    checkpoint = Flux2Checkpoint(root, name, "diffusers", load_configs(root), root / "tokenizer",
                                 sources["transformer"], sources["text_encoder"], sources["vae"])  # fmt: skip
    return Flux2Pipeline(checkpoint, dtype=DType.BF16, backend="cuda" if dev.kind == "cuda" else "cpu")


def dif_once(pipe: Any, noise: np.ndarray, size: int) -> tuple[dict[str, float], np.ndarray]:
    """One prompt -> PNG bytes run of `Flux2Pipeline.generate` (the product path; its "load" stage only
    finds the prepared programs) plus PNG encoding with the metadata the CLI writes."""
    from dif.media.png import encode_png
    from dif.report import png_parameters
    from dif_frontend_flux2 import __version__
    from dif_frontend_flux2.pipeline import GenerationRequest

    marks: list[tuple[str, float]] = []
    pipe.on_stage = lambda stage, _s: marks.append((stage, time.perf_counter()))
    pipe.on_step = lambda i, _n, _latents: marks.append((f"step_{i}", time.perf_counter()))
    req = GenerationRequest(PROMPT, steps=STEPS, seed=SEED, width=size, height=size, init_noise=noise)
    t0 = time.perf_counter()
    result = pipe.generate(req)
    t1 = time.perf_counter()
    encode_png(result.pixels, parameters=png_parameters(result.settings, version=f"dif {__version__}"),
               metadata=result.settings)  # fmt: skip
    t2 = time.perf_counter()
    stages = {k: float(v) for k, v in result.timings.items()}
    at = dict(marks)
    prev = at["encode"]  # the denoise stage starts where encode ends
    for i in range(1, STEPS + 1):
        stages[f"step_{i}"] = at[f"step_{i}"] - prev
        prev = at[f"step_{i}"]
    stages.update(png=t2 - t1, total=t2 - t0)
    return stages, result.pixels


def time_dif(pipe: Any, noise: np.ndarray, size: int, dev: Device, args: Any) -> tuple[dict[str, Any], np.ndarray]:
    """Prepare the three programs (weights device to device), one untimed run, then the timed runs."""
    dev.empty_cache()  # torch's cache stays put from here: the drop in free memory is dif's own
    free0 = dev.free_bytes()
    t0 = time.perf_counter()
    with dev.bridge():
        pipe.prepare_all(size, size)
    res: dict[str, Any] = {"prepare_s": round(time.perf_counter() - t0, 2), "backend": pipe.backend_name}
    t0 = time.perf_counter()
    with dev.bridge():  # the programs are cached by shape; should one be prepared again, it still gets its weights
        _, pixels = dif_once(pipe, noise, size)
    res["first_run_s"] = round(time.perf_counter() - t0, 2)
    times = timed_runs(lambda: dif_once(pipe, noise, size)[0], args.pipeline_iters, args.budget_s)
    res["device_gib"] = round((free0 - dev.free_bytes()) / 2**30, 2) if free0 else None
    res["plan_peak_gib"] = round(pipe.plan_peak_bytes / 2**30, 3)
    res["stages_s"] = median_stages(times)
    res["total_s"] = res["stages_s"]["total"]
    res["totals_s"] = [round(t["total"], 4) for t in times]
    return res, pixels


# -- the whole comparison ----------------------------------------------------------------------------------


def bench_pipeline(
    name: str,
    dev: Device,
    args: Any,
    transformer: Any,
    compiled: Any,
    save: Callable[[dict[str, Any]], None],
) -> dict[str, Any]:
    """diffusers eager (+ compiled transformer) vs dif, prompt -> PNG, for klein `name`.

    `transformer` is the denoiser bench's model when its config is the pipeline's (full size), else None
    (built here); `compiled` its torch.compile wrapper from the bench, or None. `save(result)` is called
    after each phase so a timeout keeps what was measured."""
    import torch

    from dif_frontend_flux2.tokenize import MAX_LENGTH, load_tokenizer, tokenize_prompts

    configs = klein_configs(name, args.tiny)
    size = TINY_SIZE if args.tiny else FULL_SIZE
    out: dict[str, Any] = {"model": f"flux2-{name}", "prompt": PROMPT, "steps": STEPS, "size": size}
    t0 = time.perf_counter()
    device = dev.torch_device
    if transformer is None:
        from diffusers import Flux2Transformer2DModel

        transformer = make_model(Flux2Transformer2DModel, configs["transformer"], device, SEED)
    parts = {
        "transformer": transformer,
        "text_encoder": make_text_encoder(configs["text_encoder"], device, SEED + 10),
        "vae": make_vae(configs["vae"], device, SEED + 20),
    }
    out["params_billion"] = {k: round(sum(p.numel() for p in m.parameters()) / 1e9, 3) for k, m in parts.items()}
    out["build_s"] = round(time.perf_counter() - t0, 1)
    root = write_config_folder(Path(tempfile.mkdtemp(prefix=f"klein_{name}_")), configs)
    pipe = diffusers_pipeline(parts["transformer"], parts["text_encoder"], parts["vae"], configs, root)
    h = w = size // 16
    rng = np.random.default_rng(SEED)
    noise_np = rng.standard_normal((1, configs["transformer"]["in_channels"], h, w), dtype=np.float32)
    noise_np = to_bf16_exact(noise_np)  # both pipelines round the noise to bf16: hand them bf16 values
    noise_t = to_torch(noise_np, device)

    # tokenization alone (chat template + tokenizer, as each pipeline does it), and the ids both sides feed
    # their text encoders: equal ids rule out the tokenizer as the cause of any difference further on
    tok, dif_tok = pipe.tokenizer, load_tokenizer(root / "tokenizer")

    def hf_tokens() -> Any:
        text = tok.apply_chat_template([{"role": "user", "content": PROMPT}], tokenize=False,
                                       add_generation_prompt=True, enable_thinking=False)  # fmt: skip
        return tok(text, return_tensors="pt", padding="max_length", truncation=True, max_length=MAX_LENGTH)

    def dif_tokens() -> tuple[np.ndarray, np.ndarray]:
        return tokenize_prompts(dif_tok, [PROMPT])

    out["tokenize_s"] = {"diffusers": tokenize_s(hf_tokens), "dif": tokenize_s(dif_tokens)}
    ids, mask = dif_tokens()
    out["token_ids_equal"] = bool(np.array_equal(ids, hf_tokens()["input_ids"].numpy()))
    out["prompt_tokens"] = int(mask.sum())
    save(out)

    with torch.inference_mode():
        out["diffusers_eager"], ref_pixels = time_diffusers(pipe, noise_t, size, dev, args)
    print(f"[{name} pipeline] diffusers eager {out['diffusers_eager']['total_s']:.3f} s", flush=True)
    save(out)
    if compiled is not None or args.compile:
        with torch.inference_mode():
            pipe.transformer = compiled if compiled is not None else torch.compile(
                parts["transformer"], backend=args.compile_backend)  # fmt: skip
            try:
                out["diffusers_compile"], pixels = time_diffusers(pipe, noise_t, size, dev, args)
                out["diffusers_compile"]["vs_eager_pixels"] = pixel_parity(pixels, ref_pixels)
                print(f"[{name} pipeline] diffusers compile {out['diffusers_compile']['total_s']:.3f} s "
                      f"(first run {out['diffusers_compile']['first_run_s']} s)", flush=True)  # fmt: skip
            except Exception as exc:  # keep the eager and dif results
                out["diffusers_compile"] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            finally:
                pipe.transformer = parts["transformer"]
        save(out)
    if args.pipeline_cli_full:
        out["cli_full"] = cli_on_folder(pipe, root, dev, args)
        save(out)
    del pipe
    gc.collect()

    dpipe = dif_pipeline(root, parts, dev, f"flux2-{name} (random weights)")
    try:
        out["dif"], pixels = time_dif(dpipe, noise_np, size, dev, args)
        out["dif"]["vs_diffusers_eager_pixels"] = pixel_parity(pixels, ref_pixels)
        print(f"[{name} pipeline] dif {out['dif']['total_s']:.3f} s, device {out['dif']['device_gib']} GiB, "
              f"pixels vs diffusers {out['dif']['vs_diffusers_eager_pixels']}", flush=True)  # fmt: skip
    except Exception as exc:
        out["dif"] = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        print(f"[{name} pipeline] dif failed: {out['dif']['error'][:300]}", flush=True)
    out["ratios"] = pipeline_ratios(out)
    save(out)
    del dpipe, parts
    gc.collect()
    dev.empty_cache()
    shutil.rmtree(root, ignore_errors=True)
    return out


def to_bf16_exact(arr: np.ndarray) -> np.ndarray:
    """float32 values that bf16 holds exactly (round to nearest even, as torch casts)."""
    import ml_dtypes

    return arr.astype(ml_dtypes.bfloat16).astype(np.float32)


def pipeline_ratios(out: dict[str, Any]) -> dict[str, float | None]:
    """dif total / diffusers total (below 1: dif is faster), eager and compiled."""
    dif = out.get("dif", {}).get("total_s")
    ratios: dict[str, float | None] = {}
    for key in ("diffusers_eager", "diffusers_compile"):
        ref = out.get(key, {}).get("total_s")
        ratios[f"dif_over_{key.split('_')[1]}"] = round(dif / ref, 3) if dif and ref else None
    return ratios


# -- the real command --------------------------------------------------------------------------------------


def ensure_entry_points(repo: Path, folder: Path) -> list[str]:
    """Make the repo's `dif` entry points visible to importlib.metadata when its distributions are not
    installed (the GPU machine runs the working tree from PYTHONPATH, so dif's plugin manager would find no
    backend and no `dif flux2` command): one metadata-only `*.dist-info` folder per distribution under
    `folder`, which goes on sys.path and PYTHONPATH (for subprocesses). Call before dif loads its plugins.
    Returns the entry-point names added."""
    from importlib import metadata

    have = {ep.name for ep in metadata.entry_points(group="dif")}
    added: list[str] = []
    for pyproject in sorted(repo.glob("*/pyproject.toml")):
        project = tomllib.loads(pyproject.read_text()).get("project", {})
        eps = project.get("entry-points", {}).get("dif", {})
        if not eps or set(eps) <= have:
            continue
        version = project.get("version", "0")
        info = folder / f"{project['name'].replace('-', '_')}-{version}.dist-info"
        info.mkdir(parents=True, exist_ok=True)
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {project['name']}\nVersion: {version}\n")
        (info / "entry_points.txt").write_text("[dif]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()))
        added += sorted(set(eps) - have)
    if added:
        sys.path.append(str(folder))
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), str(folder)) if p)
    return added


def run_cli(out_dir: Path, backend: str, size: int, timeout_s: float, model: Path | None = None,
            dtype: str = "auto") -> dict[str, Any]:  # fmt: skip
    """`dif flux2 generate ... --json` in a fresh process (`python -m dif_tools`: the console script is not
    installed on the GPU machine): exit code, wall seconds, its JSON report, and whether the PNG decodes."""
    png = out_dir / f"cli_{'default' if model is None else model.name}.png"
    cmd = [sys.executable, "-m", "dif_tools", "flux2", "generate", "-p", PROMPT, "--backend", backend,
           "-o", str(png), "--json", "--seed", str(SEED), "-W", str(size), "-H", str(size), "--steps", str(STEPS),
           "--dtype", dtype] + (["-m", str(model)] if model is not None else [])  # fmt: skip
    res: dict[str, Any] = {"cmd": " ".join(cmd[1:]), "model": "embedded demo" if model is None else str(model)}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired as exc:
        res.update(rc=None, error=f"timed out after {timeout_s} s", stderr_tail=str(exc.stderr or "")[-2000:])
        return res
    res["wall_s"] = round(time.perf_counter() - t0, 2)
    res["rc"] = proc.returncode
    try:
        res["report"] = json.loads(proc.stdout)
    except ValueError:
        res["stdout_tail"] = proc.stdout[-2000:]
    if proc.returncode:
        res["stderr_tail"] = proc.stderr[-3000:]
    if png.is_file():
        from PIL import Image

        with Image.open(png) as im:
            res["png"] = {"bytes": png.stat().st_size, "size": list(im.size), "mode": im.mode}
    return res


def cli_on_folder(pipe: Any, root: Path, dev: Device, args: Any) -> dict[str, Any]:
    """save_pretrained the diffusers pipeline (the full-size random checkpoint, real layout) and run the
    command on it cold: what a user's first `dif flux2 generate -m FOLDER` costs, loading from disk."""
    folder = root.parent / f"{root.name}_saved"
    t0 = time.perf_counter()
    try:
        pipe.save_pretrained(folder)
    except Exception as exc:
        return {"error": f"save_pretrained: {type(exc).__name__}: {exc}"[:2000]}
    res = {"save_s": round(time.perf_counter() - t0, 1)}
    backend = "cuda" if dev.kind == "cuda" else "cpu"
    size = TINY_SIZE if args.tiny else FULL_SIZE
    res.update(run_cli(Path(tempfile.gettempdir()), backend, size, args.cli_timeout_s, model=folder, dtype="bf16"))
    shutil.rmtree(folder, ignore_errors=True)
    return res
