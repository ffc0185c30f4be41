"""The numerical gate of the format search (`dif.passes.formats_search`): is a candidate format's run close
enough to the baseline's (bf16) over a whole sampling schedule?

Two measurements, both against the baseline run of the same prompt, seed and schedule:

- per step, the candidate denoiser's output on the *baseline's* inputs of that step (teacher forcing: each
  step's error is the format's own, not drift carried from earlier steps): cosine similarity and relative L2
  (||c - b|| / ||b||), every step must pass `cosine_min` and `rel_l2_max`;
- the final image of the candidate's own (free-running) run against the baseline image: PSNR and the 8x8-window
  SSIM of `dif.quality.metrics`, reported always and gated only when `psnr_min` / `ssim_min` are set.

`record_run` drives a `dif.image_pipeline.TextToImagePipeline` through its public stages (encode, predictor,
schedule, decode) and the kit's sampling loop, recording what the gate needs.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from attrs import define, field, frozen

from dif.quality.metrics import psnr, ssim


@frozen
class GateConfig:
    """The gate's thresholds (defaults: the issue's). None: reported, not gated."""

    cosine_min: float = 0.995
    rel_l2_max: float = 5e-2
    psnr_min: float | None = None
    ssim_min: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return {"cosine_min": self.cosine_min, "rel_l2_max": self.rel_l2_max,
                "psnr_min": self.psnr_min, "ssim_min": self.ssim_min}  # fmt: skip


@define
class RunRecord:
    """One run of a pipeline: per step the denoiser's inputs (latents, timestep) and output, the final image
    (H, W, 3) uint8, the denoiser outputs on a teacher's inputs (when given one), and the denoise wall time."""

    step_inputs: list[tuple[np.ndarray, Any]] = field(factory=list)
    step_outputs: list[np.ndarray] = field(factory=list)
    forced_outputs: list[np.ndarray] = field(factory=list)
    image: np.ndarray | None = None
    denoise_seconds: float = 0.0
    forward_seconds: list[float] = field(factory=list)


@frozen
class StepNumbers:
    step: int
    cosine: float
    rel_l2: float


@frozen
class GateReport:
    """The gate's verdict and every number it judged."""

    passed: bool
    reason: str
    steps: tuple[StepNumbers, ...]
    psnr: float | None  # None: identical images
    ssim: float | None
    config: GateConfig

    @property
    def worst_cosine(self) -> float:
        return min((s.cosine for s in self.steps), default=1.0)

    @property
    def worst_rel_l2(self) -> float:
        return max((s.rel_l2 for s in self.steps), default=0.0)

    def to_dict(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "reason": self.reason,
            "config": self.config.to_dict(),
            "worst_cosine": self.worst_cosine,
            "worst_rel_l2": self.worst_rel_l2,
            "steps": [{"step": s.step, "cosine": s.cosine, "rel_l2": s.rel_l2} for s in self.steps],
            "psnr_db": self.psnr,
            "ssim": self.ssim,
        }


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    """Cosine similarity of two arrays of one shape (float64); 1.0 when both are zero."""
    x, y = np.asarray(a, np.float64).ravel(), np.asarray(b, np.float64).ravel()
    nx, ny = float(np.linalg.norm(x)), float(np.linalg.norm(y))
    if nx == 0.0 and ny == 0.0:
        return 1.0
    return float(x @ y) / max(nx * ny, 1e-300)


def rel_l2(candidate: np.ndarray, reference: np.ndarray) -> float:
    """||candidate - reference|| / ||reference|| (float64)."""
    c, r = np.asarray(candidate, np.float64), np.asarray(reference, np.float64)
    return float(np.linalg.norm(c - r)) / max(float(np.linalg.norm(r)), 1e-300)


