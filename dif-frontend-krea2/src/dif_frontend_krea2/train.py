"""LoRA training of a Krea 2 denoiser through dif's own programs (`dif train lora`).

Frontend stage: Krea 2's facts only — the denoiser program at a bucket's token grid with the adapters as
differentiable inputs (the text fusion is frozen and runs once per caption: its embeds are the cached
text features), how a sample becomes the denoiser's inputs (packed latents, the fused caption embeds
with their key mask, the flow-matching target at the scheduler's training sigmas). dif has no Qwen-Image
VAE encoder yet, so a sample's latents are read from `<image stem>.latents.safetensors` beside it
(tensor `latents`: normalized and packed as the pipeline packs, (1, grid_h * grid_w, channels)); a
missing or mis-shaped one is an error naming the file. The loop and the optimizer are `dif.train`'s.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from attrs import define, field

from dif.dtypes import DType
from dif.errors import UsageError
from dif.lora.slots import lora_slots, slot_inputs
from dif.serialize.diftensor import load_tensors
from dif.train.data import DataError, DataOrder, Sample, assign_bucket, bucket_sizes, scan_folder
from dif.train.flow import flow_batch, sample_sigmas
from dif.train.loop import Trainer
from dif.train.lora import init_factors, match_targets
from dif.train.schedule import AdamW, LrSchedule
from dif.train.step import TARGET, StepPrograms, build_step_programs, model_fingerprint
from dif.train.tasks import LoraSession, LoraSettings
from dif.weights import bind_weights
from dif_frontend_krea2.model import attention_mask, build_denoiser, rope_tables, timestep_proj_from_timesteps
from dif_frontend_krea2.weights import TEXT_FUSION_PREFIXES

ATTENTION_TARGETS = ("to_q", "to_k", "to_v", "to_out.0")
"""The default LoRA targets: the denoiser blocks' attention projections (the text fusion is not trained)."""
LATENTS_SUFFIX = ".latents.safetensors"


def latents_file(sample: Sample) -> Path:
    return sample.image.with_name(sample.image.stem + LATENTS_SUFFIX)


def read_latents(sample: Sample, tokens: int, channels: int) -> np.ndarray:
    path = latents_file(sample)
    if not path.is_file():
        raise DataError(
            f"{sample.image}: no pre-encoded latents {path.name} (dif has no Qwen-Image VAE encoder yet)",
            hint="encode the image with diffusers' AutoencoderKLQwenImage, normalize and pack it, save it there",
        )
    tensors, _ = load_tensors(path)
    lat = tensors.get("latents")
    if lat is None or tuple(lat.shape) != (1, tokens, channels):
        got = None if lat is None else tuple(lat.shape)
        raise DataError(f"{path}: 'latents' must be (1, {tokens}, {channels}) for this image's bucket, got {got}")
    return np.array(lat, np.float32)


