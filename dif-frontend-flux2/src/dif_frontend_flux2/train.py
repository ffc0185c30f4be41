"""LoRA training of a FLUX.2 [klein] transformer through dif's own programs (`dif train lora`).

Frontend stage: klein's facts only — which linears a LoRA may target, the denoiser program at a
bucket's token grid with the adapters as differentiable inputs, how a micro-batch of samples becomes the
denoiser's inputs (packed VAE latents, the Qwen3 text features of its caption at the checkpoint's text
length, the flow-matching target with the scheduler's training sigmas, or those of `timestep_shift`) and
the diffusers key layout of the result.
The step programs, the optimizer, checkpoints and the loop are `dif.train`'s.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from attrs import define, field

from dif.dtypes import DType
from dif.errors import UsageError
from dif.lora.slots import lora_slots, slot_inputs
from dif.train.data import DataOrder, Encoded, FeatureCache, Sample, assign_bucket, bucket_sizes, scan_folder
from dif.train.flow import flow_batch, sample_sigmas
from dif.train.loop import Trainer
from dif.train.lora import init_factors, match_targets
from dif.train.schedule import AdamW, LrSchedule
from dif.train.step import TARGET, StepPrograms, build_step_programs, model_fingerprint
from dif.train.tasks import LoraSession, LoraSettings
from dif.weights import bind_weights
from dif_frontend_flux2.model import build_transformer, flux2_rope_tables, flux2_timestep_proj

ATTENTION_TARGETS = ("to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out",
                     "to_qkv_mlp_proj", "attn.to_out")  # fmt: skip
"""The default LoRA targets: every attention projection of the double and single blocks."""


def linear_shapes(pipeline: Any) -> dict[str, tuple[int, int]]:
    """Transformer linear module -> weight (out, in), read off a program at the smallest grid."""
    cfg = pipeline.checkpoint.configs.transformer
    prog = build_transformer(cfg, batch=1, n_img=1, n_txt=1)
    return {
        p.name[: -len(".weight")]: p.type.shape for p in prog.params if p.type.rank == 2 and p.name.endswith(".weight")
    }


def training_sigma_shift(root: Path) -> float:
    """The shift of the scheduler's training sigmas: its `shift` unless it shifts dynamically at
    inference (then the training table is unshifted, as FlowMatchEulerDiscreteScheduler builds it)."""
    path = Path(root) / "scheduler" / "scheduler_config.json"
    if not path.is_file():
        return 1.0
    cfg = json.loads(path.read_text())
    return 1.0 if cfg.get("use_dynamic_shifting", False) else float(cfg.get("shift", 1.0))


@define
class KleinLoraTask:
    """`dif.train.loop.Task` for a klein LoRA: programs per bucket token grid, samples from the cache.
    `batch`: images per micro-batch (one program of that batch; they must share one bucket)."""

    pipeline: Any  # Flux2Pipeline: its text encoder and VAE encoder make the cached features
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
    cache_dir: Path | None = None
    full: bool = False  # train every transformer parameter (`dif train full`) instead of LoRA adapters
    timestep_shift: float | None = None  # shift of the training sigmas; None: the scheduler's (`training_sigma_shift`)
    batch: int = 1
    # draws a micro-batch's sigmas (rng, count) in place of `scheme` and `shift`: a recipe's own mix
    sigma_draw: Callable[[np.random.Generator, int], np.ndarray] | None = None
    model_key: str = field(init=False, default="")
    shift: float = field(init=False, default=1.0)  # the shift the sigmas are drawn with
    _programs: dict[Hashable, StepPrograms] = field(init=False, factory=dict)
    _encoded: dict[int, Encoded] = field(init=False, factory=dict)
    _buckets: list[tuple[int, int]] = field(init=False, factory=list)
    _order: DataOrder = field(init=False)
    _features: FeatureCache = field(init=False)
    _tables: dict[Hashable, tuple[np.ndarray, np.ndarray]] = field(init=False, factory=dict)
    _params: list[str] = field(init=False, factory=list)

    def __attrs_post_init__(self) -> None:
        ppt = self.pipeline.pixels_per_token
        self._buckets = bucket_sizes(self.resolution, ppt)
        self._order = DataOrder(self.seed, len(self.samples))
        root = self.pipeline.checkpoint.root
        self.shift = training_sigma_shift(root) if self.timestep_shift is None else self.timestep_shift
        if self.batch < 1:
            raise UsageError(f"a micro-batch needs >= 1 images, got {self.batch}")
        self._features = FeatureCache(self.cache_dir, f"{root}|{self.dtype.value}|{self.text_length}")
        probe = self._forward((1, 1))
        self._params = [p.name for p in probe.params]
        kind = "full" if self.full else f"r{self.rank}:a{self.alpha}"
        self.model_key = model_fingerprint(probe, self.trainable) + f":{kind}"

    @property
    def text_length(self) -> int:
        """Text rows per caption: the checkpoint's `max_sequence_length` (`Flux2Pipeline.text_length`)."""
        return int(self.pipeline.text_length)

    @property
    def trainable(self) -> list[str]:
        if self.full:
            return list(self._params)
        return [n for m in self.modules for n in slot_inputs(m)]

    @property
    def ranks(self) -> dict[str, int]:
        return {} if self.full else {f"{m}.weight": self.rank for m in self.modules}

    def _forward(self, grid: tuple[int, int]):  # type: ignore[no-untyped-def]
        cfg = self.pipeline.checkpoint.configs.transformer
        with lora_slots(self.ranks):
            return build_transformer(
                cfg, batch=self.batch, n_img=grid[0] * grid[1], n_txt=self.text_length, dtype=self.dtype
            )

    def programs(self, key: Hashable) -> StepPrograms:
        if key not in self._programs:
            scales = {} if self.full else {slot_inputs(m)[1]: self.alpha / self.rank for m in self.modules}
            self._programs[key] = build_step_programs(
                self._forward(key), self.trainable, opt=self.opt, max_grad_norm=self.max_grad_norm,  # type: ignore[arg-type]
                accumulate_steps=self.accumulate, checkpoint=self.checkpoint_blocks, scales=scales,
            )  # fmt: skip
        return self._programs[key]

    def frozen_weights(self) -> Any:
        """The transformer's weights bound to the training programs' parameters (all of them frozen;
        none in a full fine-tune, where every weight is a trainable input)."""
        if self.full:
            return {}
        return bind_weights(self.programs((1, 1)).step, self.pipeline.checkpoint.transformer)

    def initial_full_params(self) -> dict[str, np.ndarray]:
        """Every transformer weight as an fp32 master value (the start of a full fine-tune)."""
        source = self.pipeline.checkpoint.transformer
        bound = bind_weights(self._forward((1, 1)), source)
        return {n: np.array(bound[n], dtype=np.float32) for n in self._params}

    def encode_all(self, on_sample: Any = None) -> None:
        """Latents and text features of every sample (text once per distinct caption; cached on disk
        when `cache_dir` is set). With `batch` > 1 every sample must fall in one bucket."""
        for i, sample in enumerate(self.samples):
            size = assign_bucket(sample, self._buckets)
            if self.batch > 1 and self._encoded and size != (first := next(iter(self._encoded.values())).size):
                raise UsageError(
                    f"{sample.image}: its bucket {size[0]}x{size[1]} differs from {first[0]}x{first[1]}; "
                    f"micro-batches of {self.batch} images need one bucket",
                    hint="give images of one aspect ratio, or train with a batch of 1 (and accumulate)",
                )
            self._encoded[i] = self._features.get(sample, size, self.pipeline.encode_image, self.pipeline.encode)
            if on_sample is not None:
                on_sample(i, sample, size)

    def micro_batch(self, rng: np.random.Generator, data: dict[str, Any]) -> tuple[Hashable, dict[str, np.ndarray]]:
        indices = []
        for _ in range(self.batch):
            idx, state = self._order.advance(data)
            data.update(state)
            indices.append(idx)
        return self.batch_inputs(indices, rng)

    def batch_inputs(
        self, indices: Sequence[int], rng: np.random.Generator, *, sigmas: np.ndarray | None = None,
        captions_of: Sequence[int] | None = None,
    ) -> tuple[Hashable, dict[str, np.ndarray]]:  # fmt: skip
        """(token grid, inputs + `target`) of the samples `indices` (len = `batch`): σ drawn from `rng`
        unless given, then the noise; `captions_of`: read the text features of these samples instead
        (a held-out check of whether the model uses the caption: the loss with others' captions)."""
        if any(i not in self._encoded for i in indices):
            self.encode_all()
        encs = [self._encoded[i] for i in indices]
        texts = [self._encoded[i].text for i in (indices if captions_of is None else captions_of)]
        ppt = self.pipeline.pixels_per_token
        grid = (encs[0].size[1] // ppt, encs[0].size[0] // ppt)
        if sigmas is None and self.sigma_draw is not None:
            sigmas = self.sigma_draw(rng, len(encs))
        elif sigmas is None:
            sigmas = sample_sigmas(rng, len(encs), scheme=self.scheme, shift=self.shift)
        latents = np.concatenate([e.latents for e in encs]).astype(np.float32)
        batch = flow_batch(latents, rng, sigmas)
        cfg = self.pipeline.checkpoint.configs.transformer
        if grid not in self._tables:
            self._tables[grid] = flux2_rope_tables(
                self.text_length, *grid, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta
            )
        cos, sin = self._tables[grid]
        dt = self.dtype.np
        inputs = {
            "latents": batch.noisy.astype(dt),
            "text_features": np.concatenate(texts).astype(dt),
            "timestep_proj": flux2_timestep_proj(
                sigmas * 1000, dtype=self.dtype, channels=cfg.timestep_guidance_channels
            ),
            "rope_cos": cos,
            "rope_sin": sin,
            TARGET: batch.target,
        }
        return grid, inputs


def lora_session(model: Path, data: Path, settings: LoraSettings, *, backend: str | None = None) -> LoraSession:
    """Open the klein checkpoint at `model`, scan `data`, and set up the LoRA run of `settings`."""
    from dif_frontend_flux2.plugin import _pipeline

    s = settings
    pipeline = _pipeline(model, dtype=s.dtype, backend=backend)
    shapes = linear_shapes(pipeline)
    modules = match_targets(shapes, s.targets or ATTENTION_TARGETS)
    opt = AdamW(lr=s.lr, weight_decay=s.weight_decay)
    task = KleinLoraTask(
        pipeline, scan_folder(data), modules, s.rank, s.alpha, opt, resolution=s.resolution, accumulate=s.accumulate,
        max_grad_norm=s.max_grad_norm, checkpoint_blocks=s.checkpoint_blocks, dtype=DType(s.dtype),
        scheme=s.timestep_sampling, seed=s.seed, cache_dir=s.cache_dir, timestep_shift=s.timestep_shift,
        batch=s.batch_size,
    )  # fmt: skip
    params = init_factors(np.random.default_rng(s.seed), {m: shapes[m] for m in modules}, s.rank)
    schedule = LrSchedule(s.lr, s.steps, warmup=s.warmup, cosine=s.cosine)
    trainer = Trainer(
        task, task.frozen_weights(), params, opt, schedule, accumulate=s.accumulate, backend=backend, seed=s.seed,
        settings={"family": "flux2", "model": str(model), "rank": s.rank, "alpha": s.alpha, "modules": list(modules),
                  "timestep_shift": task.shift, "batch_size": s.batch_size},
    )  # fmt: skip
    return LoraSession(task, trainer, s)


@define
class FullSession:
    """A klein full fine-tune as `dif train full` drives it: every transformer weight trains."""

    task: KleinLoraTask
    trainer: Trainer
    settings: LoraSettings

    @property
    def modules(self) -> Sequence[str]:
        return self.task.trainable

    def encode_all(self, on_sample: Any = None) -> None:
        self.task.encode_all(on_sample)

    def export(self, folder: Path) -> Path:
        """A diffusers folder at `folder`: `transformer/` written anew (the checkpoint's storage dtype,
        its config.json), every other component linked to the source checkpoint's."""
        from dif.checkpoint import storage_dtype
        from dif.serialize.diftensor import save_tensors

        ck = self.task.pipeline.checkpoint
        folder = Path(folder)
        (folder / "transformer").mkdir(parents=True, exist_ok=True)
        dt = storage_dtype(ck.transformer, by="first").np
        tensors = {n: v.astype(dt) for n, v in self.trainer.params.items()}
        save_tensors(folder / "transformer" / "diffusion_pytorch_model.safetensors", tensors, dif_metadata=False)
        root = Path(ck.root)
        (folder / "transformer" / "config.json").write_text((root / "transformer" / "config.json").read_text())
        for entry in sorted(root.iterdir()):
            target = folder / entry.name
            if entry.name == "transformer" or target.exists() or target.is_symlink():
                continue
            if entry.is_dir():
                target.symlink_to(entry.resolve(), target_is_directory=True)
            else:
                target.write_bytes(entry.read_bytes())
        return folder


def full_session(model: Path, data: Path, settings: LoraSettings, *, backend: str | None = None) -> FullSession:
    """Open the klein checkpoint at `model`, scan `data`, set up a full fine-tune of its transformer
    (rank, alpha and targets of `settings` are unused)."""
    from dif_frontend_flux2.plugin import _pipeline

    s = settings
    pipeline = _pipeline(model, dtype=s.dtype, backend=backend)
    opt = AdamW(lr=s.lr, weight_decay=s.weight_decay)
    task = KleinLoraTask(
        pipeline, scan_folder(data), (), s.rank, s.alpha, opt, resolution=s.resolution, accumulate=s.accumulate,
        max_grad_norm=s.max_grad_norm, checkpoint_blocks=s.checkpoint_blocks, dtype=DType(s.dtype),
        scheme=s.timestep_sampling, seed=s.seed, cache_dir=s.cache_dir, full=True, timestep_shift=s.timestep_shift,
        batch=s.batch_size,
    )  # fmt: skip
    schedule = LrSchedule(s.lr, s.steps, warmup=s.warmup, cosine=s.cosine)
    trainer = Trainer(
        task, {}, task.initial_full_params(), opt, schedule, accumulate=s.accumulate, backend=backend, seed=s.seed,
        settings={"family": "flux2", "model": str(model), "full": True, "timestep_shift": task.shift,
                  "batch_size": s.batch_size},
    )  # fmt: skip
    return FullSession(task, trainer, s)
