"""MiniMax-H3 t2va at reduced size, prompt -> saved MP4 in fresh processes: `dif h3 generate` vs diffusers.

Issue 15's must-show: a whole text-to-video+audio run timed end to end beside diffusers' modular MiniMax-H3
pipeline, both reading one checkpoint folder on disk (page cache warm).

The checkpoint (diffusers' layout, seeded random weights, written by diffusers / transformers
`save_pretrained`) keeps every published width (hidden sizes, heads, head dims, FFN dims, vocabulary, the
full-size video VAE and audio VAE) but fewer layers, because the whole 33B DiT + 32B text encoder (130 GB bf16)
cannot be written to the GPU machine's 64 GB disk: `--dit-layers` DiT blocks and `--refiner-layers` text
refiner blocks, `--text-layers` Qwen3-VL text layers tapped at hidden_states[text_layers - 1]
(`text_encoder_layer` in model_index.json, a dif key; the real model taps 50 of 64), `--vision-layers` vision
blocks (unused by t2va). DiT and text encoder are stored bf16 (the published dtype) with diffusers'
`_keep_in_fp32_modules` in fp32; the VAEs likewise with `--vae-dtype bf16` (the default: what diffusers loads
under torch_dtype=bf16; the release stores them fp32, `--vae-dtype fp32`). The tokenizer is the real Qwen one
the embedded default ships; processor/ (which diffusers' text step loads) holds the published processor configs.
At the defaults (4 DiT + 1 refiner blocks, 4 text layers, 1 vision block, bf16 VAEs): 9.41 B parameters, about
19.5 GB on disk: DiT 3.04 B (6.1 GB), text encoder 3.62 B (7.2 GB; embeddings + lm_head are 1.56 B of it), video
VAE 2.60 B (5.6 GB), audio VAE 0.15 B (fp32, 0.6 GB). `--steps` defaults to 8 grid points (7 DiT forwards), not
the published 50.

Timed per run, each in a fresh process (`--repeats R` after one warm-up run per side, reported apart and left
out of the medians; the sides alternate): the wall time from the process's start to its exit with the MP4
saved.
  dif        python3 -m dif_tools h3 generate -m FOLDER ... --backend cuda --json   (its stages and memory plan)
  diffusers  this script --diffusers-run: ModularPipeline.from_pretrained(FOLDER, workflow="t2va"),
             load_components(torch_dtype=bf16), .to(device), one call, then H.264 yuv420p (CRF 18) + AAC stereo
             32 kHz at 24 fps muxed here with PyAV; import / load / generate / save phases and peak device memory
Both MP4s are decoded with PyAV (frames, streams, mean pixel value, audio RMS: a black or NaN output shows).
Device memory: torch.cuda.max_memory_allocated inside the diffusers run, and the GPU's used memory sampled
(NVML or nvidia-smi, every 0.2 s) over each run of either side, less what was in use before it.

Two things diffusers refuses at this size are lifted inside the diffusers run only: clips under 5 s (22 frames
is 0.92 s; `MiniMaxH3ModularPipeline.min_duration` -> 0) and a text tap other than 50 (`text_encoder_layer` ->
the folder's `text_encoder_layer`). Its soundtrack is cut to round(frames * 32000 / 24) samples, as dif's is.
Where the Qwen3-VL processor cannot load (its video processor needs torchvision, which this repo's CPU venv lacks)
a text-only stand-in gives the token type ids t2va reads (all zeros); the JSON says which ran.

Usage (GPU machine, repo root; perf/h200_h3_t2va.sh is the whole device call):
    python3 perf/h3_t2va.py [--dit-layers 4 --text-layers 4] [--frames 22 -W 672 -H 384 --steps 8] [--repeats 2]
Check on a CPU (tiny config, both sides, MP4s decoded):
    python3 perf/h3_t2va.py --tiny --device cpu --out-dir /tmp/h3t2va
Writes OUT_DIR/h3_t2va.json (and perf/results/h3_t2va_h200.json when not --tiny), the last MP4 of each side as
OUT_DIR/dif.mp4 and OUT_DIR/diffusers.mp4, and prints a table last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

PERF = Path(__file__).resolve().parent
REPO = PERF.parent
H3 = REPO / "dif-frontend-h3" / "src" / "dif_frontend_h3"
PUBLISHED = H3 / "configs" / "h3"
EMBEDDED_TOKENIZER = H3 / "default" / "tokenizer"
RESULTS = PERF / "results" / "h3_t2va_h200.json"
PROMPT = "a paper boat drifts down a rainy street, thunder far away"
FPS = 24
DIFFUSERS_VERSION = "0.42.1"
GIB = 1024**3
# docs/h3.md (DiT) and shared/notes/diffir-opset.md (Qwen3-VL-32B class: 25.16B of it for t2va)
PUBLISHED_PARAMS = {"transformer": 33_122_992_896, "text_encoder": 33_357_390_064}
PUBLISHED_WIDTHS = "published: every hidden size, head, FFN width, the vocabulary; the full-size video and audio VAEs"

# processor/ of the published repository (shared/model-configs/minimax-h3/processor, which does not travel to
# the GPU machine) less its chat template, which t2va does not apply; its tokenizer_config.json is the tokenizer's.
PROCESSOR_CONFIGS: dict[str, dict[str, Any]] = {
    "preprocessor_config.json": {
        "size": {"longest_edge": 16777216, "shortest_edge": 65536},
        "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "processor_class": "Qwen3VLProcessor", "image_processor_type": "Qwen2VLImageProcessorFast",
    },
    "video_preprocessor_config.json": {
        "size": {"longest_edge": 25165824, "shortest_edge": 4096},
        "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
        "processor_class": "Qwen3VLProcessor", "video_processor_type": "Qwen3VLVideoProcessor",
    },
}  # fmt: skip

# --tiny: toy widths with the published structure (attention wider than the residual stream, partial RoPE,
# a refiner block, the VAEs' 16x / 4x / 17-frame-clip and 800-sample-hop geometry), for a CPU check.
TINY_TRANSFORMER: dict[str, Any] = dict(
    num_attention_heads=2, attention_head_dim=32, hidden_size=48, ffn_dim=64, text_dim=16, freq_dim=32,
    time_embed_hidden_dim=40, time_embed_dim=24, rope_freq_dim=4,
)  # fmt: skip
TINY_TEXT: dict[str, Any] = dict(
    hidden_size=16, intermediate_size=32, num_attention_heads=2, num_key_value_heads=1, head_dim=8,
    rope_scaling={"mrope_interleaved": True, "mrope_section": [2, 1, 1], "rope_type": "default"},
)  # fmt: skip
TINY_VISION: dict[str, Any] = dict(hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=16)
TINY_VIDEO_VAE: dict[str, Any] = dict(
    block_out_channels=[8, 8, 8, 8, 8, 8], norm_num_groups=4, layers_per_block=1, decoder_num_layers=1,
    decoder_num_attention_heads=2, decoder_attention_head_dim=16, decoder_ffn_mult=2,
)  # fmt: skip
TINY_AUDIO_VAE: dict[str, Any] = dict(
    latent_dim=64, decoder_dim=128, resblock_kernel_sizes=[3, 7], resblock_dilation_sizes=[[1, 3], [1, 3]],
    encoder_dim=4,
)  # fmt: skip
TINY_CANVAS = dict(frames=22, width=128, height=96)


# -- the checkpoint ----------------------------------------------------------------------------------------
def published(component: str) -> dict[str, Any]:
    return json.loads((PUBLISHED / component / "config.json").read_text())


def component_configs(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The four model configs: published widths, the requested depths (toy widths with --tiny)."""
    dit = published("transformer")
    dit.update(num_layers=args.dit_layers, num_refiner_layers=args.refiner_layers)
    text = published("text_encoder")
    vae, audio = published("vae"), published("audio_vae")
    if args.tiny:
        dit.update(TINY_TRANSFORMER)
        text["text_config"].update(TINY_TEXT)
        text["vision_config"].update(TINY_VISION)
        vae.update(TINY_VIDEO_VAE)
        audio.update(TINY_AUDIO_VAE)
    text["text_config"]["num_hidden_layers"] = args.text_layers
    vision = text["vision_config"]
    vision["depth"] = args.vision_layers
    vision["deepstack_visual_indexes"] = [i for i in vision["deepstack_visual_indexes"] if i < args.vision_layers] or [
        args.vision_layers - 1
    ]
    for cfg in (dit, vae, audio):
        cfg["_diffusers_version"] = DIFFUSERS_VERSION
    return {"transformer": dit, "text_encoder": text, "vae": vae, "audio_vae": audio}


