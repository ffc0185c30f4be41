"""The Python API: `dif.load(path)(prompt)` -> an image, through the installed frontends.

Where it sits: beside the CLI, on the same path: `load` finds the frontend (`FrontendInfo.detect`
over the plugins' frontends, or the named family) and builds its pipeline with
`FrontendInfo.pipeline`; a call resolves the settings with `FrontendInfo.resolve_settings`, so
the defaults are the CLI's (dtype auto, the checkpoint's native size, its steps and guidance).
`GeneratedImage.save` writes the PNG the CLI writes (`dif.report.save_image_run`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from attrs import define, frozen

from dif.errors import CheckpointError, UsageError

if TYPE_CHECKING:
    from PIL import Image

    from dif.frontend import FrontendInfo
    from dif.image_pipeline import TextToImagePipeline
    from dif.kit.sampling import StepCallback
    from dif.report import ImageRun

DEFAULT_FAMILY = "flux2"
"""The family whose embedded checkpoint `load()` opens when given neither a path nor a family."""


def load(
    path: str | Path | None = None,
    *,
    family: str | None = None,
    backend: str | None = None,
    dtype: str = "auto",
    vram_budget: int | None = None,
    lora: Sequence[str | Path | tuple[str | Path, float]] = (),
    lora_allow_unmatched: bool = False,
    **options: Any,
) -> ImagePipeline:
    """The pipeline of the checkpoint at `path` (a diffusers folder, a single file, or a Hugging Face
    repo id "org/name[@revision]" already in the local HF cache: `dif.weights.hfcache`), its family
    detected by the installed frontends unless `family` names it; with no path, the embedded tiny
    checkpoint of `family` (default "flux2"). `backend` as the CLI's --backend (None: the best
    available), `dtype` "auto" | "f32" | "bf16" | "f16", `vram_budget` in bytes for the whole pipeline
    (text encoder + denoiser + VAE together; see `dif.program_cache.ProgramCache`). `lora`: adapters
    for the denoiser (and the text encoder, always merged, where a file adapts it), each "FILE",
    "FILE:SCALE" or (FILE, SCALE), as the CLI's --lora (`dif.lora`);
    `lora_allow_unmatched` as --lora-allow-unmatched; `lora_mode` (an option of FLUX.2 and Krea 2,
    --lora-mode) "auto" (default: the planner decides, `dif.lora.mode`), "merged", or "unmerged": side
    GEMMs that `ImagePipeline.set_loras` swaps without preparing again; `lora_swappable=True` (an
    option, --lora-swappable) asks for swapping, so "auto" runs them unmerged. `options` are the frontend's own
    pipeline options, as its CLI flags (FLUX.2: `vae_tiling` "auto" | "on" | "off", --vae-tiling)."""
    from dif.frontend import detect_frontend
    from dif.plugins import frontends

    known = frontends()
    if path is not None:  # an existing path, or a repo id found in the local Hugging Face cache
        from dif.weights.hfcache import resolve_model_path

        path = resolve_model_path(path)
    if family is not None or path is None:
        name = family or DEFAULT_FAMILY
        if name not in known:
            raise UsageError(
                f"no frontend '{name}' is installed",
                hint=f"installed: {', '.join(sorted(known)) or 'none'} (see `dif plugins`)",
            )
        info = known[name]
        if path is not None and not info.detect(Path(path)):
            raise CheckpointError(f"{path}: not a checkpoint the '{name}' frontend loads")
    else:
        info = detect_frontend(path, known)
    target = Path(path) if path is not None else info.default_checkpoint
    if target is None or info.pipeline is None:
        raise UsageError(f"frontend '{info.name}' has no embedded checkpoint or pipeline", hint="pass a path")
    extra: dict[str, Any] = dict(options)
    if lora:  # only frontends that merge adapters take these keywords
        from dif.lora import LoraSpec

        extra |= {"lora": tuple(LoraSpec.parse(s) for s in lora), "lora_allow_unmatched": lora_allow_unmatched}
    pipe = info.pipeline(target, dtype=dtype, backend=backend, vram_budget=vram_budget, **extra)
    return ImagePipeline(info, pipe)


@define
class ImagePipeline:
    """A loaded checkpoint: call it with a prompt and settings to get a `GeneratedImage`."""

    info: FrontendInfo
    pipeline: TextToImagePipeline

    @property
    def family(self) -> str:
        return self.info.name

    def set_loras(
        self, lora: Sequence[str | Path | tuple[str | Path, float]], *, allow_unmatched: bool = False
    ) -> None:
        """Swap the adapters (or their scales; empty: none) of a pipeline loaded with
        `lora_mode="unmerged"` or `lora_swappable=True`: new side-GEMM inputs for the programs already
        prepared, no rebuild. The text encoder's adapters were merged at load: a set that changes them
        (another file or scale adapting the text encoder) is refused with a `UsageError`."""
        from dif.lora import LoraSpec

        unmerged = getattr(getattr(self.pipeline, "checkpoint", None), "unmerged", None)
        if unmerged is None:
            raise UsageError(
                "set_loras needs a pipeline loaded with lora_mode='unmerged' (or lora_swappable=True)",
                hint="dif.load(path, lora=[...], lora_swappable=True); merged LoRAs are part of the weights",
            )
        unmerged.set([LoraSpec.parse(s) for s in lora], allow_unmatched=allow_unmatched)

    def __call__(
        self,
        prompt: str,
        *,
        negative_prompt: str = "",
        init_noise: np.ndarray | None = None,
        on_step: StepCallback | None = None,
        check_finite: bool = True,
        allow_nonfinite_weights: bool = False,
        ref_images: Sequence[Any] = (),
        init_image: Any = None,
        strength: float | None = None,
        mask: Any = None,
        batch: int | None = None,
        kv_cache: bool | None = None,
        **settings: Any,
    ) -> Any:
        """One image of `prompt` (a `GeneratedImage`), or with `batch=N` a list of N (one denoiser
        program of batch N, image i seeded seed + i). `settings` are the frontend's (`info.settings`:
        steps, guidance, width, height, seed, sampler, scheduler, rng: the CLI's --sampling-method,
        --scheduler, --rng names); left out, they take the checkpoint's defaults (seed: a fresh random
        one, recorded in the result; -1 as well). `on_step(done, total, latents)` sees every step.
        `ref_images` (FLUX.2 klein: up to 4), `init_image` with `strength` and `mask` (img2img,
        inpainting) are paths, PIL images or uint8 arrays; `kv_cache` is the CLI's --kv-cache.
        `check_finite` and `allow_nonfinite_weights` are the CLI's --check-finite/--no-check-finite
        and --allow-nonfinite-weights (`dif.kit.finite.run_checks`)."""
        from dif.image_pipeline import image_request
        from dif.kit.finite import run_checks
        from dif.noise import random_seed

        started = time.perf_counter()
        resolved = self.info.resolve_settings(settings)
        if resolved.get("seed") in (None, -1):  # -1: random, as the CLI's --seed -1
            resolved["seed"] = random_seed()
        inputs = {"ref_images": ref_images, "init_image": init_image, "strength": strength, "mask": mask}
        req = image_request(
            prompt, resolved, negative_prompt=negative_prompt, init_noise=init_noise, batch=batch, kv_cache=kv_cache,
            **inputs,
        )  # fmt: skip
        self.pipeline.on_step = on_step
        try:
            with run_checks(finite=check_finite, allow_nonfinite_weights=allow_nonfinite_weights):
                runs = self.pipeline.generate_batch(req) if req.batch > 1 else [self.pipeline.generate(req)]
        finally:
            self.pipeline.on_step = None
        images = [GeneratedImage(run, self.info.name, self.info.revision, started) for run in runs]
        return images if batch is not None else images[0]


@frozen(eq=False)
class GeneratedImage:
    """What one call made: `run` (pixels, latents, settings, timings, warnings) and the image."""

    run: ImageRun
    frontend: str
    version: str
    started: float

    @property
    def image(self) -> Image.Image:
        """The picture as a PIL image (RGB)."""
        from PIL import Image

        return Image.fromarray(self.run.pixels, mode="RGB")

    @property
    def settings(self) -> dict[str, Any]:
        return dict(self.run.settings)

    @property
    def warnings(self) -> tuple[str, ...]:
        return self.run.warnings

    def save(self, path: str | Path, *, latents: str | Path | None = None) -> dict[str, Any]:
        """Write the PNG (A1111 `parameters` + the dif JSON chunk, as `dif NAME generate` writes it)
        and, with `latents`, the final latents and initial noise; returns the run summary."""
        from dif.report import save_image_run

        summary, _ = save_image_run(
            self.run,
            Path(path),
            latents=None if latents is None else Path(latents),
            frontend=self.frontend,
            version=self.version,
            started=self.started,
        )
        return summary
