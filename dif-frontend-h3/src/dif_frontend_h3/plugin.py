"""Entry point of dif-frontend-h3 (`[project.entry-points.dif] h3 = "dif_frontend_h3.plugin"`).

Registers the MiniMax-H3 frontend (detection, its settings with their defaults, the pipeline factory,
`info`'s description) and adds the `dif h3` command group. The settings here are the only statement of
the defaults; a checkpoint may carry its own (`dif_defaults` in model_index.json: the embedded tiny
model's small canvas), which replace the published ones for settings not given. Nothing heavy is
imported here: the pipeline and the CLI body load when used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attrs import evolve

from dif.frontend import RNG, SEED, FrontendInfo, SettingSpec, frontend_hooks
from dif_frontend_h3 import DEFAULT_CHECKPOINT, __version__

PUBLISHED_DEFAULTS = {"frames": 124, "width": 1344, "height": 768, "steps": 50}


def _detect(path: Path) -> bool:
    from dif_frontend_h3.config import is_h3_folder

    return Path(path).is_dir() and is_h3_folder(Path(path))


def _pipeline(path: str | Path, *, dtype: str = "auto", weight_variant: str | None = None, **options: Any) -> Any:
    """An `H3Pipeline` for the folder at `path` (dtype "auto": the DiT's storage dtype by most tensors;
    options: backend, vram_budget, on_step, on_tile, on_stage)."""
    from dif.checkpoint import storage_dtype
    from dif.dtypes import DType
    from dif_frontend_h3.pipeline import H3Pipeline
    from dif_frontend_h3.weights import open_checkpoint

    checkpoint = open_checkpoint(path, variant=weight_variant)
    run_dtype = storage_dtype(checkpoint.transformer) if dtype == "auto" else DType(dtype)
    return H3Pipeline(checkpoint, dtype=run_dtype, **options)


def _describe(path: Path | None, **options: Any) -> tuple[str, dict[str, Any]]:
    from dif_frontend_h3.cli import describe

    return describe(path, **options)


H3_SEED = evolve(SEED, doc="Noise seed (the video noise, then the audio noise, from --rng); -1 draws a fresh one")
H3_RNG = evolve(
    RNG,
    doc="Noise generator: numpy (PCG64), or torch's CPU / CUDA stream (the seed then draws diffusers' "
    "noise: the keyframes', the video's, then the audio's from one generator)",
)

INFO = FrontendInfo(
    name="h3",
    description="MiniMax-H3: text -> video + stereo audio, 33B packed-sequence DiT, Qwen3-VL text encoder, "
    "ViT video VAE, BigVGAN-style audio VAE, MP4 out",
    detect=_detect,
    variants=("h3",),
    settings=(
        SettingSpec(
            "frames",
            None,
            "Frames at 24 fps, of the form 17n + 5",
            minimum=1,
            kind=int,
            default_doc="124, or the checkpoint's own",
        ),
        SettingSpec(
            "width",
            None,
            "Width in pixels, a multiple of 32",
            minimum=32,
            kind=int,
            flags=("-W", "--width"),
            default_doc="1344, or the checkpoint's own",
        ),
        SettingSpec(
            "height",
            None,
            "Height in pixels, a multiple of 32",
            minimum=32,
            kind=int,
            flags=("-H", "--height"),
            default_doc="768, or the checkpoint's own",
        ),
        SettingSpec(
            "steps",
            None,
            "Schedule grid points (steps - 1 model evaluations, as the reference counts)",
            minimum=2,
            kind=int,
            default_doc="50, or the checkpoint's own",
        ),
        H3_SEED,
        H3_RNG,
    ),  # fmt: skip
    pipeline=_pipeline,
    revision=__version__,
    default_checkpoint=DEFAULT_CHECKPOINT,
    describe=_describe,
)


register_frontends, register_commands = frontend_hooks(INFO, "dif_frontend_h3.cli:h3")