def model_index(tap: int) -> dict[str, Any]:
    """The published index (minus transformer_ref, the ref2va partition not written) and dif's tap override;
    the components point at the published repository, which diffusers resolves to this local copy."""
    index = json.loads((PUBLISHED / "model_index.json").read_text())
    index.pop("transformer_ref", None)
    index["_diffusers_version"] = DIFFUSERS_VERSION
    index["text_encoder_layer"] = tap
    return index


def _keep_fp32(name: str, keep: list[str]) -> bool:
    """diffusers' from_pretrained rule (model_loading_utils): a module name among the parameter's path parts."""
    return any(k in name.split(".") for k in keep)


def _cast(model: Any, keep: list[str], dtype: Any) -> dict[str, int]:
    """Parameters to `dtype` except `keep` (fp32), in place; returns the parameter count per stored dtype."""
    import torch

    counts: dict[str, int] = {}
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.data = p.data.to(torch.float32 if _keep_fp32(name, keep) else dtype)
            key = str(p.dtype).removeprefix("torch.")
            counts[key] = counts.get(key, 0) + p.numel()
    return counts


def _folder_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def build_checkpoint(folder: Path, args: argparse.Namespace) -> dict[str, Any]:
    """Write the checkpoint folder; per component: parameters (by stored dtype), bytes on disk, seconds to
    build and to save. Models are built on `--device` (seeded default init, constant tensors perturbed as
    perf/h3_dit_forward.py does) and saved from host memory."""
    import diffusers
    import torch
    import transformers
    from denoiser_models import perturb_constants

    torch.set_grad_enabled(False)
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    configs = component_configs(args)
    device = torch.device(args.device)
    bf16 = torch.bfloat16
    vae_dtype = bf16 if args.vae_dtype == "bf16" else torch.float32
    info: dict[str, Any] = {}

    def build(name: str, make: Any, keep: list[str], dtype: Any, build_dtype: Any) -> None:
        t0 = time.perf_counter()
        torch.manual_seed(args.seed)
        default = torch.get_default_dtype()
        torch.set_default_dtype(build_dtype)
        try:
            with torch.device(device):
                model = make().eval()
        finally:
            torch.set_default_dtype(default)
        perturb_constants(model, device, args.seed + 1)
        counts = _cast(model, keep, dtype)
        if device.type == "cuda":
            torch.cuda.synchronize()
        t1 = time.perf_counter()
        model.to("cpu").save_pretrained(folder / name)
        info[name] = {
            "params": sum(counts.values()),
            "params_by_dtype": counts,
            "bytes": _folder_bytes(folder / name),
            "build_s": round(t1 - t0, 2),
            "save_s": round(time.perf_counter() - t1, 2),
        }
        del model
        if device.type == "cuda":
            torch.cuda.empty_cache()
        print(f"  {name}: {info[name]['params'] / 1e6:,.1f} M params, {info[name]['bytes'] / 1e9:.2f} GB, "
              f"build {info[name]['build_s']} s, save {info[name]['save_s']} s", flush=True)  # fmt: skip

    dit_cls = diffusers.MiniMaxH3Transformer3DModel
    build("transformer", lambda: dit_cls.from_config(configs["transformer"]), list(dit_cls._keep_in_fp32_modules or []),
          bf16, bf16)  # fmt: skip
    text_config = transformers.Qwen3VLConfig.from_dict(configs["text_encoder"])
    build("text_encoder", lambda: transformers.Qwen3VLForConditionalGeneration(text_config), [], bf16, bf16)
    vae_cls, audio_cls = diffusers.AutoencoderKLMiniMaxH3, diffusers.AutoencoderKLMiniMaxH3Audio
    build("vae", lambda: vae_cls.from_config(configs["vae"]), list(vae_cls._keep_in_fp32_modules or []), vae_dtype,
          torch.float32)  # fmt: skip
    build("audio_vae", lambda: audio_cls.from_config(configs["audio_vae"]), list(audio_cls._keep_in_fp32_modules or []),
          vae_dtype, torch.float32)  # fmt: skip
    for name, shift in (("scheduler", 12.0), ("audio_scheduler", 3.0)):  # the published shifts
        scheduler: Any = diffusers.MiniMaxH3Scheduler(shift=shift)
        scheduler.save_config(folder / name)
    shutil.copytree(EMBEDDED_TOKENIZER, folder / "tokenizer")
    processor = folder / "processor"
    shutil.copytree(EMBEDDED_TOKENIZER, processor)
    for name, config in PROCESSOR_CONFIGS.items():
        (processor / name).write_text(json.dumps(config, indent=2) + "\n")
    tap = args.text_layers - 1
    index = json.dumps(model_index(tap), indent=2) + "\n"
    (folder / "model_index.json").write_text(index)  # what dif reads
    (folder / "modular_model_index.json").write_text(index)  # what ModularPipeline.from_pretrained reads first
    return {
        "folder": str(folder),
        "components": info,
        "params": sum(c["params"] for c in info.values()),
        "bytes": _folder_bytes(folder),
        "text_encoder_layer": tap,
        "depths": {k: getattr(args, k) for k in ("dit_layers", "refiner_layers", "text_layers", "vision_layers")},
        "published_depths": {"dit_layers": 50, "refiner_layers": 2, "text_layers": 64, "vision_layers": 27},
        "published_params": PUBLISHED_PARAMS,
        "widths": "toy (--tiny)" if args.tiny else PUBLISHED_WIDTHS,
        "vae_dtype": args.vae_dtype,
        "build_device": args.device,
        "seed": args.seed,
    }