@define
class Krea2LoraTask:
    """`dif.train.loop.Task` for a Krea 2 LoRA on the denoiser."""

    pipeline: Any  # Krea2Pipeline: its text encoder + text fusion make the cached caption embeds
    samples: Sequence[Sample]
    modules: Sequence[str]
    rank: int
    alpha: float
    opt: AdamW
    resolution: int = 512
    accumulate: int = 1
    max_grad_norm: float | None = 1.0
    checkpoint_blocks: Sequence[str] = ()
    dtype: DType = DType.F32
    scheme: str = "uniform"
    seed: int = 0
    timestep_shift: float | None = None  # shift of the training sigmas; None: 1 (the scheduler shifts dynamically)
    model_key: str = field(init=False, default="")
    _programs: dict[Hashable, StepPrograms] = field(init=False, factory=dict)
    _encoded: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]] = field(init=False, factory=dict)
    _order: DataOrder = field(init=False)
    _buckets: list[tuple[int, int]] = field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        self._buckets = bucket_sizes(self.resolution, self.pipeline.pixels_per_token)
        self._order = DataOrder(self.seed, len(self.samples))
        self.model_key = model_fingerprint(self._forward((1, 1)), self.trainable) + f":r{self.rank}:a{self.alpha}"

    @property
    def trainable(self) -> list[str]:
        return [n for m in self.modules for n in slot_inputs(m)]

    @property
    def shift(self) -> float:
        return 1.0 if self.timestep_shift is None else self.timestep_shift

    @property
    def text_len(self) -> int:
        return int(self.pipeline.max_sequence_length)

    def _forward(self, grid: tuple[int, int]):  # type: ignore[no-untyped-def]
        cfg = self.pipeline.configs.transformer
        with lora_slots({f"{m}.weight": self.rank for m in self.modules}):
            return build_denoiser(cfg, image_len=grid[0] * grid[1], text_len=self.text_len, dtype=self.dtype)

    def programs(self, key: Hashable) -> StepPrograms:
        if key not in self._programs:
            scales = {slot_inputs(m)[1]: self.alpha / self.rank for m in self.modules}
            self._programs[key] = build_step_programs(
                self._forward(key), self.trainable, opt=self.opt, max_grad_norm=self.max_grad_norm,  # type: ignore[arg-type]
                accumulate_steps=self.accumulate, checkpoint=self.checkpoint_blocks, scales=scales,
            )  # fmt: skip
        return self._programs[key]

    def frozen_weights(self) -> Any:
        source = self.pipeline.checkpoint.transformer
        return bind_weights(self.programs((1, 1)).step, source, ignore=lambda n: n.startswith(TEXT_FUSION_PREFIXES))

    def encode_all(self, on_sample: Any = None) -> None:
        """Every sample's latents (read from its file) and text features (once per distinct caption)."""
        ppt = self.pipeline.pixels_per_token
        channels = self.pipeline.configs.transformer.in_channels
        prompts: dict[str, Any] = {}
        for i, sample in enumerate(self.samples):
            size = assign_bucket(sample, self._buckets)
            grid = (size[1] // ppt, size[0] // ppt)
            lat = read_latents(sample, grid[0] * grid[1], channels)
            if sample.caption not in prompts:
                prompts[sample.caption] = self.pipeline.encode(sample.caption)
            prompt = prompts[sample.caption]
            self._encoded[i] = (lat, np.asarray(prompt.embeds), np.asarray(prompt.mask), grid)
            if on_sample is not None:
                on_sample(i, sample, size)

    def micro_batch(self, rng: np.random.Generator, data: dict[str, Any]) -> tuple[Hashable, dict[str, np.ndarray]]:
        idx, state = self._order.advance(data)
        data.update(state)
        if idx not in self._encoded:
            self.encode_all()
        lat, embeds, mask, grid = self._encoded[idx]
        cfg = self.pipeline.configs.transformer
        sigmas = sample_sigmas(rng, 1, scheme=self.scheme, shift=self.shift)
        batch = flow_batch(lat, rng, sigmas)
        cos, sin = rope_tables(cfg, self.text_len, *grid)
        dt = self.dtype.np
        inputs = {
            "latents": batch.noisy.astype(dt),
            "text_embeds": embeds.astype(dt),
            "timestep_proj": timestep_proj_from_timesteps(sigmas * 1000, dtype=self.dtype, dim=cfg.timestep_embed_dim),
            "rope_cos": cos,
            "rope_sin": sin,
            "attention_mask": attention_mask(mask, grid[0] * grid[1]),
            TARGET: batch.target,
        }
        return grid, inputs


def linear_shapes(pipeline: Any) -> dict[str, tuple[int, int]]:
    prog = build_denoiser(pipeline.configs.transformer, image_len=1, text_len=1)
    return {
        p.name[: -len(".weight")]: p.type.shape for p in prog.params if p.type.rank == 2 and p.name.endswith(".weight")
    }


def lora_session(model: Path, data: Path, settings: LoraSettings, *, backend: str | None = None) -> LoraSession:
    """Open the Krea 2 checkpoint at `model`, scan `data`, set up the LoRA run of `settings`."""
    from dif_frontend_krea2.plugin import _pipeline

    s = settings
    if s.batch_size != 1:  # its denoiser program is built for one image (build_denoiser has no batch axis)
        raise UsageError(
            f"Krea 2 trains one image per micro-batch, not --batch-size {s.batch_size}",
            hint=f"use --accumulate {s.batch_size * s.accumulate} for the same images per optimizer step",
        )
    extra = {} if s.max_text_tokens is None else {"max_sequence_length": s.max_text_tokens}
    pipeline = _pipeline(model, dtype=s.dtype, backend=backend, **extra)
    shapes = linear_shapes(pipeline)
    modules = match_targets(shapes, s.targets or ATTENTION_TARGETS)
    opt = AdamW(lr=s.lr, weight_decay=s.weight_decay)
    task = Krea2LoraTask(
        pipeline, scan_folder(data), modules, s.rank, s.alpha, opt, resolution=s.resolution, accumulate=s.accumulate,
        max_grad_norm=s.max_grad_norm, checkpoint_blocks=s.checkpoint_blocks, dtype=DType(s.dtype),
        scheme=s.timestep_sampling, seed=s.seed, timestep_shift=s.timestep_shift,
    )  # fmt: skip
    params = init_factors(np.random.default_rng(s.seed), {m: shapes[m] for m in modules}, s.rank)
    trainer = Trainer(
        task, task.frozen_weights(), params, opt, LrSchedule(s.lr, s.steps, warmup=s.warmup, cosine=s.cosine),
        accumulate=s.accumulate, backend=backend, seed=s.seed,
        settings={"family": "krea2", "model": str(model), "rank": s.rank, "alpha": s.alpha, "modules": list(modules),
                  "timestep_shift": task.shift},
    )  # fmt: skip
    return LoraSession(task, trainer, s)
