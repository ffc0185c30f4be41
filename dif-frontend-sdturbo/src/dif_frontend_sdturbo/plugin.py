"""Entry point of dif-frontend-sdturbo (`[project.entry-points.dif] sdturbo = "dif_frontend_sdturbo.plugin"`).

Registers the SD-Turbo frontend (detection, its settings with their defaults, the pipeline factory,
`info`'s description) and adds the `dif sdturbo` command group. The settings here are the only
statement of the defaults: the CLI options and their help, `dif.load` and the pipeline read them.
Nothing heavy is imported here: the pipeline and the CLI body load when used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dif.frontend import RNG, SEED, FrontendInfo, SettingSpec, frontend_hooks, size_settings
from dif_frontend_sdturbo import DEFAULT_CHECKPOINT, __version__


def _detect(path: Path) -> bool:
    from dif_frontend_sdturbo.config import is_sd_folder

    path = Path(path)
    if path.is_dir():
        return is_sd_folder(path)
    from dif_frontend_sdturbo.weights import is_original_file, is_unet_file

    return is_unet_file(path) or is_original_file(path)


def _pipeline(
    path: str | Path,
    *,
    dtype: str = "auto",
    weight_variant: str | None = None,
    unet_file: Path | None = None,
    vae_file: Path | None = None,
    text_encoder_file: Path | None = None,
    taesd: Path | None = None,
    fast_vae: bool = False,
    **options: Any,
) -> Any:
    """An `SdPipeline` for the checkpoint at `path` (dtype "auto": the UNet's storage dtype; `taesd`: a
    TAESD folder or file, default the checkpoint's taesd/ folder when `fast_vae`; options: backend,
    vram_budget, on_step, on_stage)."""
    import attrs

    from dif.checkpoint import storage_dtype
    from dif.dtypes import DType
    from dif_frontend_sdturbo.pipeline import SdPipeline
    from dif_frontend_sdturbo.weights import default_taesd, open_checkpoint, open_taesd

    ck = open_checkpoint(
        path, variant=weight_variant, unet_file=unet_file, vae_file=vae_file, text_encoder_file=text_encoder_file,
        taesd=taesd,
    )  # fmt: skip
    if fast_vae and ck.taesd is None and (found := default_taesd(ck)) is not None:
        ck = attrs.evolve(ck, taesd=open_taesd(found, ck))
    run_dtype = storage_dtype(ck.unet) if dtype == "auto" else DType(dtype)
    return SdPipeline(ck, dtype=run_dtype, fast_vae=fast_vae, **options)


def _describe(path: Path | None, **options: Any) -> tuple[str, dict[str, Any]]:
    from dif_frontend_sdturbo.cli import describe

    return describe(path, **options)


SIZE = "Image {} in pixels, rounded up to a multiple of 64 (the VAE's 8 x the UNet's 3 downsamplings)"
SAMPLER = SettingSpec(
    "sampler", "euler", "Sampler (Euler over the discrete schedule; at 1 step it equals Euler ancestral)",
    choices=("euler",), flags=("--sampling-method",),
)  # fmt: skip
SCHEDULER = SettingSpec("scheduler", "simple", "Sigma schedule: the checkpoint's own spacing", choices=("simple",))

INFO = FrontendInfo(
    name="sdturbo",
    description="SD-Turbo (and SD 1.x / 2.x epsilon checkpoints): CLIP text encoder, UNet2DCondition, "
    "AutoencoderKL or TAESD (--fast-vae)",
    detect=_detect,
    variants=("sd-turbo",),
    settings=(
        SettingSpec("steps", None, "Denoising steps", minimum=1, by_kind={"turbo": 1, "base": 25}),
        SettingSpec(
            "guidance",
            None,
            "CFG scale g, eps = eps_u + g (eps_c - eps_u), on when g > 1",
            minimum=0.0,
            by_kind={"turbo": 0.0, "base": 7.5},
            flags=("--guidance", "--cfg-scale"),
        ),
        *size_settings(SIZE),
        SEED,
        SAMPLER,
        SCHEDULER,
        RNG,
    ),
    pipeline=_pipeline,
    revision=__version__,
    default_checkpoint=DEFAULT_CHECKPOINT,
    describe=_describe,
)


register_frontends, register_commands = frontend_hooks(INFO, "dif_frontend_sdturbo.cli:sdturbo")