# -- the diffusers run (a fresh process) ----------------------------------------------------------------------
def write_mp4(path: Path, frames: Any, audio: Any, sample_rate: int, fps: int = FPS) -> None:
    """frames (F, H, W, 3) uint8, audio (2, N) float32 in [-1, 1] -> H.264 yuv420p (CRF 18) + AAC stereo."""
    import av
    import numpy as np

    tmp = path.with_name(path.name + ".part")
    with av.open(str(tmp), mode="w", format="mp4") as out:
        video = out.add_stream("libx264", rate=fps, options={"crf": "18", "preset": "medium"})
        video.width, video.height, video.pix_fmt = frames.shape[2], frames.shape[1], "yuv420p"
        sound = out.add_stream("aac", rate=sample_rate, layout="stereo")
        for rgb in frames:
            out.mux(video.encode(av.VideoFrame.from_ndarray(np.ascontiguousarray(rgb), format="rgb24")))
        out.mux(video.encode(None))
        samples = np.ascontiguousarray(np.clip(audio, -1.0, 1.0), dtype=np.float32)
        for start in range(0, samples.shape[1], 1024):
            frame = av.AudioFrame.from_ndarray(np.ascontiguousarray(samples[:, start : start + 1024]), format="fltp",
                                               layout="stereo")  # fmt: skip
            frame.sample_rate, frame.pts = sample_rate, start
            out.mux(sound.encode(frame))
        out.mux(sound.encode(None))
    tmp.replace(path)


