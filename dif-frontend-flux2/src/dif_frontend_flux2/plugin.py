"""Entry point of dif-frontend-flux2 (`[project.entry-points.dif] flux2 = "dif_frontend_flux2.plugin"`).

Registers the FLUX.2 [klein] frontend (detection, its settings with their defaults, the pipeline
factory, `info`'s description) and adds the `dif flux2` command group. The settings here are the
only statement of the defaults: the CLI options and their help, `dif.load` and the pipeline read
them. Nothing heavy is imported here: the pipeline and the CLI body load when used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dif.frontend import SAMPLING, SEED, FrontendInfo, SettingSpec, frontend_hooks, size_settings
from dif.train.tasks import register_full_trainer, register_lora_trainer
from dif_frontend_flux2 import DEFAULT_CHECKPOINT, __version__


def _detect(path: Path) -> bool:
    from dif_frontend_flux2.weights import detect

    return detect(path)


def _pipeline(
    path: str | Path,
    *,
    dtype: str = "auto",
    weight_variant: str | None = None,
    base: Path | None = None,
    transformer_file: Path | None = None,
    vae_file: Path | None = None,
    text_encoder_file: Path | None = None,
    config_variant: str | None = None,
    lora: tuple[Any, ...] = (),
    lora_allow_unmatched: bool = False,
    lora_mode: str = "auto",
    lora_swappable: bool = False,
    **options: Any,
) -> Any:
    """A `Flux2Pipeline` for the checkpoint at `path` (dtype "auto": the transformer's storage dtype,
    by its first float tensor; `lora`: `FILE[:SCALE]` specs for the transformer, merged or unmerged
    by `lora_mode` ("auto": `dif.lora.mode` decides, unmerged when `lora_swappable`), their text-encoder
    adapters merged always; options: backend, vram_budget, on_step, on_stage)."""
    from dif.checkpoint import storage_dtype
    from dif.dtypes import DType
    from dif_frontend_flux2.pipeline import Flux2Pipeline
    from dif_frontend_flux2.weights import open_checkpoint

    checkpoint = open_checkpoint(
        path,
        variant=weight_variant,
        base=base,
        transformer_file=transformer_file,
        vae_file=vae_file,
        text_encoder_file=text_encoder_file,
        config_variant=config_variant,
        loras=tuple(lora or ()),
        lora_allow_unmatched=lora_allow_unmatched,
        lora_mode=lora_mode,
        lora_swappable=lora_swappable,
    )
    run_dtype = storage_dtype(checkpoint.transformer, by="first") if dtype == "auto" else DType(dtype)
    return Flux2Pipeline(checkpoint, dtype=run_dtype, **options)


def _describe(path: Path | None, **options: Any) -> tuple[str, dict[str, Any]]:
    from dif_frontend_flux2.cli import describe

    return describe(path, **options)


SIZE = "Image {} in pixels, a multiple of the checkpoint's token size (16 for klein)"

INFO = FrontendInfo(
    name="flux2",
    description="FLUX.2 [klein] 4B/9B, base and step-distilled: Qwen3 text encoder, Flux2 DiT, Flux2 VAE",
    detect=_detect,
    variants=("klein-4b", "klein-9b", "klein-base-4b", "klein-base-9b"),
    settings=(
        SettingSpec("steps", None, "Denoising steps", minimum=1, by_kind={"distilled": 4, "base": 50}),
        SettingSpec(
            "guidance",
            None,
            "CFG scale; CFG runs on base models above 1, distilled models ignore it",
            minimum=0.0,
            by_kind={"distilled": 1.0, "base": 4.0},
            flags=("--guidance", "--cfg-scale"),
        ),
        *size_settings(SIZE),
        SEED,
        *SAMPLING,
    ),
    pipeline=_pipeline,
    revision=__version__,
    default_checkpoint=DEFAULT_CHECKPOINT,
    describe=_describe,
)


register_frontends, register_commands = frontend_hooks(INFO, "dif_frontend_flux2.cli:flux2")

register_lora_trainer("flux2", "dif_frontend_flux2.train:lora_session")  # `dif train lora` for klein
register_full_trainer("flux2", "dif_frontend_flux2.train:full_session")  # `dif train full`