def judge(
    reference: Sequence[np.ndarray],
    candidate: Sequence[np.ndarray],
    config: GateConfig,
    *,
    reference_image: np.ndarray | None = None,
    candidate_image: np.ndarray | None = None,
) -> GateReport:
    """The gate over per-step denoiser outputs (`candidate[i]` against `reference[i]`) and the final images."""
    if len(reference) != len(candidate) or not reference:
        raise ValueError(
            f"the gate needs one candidate output per reference step, got {len(candidate)} for {len(reference)}"
        )
    steps = tuple(
        StepNumbers(i + 1, cosine(c, r), rel_l2(c, r))
        for i, (r, c) in enumerate(zip(reference, candidate, strict=True))
    )
    failures = [
        f"step {s.step}: cosine {s.cosine:.5f} < {config.cosine_min}"
        for s in steps
        if not s.cosine >= config.cosine_min
    ] + [
        f"step {s.step}: rel-L2 {s.rel_l2:.4g} > {config.rel_l2_max}"
        for s in steps
        if not s.rel_l2 <= config.rel_l2_max
    ]
    p = s_ = None
    if reference_image is not None and candidate_image is not None:
        p, s_ = psnr(candidate_image, reference_image), ssim(candidate_image, reference_image)
        if config.psnr_min is not None and p is not None and p < config.psnr_min:
            failures.append(f"image PSNR {p:.2f} dB < {config.psnr_min}")
        if config.ssim_min is not None and s_ < config.ssim_min:
            failures.append(f"image SSIM {s_:.4f} < {config.ssim_min}")
    worst = min(steps, key=lambda s: s.cosine)
    summary = (
        f"worst step cosine {worst.cosine:.5f} (step {worst.step}), worst rel-L2 {max(s.rel_l2 for s in steps):.4g}"
    )
    if p is not None or s_ is not None:
        summary += f", image PSNR {'inf' if p is None else f'{p:.2f}'} dB, SSIM {s_:.4f}"
    reason = ("failed: " + "; ".join(failures[:4]) + f" ({summary})") if failures else f"passed: {summary}"
    return GateReport(not failures, reason, steps, p, s_, config)


def record_run(
    pipe: Any,
    prompt: str,
    *,
    width: int,
    height: int,
    steps: int,
    seed: int,
    teacher: RunRecord | None = None,
) -> RunRecord:
    """Run `pipe` (a `TextToImagePipeline`) on `prompt` at width x height for `steps` steps from the seeded
    noise, recording each step's denoiser inputs and output and the decoded image; with `teacher`, also the
    denoiser's outputs on the teacher's inputs of every step (the gate's per-step measurement)."""
    from dif.image_pipeline import ImageRequest
    from dif.kit.sampling import sample

    ppt = pipe.pixels_per_token
    grid = (height // ppt, width // ppt)
    req = ImageRequest(prompt, seed=seed, width=width, height=height, steps=steps)
    _, _, cfg, _ = pipe.resolve(req)
    schedule = pipe.schedule(grid[0] * grid[1], steps)
    noise = pipe.initial_noise(req, *grid)
    cond = pipe.encode(prompt)
    uncond = pipe.encode("") if cfg else None
    predict = pipe.predictor(*grid)
    record = RunRecord()

    def timed(x: np.ndarray, t: Any, c: Any) -> np.ndarray:
        start = time.perf_counter()
        out = predict(x, t, c)
        record.forward_seconds.append(time.perf_counter() - start)
        return out

    def recording(x: np.ndarray, t: Any, c: Any) -> np.ndarray:
        out = timed(x, t, c)
        if c is cond:  # the conditional call of a step (CFG adds an unconditional one)
            record.step_inputs.append((np.array(x), t))
            record.step_outputs.append(np.array(out))
        return out

    x = noise.astype(pipe.dtype.np)
    start = time.perf_counter()
    guidance = pipe.resolve(req)[1]
    latents = sample(x, schedule, recording, cond, uncond=uncond, guidance=guidance, cfg_base=pipe.cfg_base)
    record.denoise_seconds = time.perf_counter() - start
    record.image = pipe.decode(latents, *grid)
    if teacher is not None:
        record.forced_outputs = [np.array(predict(tx, tt, cond)) for tx, tt in teacher.step_inputs]
    return record