class TextOnlyProcessor:
    """Stands in for the Qwen3-VL processor where it cannot load (its video processor needs torchvision):
    t2va's text step reads only `create_mm_token_type_ids` of it, all zeros (text) for a prompt."""

    def create_mm_token_type_ids(self, ids: list[list[int]]) -> list[list[int]]:
        return [[0] * len(row) for row in ids]


def diffusers_run(args: argparse.Namespace) -> int:
    """One prompt -> MP4 through diffusers' modular MiniMax-H3 pipeline; phases into --result-json."""
    t_start = time.perf_counter()
    import diffusers
    import numpy as np
    import torch
    from diffusers.modular_pipelines.minimax_h3.modular_pipeline import MiniMaxH3ModularPipeline

    t_import = time.perf_counter()
    folder = Path(args.model)
    tap = int(json.loads((folder / "model_index.json").read_text()).get("text_encoder_layer", 50))
    # what diffusers refuses at this size (module docstring): clips under 5 s, a tap other than 50
    MiniMaxH3ModularPipeline.min_duration = property(lambda self: 0.0)  # type: ignore[method-assign,assignment]
    MiniMaxH3ModularPipeline.text_encoder_layer = property(lambda self: tap)  # type: ignore[method-assign,assignment]
    device = torch.device(args.device)
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    pipe = diffusers.ModularPipeline.from_pretrained(str(folder), workflow="t2va")
    pipe.load_components(torch_dtype=dtype)  # logs, and leaves None, a component that fails to load
    processor = "Qwen3VLProcessor"
    if getattr(pipe, "processor", None) is None:
        pipe.update_components(processor=TextOnlyProcessor())
        processor = "text-only stand-in (the Qwen3-VL processor did not load: its video processor needs torchvision)"
    missing = pipe.null_component_names
    if missing:
        raise RuntimeError(f"diffusers loaded no {', '.join(missing)} from {folder}")
    pipe.to(device)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    t_load = time.perf_counter()
    generator = torch.Generator(device=device).manual_seed(args.seed)
    out = pipe(prompt=args.prompt, height=args.height, width=args.width, num_frames=args.frames,
               num_inference_steps=args.steps, generator=generator, output_type="np")  # fmt: skip
    video, audio, rate = out.get("videos"), out.get("audio"), int(out.get("sampling_rate"))
    if device.type == "cuda":
        torch.cuda.synchronize()
    t_generate = time.perf_counter()
    frames = np.asarray(video)
    frames = frames.reshape(-1, *frames.shape[-3:])  # (F, H, W, 3) floats in [0, 1]
    pixels = np.round(np.clip(frames, 0.0, 1.0) * 255.0).astype(np.uint8)
    sound = audio.float().cpu().numpy().reshape(2, -1)[:, : round(args.frames * rate / FPS)]
    write_mp4(Path(args.output), pixels, sound, rate)
    t_save = time.perf_counter()
    result = {
        "phases_s": {
            "import": round(t_import - t_start, 3),
            "load": round(t_load - t_import, 3),
            "generate": round(t_generate - t_load, 3),
            "save": round(t_save - t_generate, 3),
            "total": round(t_save - t_start, 3),
        },
        "peak_allocated_bytes": torch.cuda.max_memory_allocated() if device.type == "cuda" else None,
        "peak_reserved_bytes": torch.cuda.max_memory_reserved() if device.type == "cuda" else None,
        "frames": list(pixels.shape),
        "audio_samples": list(sound.shape),
        "finite": bool(np.isfinite(frames).all() and np.isfinite(sound).all()),
        "processor": processor,
        "text_encoder_layer": tap,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__},
    }
    Path(args.result_json).write_text(json.dumps(result, indent=2) + "\n")
    return 0


