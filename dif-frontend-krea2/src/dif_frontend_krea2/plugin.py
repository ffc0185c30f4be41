"""Entry point of dif-frontend-krea2 (`[project.entry-points.dif] krea2 = "dif_frontend_krea2.plugin"`).

Registers the Krea 2 frontend (detection, its settings with their defaults, the pipeline factory,
`info`'s description) and adds the `dif krea2` command group. The settings here are the only
statement of the defaults: the CLI options and their help, `dif.load` and the pipeline read them.
Nothing heavy is imported here: the pipeline and the CLI body load when used.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dif.frontend import SAMPLING, SEED, FrontendInfo, SettingSpec, frontend_hooks, size_settings
from dif.train.tasks import register_lora_trainer
from dif_frontend_krea2 import DEFAULT_CHECKPOINT, __version__


def _detect(path: Path) -> bool:
    from dif_frontend_krea2.config import is_krea2_folder

    path = Path(path)
    if path.is_dir():
        return is_krea2_folder(path)
    from dif_frontend_krea2.weights import is_transformer_file

    return is_transformer_file(path)


def _pipeline(
    path: str | Path,
    *,
    dtype: str = "auto",
    weight_variant: str | None = None,
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
    """A `Krea2Pipeline` for the checkpoint at `path` (dtype "auto": the transformer's storage dtype,
    by most tensors; `lora`: `FILE[:SCALE]` specs for the transformer, merged or unmerged by
    `lora_mode` ("auto": `dif.lora.mode` decides, unmerged when `lora_swappable`), their text-encoder
    adapters merged always; options: backend, vram_budget, on_step, on_stage, max_sequence_length)."""
    from dif.checkpoint import storage_dtype
    from dif.dtypes import DType
    from dif_frontend_krea2.pipeline import Krea2Pipeline
    from dif_frontend_krea2.weights import open_checkpoint

    checkpoint = open_checkpoint(
        path,
        variant=weight_variant,
        transformer_file=transformer_file,
        vae_file=vae_file,
        text_encoder_file=text_encoder_file,
        config_variant=config_variant,
        loras=tuple(lora or ()),
        lora_allow_unmatched=lora_allow_unmatched,
        lora_mode=lora_mode,
        lora_swappable=lora_swappable,
    )
    run_dtype = storage_dtype(checkpoint.transformer) if dtype == "auto" else DType(dtype)
    return Krea2Pipeline(checkpoint, dtype=run_dtype, **options)


def _describe(path: Path | None, **options: Any) -> tuple[str, dict[str, Any]]:
    from dif_frontend_krea2.cli import describe

    return describe(path, **options)


SIZE = "Image {} in pixels, rounded up to a multiple of the checkpoint's token size (16 for Krea 2)"

INFO = FrontendInfo(
    name="krea2",
    description="Krea 2 Raw / Turbo: Qwen3-VL text taps, text fusion, 12.8B single-stream DiT, Qwen-Image VAE",
    detect=_detect,
    variants=("raw", "turbo"),
    settings=(
        SettingSpec("steps", None, "Denoising steps", minimum=1, by_kind={"turbo": 8, "raw": 28}),
        SettingSpec(
            "guidance",
            None,
            "CFG scale g, v = cond + g (cond - uncond), on when g > 0",
            minimum=0.0,
            by_kind={"turbo": 0.0, "raw": 4.5},
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


register_frontends, register_commands = frontend_hooks(INFO, "dif_frontend_krea2.cli:krea2")

register_lora_trainer("krea2", "dif_frontend_krea2.train:lora_session")  # `dif train lora` for Krea 2