# -- the side-by-side driver ---------------------------------------------------------------------------------
class MemorySampler:
    """The GPU's used memory (NVML, else nvidia-smi) sampled every `period` s in a thread; `peak_bytes` is the
    highest reading less the reading before the run started (None without a GPU to read)."""

    def __init__(self, period: float = 0.2) -> None:
        self.period = period
        self.read = self._reader()
        self.baseline: int | None = None
        self.peak: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @staticmethod
    def _reader() -> Any:
        try:
            import pynvml

            pynvml.nvmlInit()
            handle = pynvml.nvmlDeviceGetHandleByIndex(0)
            return lambda: int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
        except Exception:  # noqa: BLE001 - no NVML: try nvidia-smi, else nothing
            pass
        if shutil.which("nvidia-smi") is None:
            return None

        def smi() -> int | None:
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits",
                                      "-i", "0"], capture_output=True, text=True, timeout=5)  # fmt: skip
                return int(out.stdout.split()[0]) * 1024**2
            except (OSError, ValueError, IndexError, subprocess.TimeoutExpired):
                return None

        return smi if smi() is not None else None

    def _loop(self) -> None:
        while not self._stop.wait(self.period):
            value = self.read()
            if value is not None:
                self.peak = value if self.peak is None else max(self.peak, value)

    @contextmanager
    def running(self) -> Iterator[None]:
        self.baseline = self.peak = None
        if self.read is not None:
            self.baseline = self.read()
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        try:
            yield
        finally:
            if self._thread is not None:
                self._stop.set()
                self._thread.join()
                self._thread = None

    @property
    def peak_bytes(self) -> int | None:
        if self.peak is None or self.baseline is None:
            return None
        return max(0, self.peak - self.baseline)


def child_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    paths = [str(PERF), *(str(p) for p in sorted(REPO.glob("dif-*/src")))]
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    return env


def run_timed(cmd: list[str], log: Path, sampler: MemorySampler, timeout: float) -> dict[str, Any]:
    """Run `cmd` in a fresh process; wall seconds start to exit, stdout kept, stderr into `log`."""
    with log.open("w") as err, sampler.running():
        t0 = time.perf_counter()
        try:
            proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, timeout=timeout, env=child_env(),
                                  cwd=REPO)  # fmt: skip
            rc, stdout = proc.returncode, proc.stdout
        except subprocess.TimeoutExpired as exc:
            rc, stdout = 124, (exc.stdout or b"").decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        wall = time.perf_counter() - t0
    run: dict[str, Any] = {"wall_s": round(wall, 3), "rc": rc, "gpu_used_peak_bytes": sampler.peak_bytes}
    if rc != 0:
        run["stderr_tail"] = log.read_text(errors="replace")[-3000:]
    return run | {"_stdout": stdout}


def dif_command(args: argparse.Namespace, folder: Path, output: Path) -> list[str]:
    backend = "cuda" if args.device == "cuda" else "cpu"
    return [sys.executable, "-m", "dif_tools", "h3", "generate", "-m", str(folder), "-p", args.prompt,
            "--frames", str(args.frames), "-W", str(args.width), "-H", str(args.height), "--steps", str(args.steps),
            "--seed", str(args.seed), "--backend", backend, "-o", str(output), "--json"]  # fmt: skip


def diffusers_command(args: argparse.Namespace, folder: Path, output: Path, result: Path) -> list[str]:
    return [sys.executable, str(Path(__file__).resolve()), "--diffusers-run", "--model", str(folder),
            "--prompt", args.prompt, "--frames", str(args.frames), "-W", str(args.width), "-H", str(args.height),
            "--steps", str(args.steps), "--seed", str(args.seed), "--device", args.device, "--dtype", args.dtype,
            "--output", str(output), "--result-json", str(result)]  # fmt: skip


def dif_details(stdout: str) -> dict[str, Any]:
    """Stages and the memory plan of `dif h3 generate --json` (dif-telemetry/1)."""
    try:
        doc = json.loads(stdout)
    except json.JSONDecodeError:
        return {"json_error": stdout[-500:]}
    data = doc.get("data", {})
    memory = data.get("memory", {})
    programs = memory.get("programs", {})
    return {
        "timings_s": data.get("timings_s"),
        "dtype": data.get("dtype"),
        "sequence_rows": data.get("sequence_rows"),
        "text_tokens": data.get("text_tokens"),
        "resident_bytes": sum(int(p.get("resident_bytes", 0)) for p in programs.values()),
        "allowance_bytes": sum(int(p.get("all_resident_bytes", 0)) for p in programs.values()),
        "memory": memory,
        "hardware": doc.get("hardware"),
    }


def check_mp4(path: Path, frames: int) -> dict[str, Any]:
    """Decode with PyAV: frame count, both streams, size, rates, mean pixel value, audio RMS and peak."""
    import av
    import numpy as np

    if not path.is_file():
        return {"ok": False, "error": f"{path} missing"}
    out: dict[str, Any] = {"bytes": path.stat().st_size}
    with av.open(str(path)) as src:
        vs, aus = list(src.streams.video), list(src.streams.audio)
        out["streams"] = [f"{s.type}:{s.codec_context.name}" for s in src.streams]
        if vs:
            v = vs[0]
            out.update(width=v.width, height=v.height, fps=float(v.average_rate or 0), pix_fmt=v.pix_fmt)
        if aus:
            out.update(sample_rate=aus[0].rate, channels=aus[0].channels)
    with av.open(str(path)) as src:
        total, count = 0.0, 0
        for frame in src.decode(video=0):
            total += float(frame.to_ndarray(format="rgb24").mean())
            count += 1
        out["frames"], out["mean_pixel"] = count, round(total / max(count, 1), 3)
    if aus:
        with av.open(str(path)) as src:
            chunks = [frame.to_ndarray().reshape(out["channels"], -1) for frame in src.decode(audio=0)]
        samples = np.concatenate(chunks, axis=1).astype(np.float64) if chunks else np.zeros((2, 0))
        out["audio_samples"] = int(samples.shape[1])
        out["audio_rms"] = round(float(np.sqrt(np.mean(samples**2))) if samples.size else 0.0, 5)
        out["audio_peak"] = round(float(np.abs(samples).max()) if samples.size else 0.0, 5)
        out["audio_finite"] = bool(np.isfinite(samples).all())
    out["ok"] = bool(vs and aus and out["frames"] == frames and out.get("audio_finite", False))
    return out


def median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def median_phases(runs: list[dict[str, Any]]) -> dict[str, float]:
    """Per phase, the median over `runs` (dif: its in-process stages; diffusers: import / load / generate / save)."""
    phases = [r.get("timings_s") or r.get("phases_s") or {} for r in runs]
    keys = dict.fromkeys(k for p in phases for k in p)
    return {k: round(statistics.median(p[k] for p in phases if k in p), 3) for k in keys}


def git_commit() -> str | None:
    """HEAD of the checkout, else DIF_COMMIT (a snapshot on the GPU machine has no .git)."""
    try:
        cmd = ["git", "rev-parse", "--short", "HEAD"]
        out = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO, timeout=10)
        commit = out.stdout.strip() if out.returncode == 0 else ""
    except (OSError, subprocess.TimeoutExpired):
        commit = ""
    return commit or os.environ.get("DIF_COMMIT") or None


def device_name(device: str) -> str:
    if device != "cuda" or shutil.which("nvidia-smi") is None:
        return "cpu"
    out = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                         capture_output=True, text=True, timeout=10)  # fmt: skip
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else "cuda"


def gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GIB:.2f} GiB"


def side_by_side(args: argparse.Namespace) -> int:
    """Build (or reuse) the checkpoint, run both sides in fresh processes, decode the MP4s, write the JSON."""
    started = time.perf_counter()
    out_dir = Path(args.out_dir)
    work = Path(args.work_dir or f"/tmp/h3_t2va_work{'_tiny' if args.tiny else ''}")
    folder = Path(args.model_dir) if args.model_dir else work / "checkpoint"
    for d in (out_dir, work):
        d.mkdir(parents=True, exist_ok=True)
    sampler = MemorySampler()
    build_json = work / "build.json"
    if args.reuse_checkpoint and (folder / "model_index.json").is_file() and build_json.is_file():
        build = json.loads(build_json.read_text()) | {"reused": True}
        print(f"reusing {folder}", flush=True)
    else:
        print(f"building the checkpoint in {folder} ({'tiny' if args.tiny else 'published widths'}) on {args.device}",
              flush=True)  # fmt: skip
        cmd = [sys.executable, str(Path(__file__).resolve()), "--build-run", "--result-json", str(build_json),
               "--model-dir", str(folder), *build_flags(args)]  # fmt: skip
        t0 = time.perf_counter()
        with sampler.running():
            proc = subprocess.run(cmd, env=child_env(), cwd=REPO, timeout=args.run_timeout)
        if proc.returncode != 0:
            print(f"checkpoint build failed (rc {proc.returncode})", file=sys.stderr)
            return 1
        build = json.loads(build_json.read_text()) | {"wall_s": round(time.perf_counter() - t0, 2)}
        print(f"checkpoint: {build['params'] / 1e6:,.1f} M params, {build['bytes'] / 1e9:.2f} GB in "
              f"{build['wall_s']} s", flush=True)  # fmt: skip
    sides: dict[str, dict[str, Any]] = {name: {"runs": []} for name in ("dif", "diffusers")}
    sides["dif"]["command"] = dif_command(args, folder, work / "dif-N.mp4")
    sides["diffusers"]["command"] = diffusers_command(args, folder, work / "diffusers-N.mp4", work / "diffusers-N.json")
    total_runs = 1 + args.repeats
    for i in range(total_runs):
        for name in ("dif", "diffusers"):
            if args.only and name != args.only:
                continue
            elapsed = time.perf_counter() - started
            if args.budget_s and i > 0 and elapsed > args.budget_s:
                sides[name]["runs"].append({"index": i, "skipped": f"budget: {elapsed:.0f} s > {args.budget_s} s"})
                continue
            mp4, result = work / f"{name}-{i}.mp4", work / f"{name}-{i}.json"
            mp4.unlink(missing_ok=True)
            cmd = (dif_command(args, folder, mp4) if name == "dif"
                   else diffusers_command(args, folder, mp4, result))  # fmt: skip
            run = run_timed(cmd, work / f"{name}-{i}.log", sampler, args.run_timeout)
            stdout = run.pop("_stdout")
            run = {"index": i, "warmup": i == 0, **run}
            if run["rc"] == 0:
                run |= dif_details(stdout) if name == "dif" else json.loads(result.read_text())
                run["mp4"] = check_mp4(mp4, args.frames)
                shutil.copy(mp4, out_dir / f"{name}.mp4")
            sides[name]["runs"].append(run)
            label = "warm-up" if i == 0 else f"run {i}"
            mean = run.get("mp4", {}).get("mean_pixel")
            print(f"{name:9s} {label}: rc {run['rc']}, {run['wall_s']:.2f} s, mean pixel {mean}", flush=True)
    for side in sides.values():
        timed = [r["wall_s"] for r in side["runs"] if not r.get("warmup") and r.get("rc") == 0]
        side["median_s"] = median(timed)
        side["measured_runs"] = len(timed)
        side["warmup_s"] = next((r["wall_s"] for r in side["runs"] if r.get("warmup") and r.get("rc") == 0), None)
        side["gpu_used_peak_bytes"] = max((r.get("gpu_used_peak_bytes") or 0 for r in side["runs"]), default=0) or None
        side["phases_median_s"] = median_phases([r for r in side["runs"] if not r.get("warmup") and r.get("rc") == 0])
    peaks = [r.get("peak_allocated_bytes") for r in sides["diffusers"]["runs"] if r.get("peak_allocated_bytes")]
    sides["diffusers"]["peak_allocated_bytes"] = max(peaks) if peaks else None
    allowance = [r.get("allowance_bytes") for r in sides["dif"]["runs"] if r.get("allowance_bytes")]
    sides["dif"]["plan_allowance_bytes"] = max(allowance) if allowance else None
    a, b = sides["dif"]["median_s"], sides["diffusers"]["median_s"]
    ok = all(r.get("mp4", {}).get("ok") for s in sides.values() for r in s["runs"] if "skipped" not in r) and all(
        s["measured_runs"] for n, s in sides.items() if not args.only or n == args.only
    )
    report = {
        "what": "MiniMax-H3 t2va prompt -> saved MP4, each run a fresh process, dif vs diffusers (issue 15)",
        "device": device_name(args.device),
        "commit": git_commit(),
        "tiny": args.tiny,
        "request": {
            "prompt": args.prompt,
            "frames": args.frames,
            "width": args.width,
            "height": args.height,
            "steps": args.steps,
            "seed": args.seed,
            "fps": FPS,
            "steps_note": f"--steps {args.steps}: {args.steps} grid points of linspace(1, 0, n), {args.steps - 1} DiT "
            "forwards, both sides (not the published default grid of 50 points)",
        },  # fmt: skip
        "timing": f"wall seconds from the process's start to its exit with the MP4 written; run 0 of each side is a "
        f"warm-up (reported, left out of the medians), then {args.repeats} measured runs; the sides alternate; "
        "the checkpoint was just written, so its files are in the page cache",
        "memory_note": "gpu_used_peak_bytes: the GPU's used memory (NVML / nvidia-smi, 0.2 s samples) less the "
        "reading before the run; diffusers also reports torch.cuda.max_memory_allocated / reserved; dif its plan's "
        "all-resident allowance summed over its programs (plan_allowance_bytes)",
        "deviations": [
            "diffusers run only: MiniMaxH3ModularPipeline.min_duration -> 0 (it refuses clips under 5 s) and "
            "text_encoder_layer -> the folder's text_encoder_layer (it taps 50 of 64 layers)",
            "diffusers soundtrack cut to round(frames * 32000 / 24) samples, as dif's",
            "different noise generators (dif: numpy PCG64; diffusers: torch): outputs are not compared pixel by pixel",
        ],
        "checkpoint": build,
        "dif": sides["dif"],
        "diffusers": sides["diffusers"],
        "ratio_dif_over_diffusers": round(a / b, 3) if a and b else None,
        "ok": ok,
        "total_s": round(time.perf_counter() - started, 1),
    }
    text = json.dumps(report, indent=2) + "\n"
    (out_dir / "h3_t2va.json").write_text(text)
    if not args.tiny:
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(text)
    print_table(report)
    return 0 if ok else 1


def print_table(report: dict[str, Any]) -> None:
    r = report["request"]
    print(f"\nMiniMax-H3 t2va, {r['frames']} frames {r['width']}x{r['height']}, {r['steps']} grid points, "
          f"{report['checkpoint']['params'] / 1e6:,.0f} M params ({report['device']})")  # fmt: skip
    print(f"{'':10s} {'median s':>9s} {'warm-up s':>10s} {'runs s':>22s} {'GPU used peak':>14s} {'torch peak':>11s}")
    for name in ("dif", "diffusers"):
        s = report[name]
        runs = ", ".join(f"{x['wall_s']:.2f}" for x in s["runs"] if not x.get("warmup") and x.get("rc") == 0)
        med = "-" if s["median_s"] is None else f"{s['median_s']:.2f}"
        warm = "-" if s["warmup_s"] is None else f"{s['warmup_s']:.2f}"
        torch_peak = gib(s.get("peak_allocated_bytes")) if name == "diffusers" else "-"
        print(f"{name:10s} {med:>9s} {warm:>10s} {runs:>22s} {gib(s['gpu_used_peak_bytes']):>14s} {torch_peak:>11s}")
    for name in ("dif", "diffusers"):
        phases = ", ".join(f"{k} {v:.2f}" for k, v in report[name]["phases_median_s"].items())
        print(f"  {name} phases (median s, in the process): {phases or '-'}")
    ratio = report["ratio_dif_over_diffusers"]
    print(f"ratio dif / diffusers: {'-' if ratio is None else f'{ratio:.3f}'}   ok: {report['ok']}")


def build_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--dit-layers", str(args.dit_layers), "--refiner-layers", str(args.refiner_layers),
             "--text-layers", str(args.text_layers), "--vision-layers", str(args.vision_layers),
             "--vae-dtype", args.vae_dtype, "--seed", str(args.seed), "--device", args.device]  # fmt: skip
    return flags + (["--tiny"] if args.tiny else [])


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--tiny", action="store_true", help="toy widths and a 128x96 canvas (a CPU check)")
    ap.add_argument("--dit-layers", type=int, default=4, help="DiT blocks (published: 50)")
    ap.add_argument("--refiner-layers", type=int, default=1, help="text refiner blocks (published: 2)")
    ap.add_argument("--text-layers", type=int, default=4, help="Qwen3-VL text layers, tapped at N - 1 (published 64)")
    ap.add_argument("--vision-layers", type=int, default=1, help="Qwen3-VL vision blocks (published 27)")
    ap.add_argument("--vae-dtype", choices=("bf16", "fp32"), default="bf16",
                    help="VAE storage: bf16 but the _keep_in_fp32_modules, or fp32 as released")  # fmt: skip
    ap.add_argument("--prompt", "-p", default=PROMPT)
    ap.add_argument("--frames", type=int, default=None, help="17n + 5 (default 22)")
    ap.add_argument("--width", "-W", type=int, default=None, help="multiple of 32 (default 672; --tiny 128)")
    ap.add_argument("--height", "-H", type=int, default=None, help="multiple of 32 (default 384; --tiny 96)")
    ap.add_argument("--steps", type=int, default=8, help="grid points (steps - 1 DiT forwards; published 50)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="diffusers' torch_dtype")
    ap.add_argument("--repeats", type=int, default=2, help="measured runs per side, after one warm-up each")
    ap.add_argument("--only", choices=("dif", "diffusers"), help="run one side only")
    ap.add_argument("--out-dir", default=os.environ.get("OUT", "/tmp/h3_t2va"))
    ap.add_argument("--work-dir", help="the checkpoint, every run's MP4 and log (default /tmp/h3_t2va_work[_tiny])")
    ap.add_argument("--model-dir", help="the checkpoint folder (default WORK_DIR/checkpoint)")
    ap.add_argument("--reuse-checkpoint", action="store_true", help="keep a checkpoint this script built before")
    ap.add_argument("--run-timeout", type=float, default=420.0, help="seconds for one process")
    ap.add_argument("--budget-s", type=float, default=0.0, help="start no measured run after this many seconds")
    ap.add_argument("--build-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--diffusers-run", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--output", help=argparse.SUPPRESS)
    ap.add_argument("--result-json", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    canvas = TINY_CANVAS if args.tiny else dict(frames=22, width=672, height=384)
    for key, value in canvas.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.diffusers_run:
        return diffusers_run(args)
    if args.build_run:
        sys.path.insert(0, str(PERF))
        build = build_checkpoint(Path(args.model_dir), args)
        Path(args.result_json).write_text(json.dumps(build, indent=2) + "\n")
        return 0
    return side_by_side(args)


if __name__ == "__main__":
    raise SystemExit(main())
