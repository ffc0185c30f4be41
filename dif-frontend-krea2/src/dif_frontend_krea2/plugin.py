"""Entry point of dif-frontend-krea2 (`[project.entry-points.dif] krea2 = "dif_frontend_krea2.plugin"`).

Registers the Krea 2 frontend (detection, default settings, pipeline factory) and adds the
`dif krea2` command group. Nothing heavy is imported here: the pipeline and the CLI body load
when used, so `dif --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dif.frontend import FrontendInfo, SettingSpec, frontend_hooks
from dif_frontend_krea2 import __version__


def _detect(path: Path) -> bool:
    from dif_frontend_krea2.config import is_krea2_folder

    return Path(path).is_dir() and is_krea2_folder(Path(path))


def _pipeline(path: str | Path, **options: Any) -> Any:
    """A `Krea2Pipeline` for the checkpoint at `path` (options: dtype, backend, variant, ...)."""
    from dif.dtypes import DType
    from dif_frontend_krea2.pipeline import Krea2Pipeline
    from dif_frontend_krea2.weights import open_checkpoint

    checkpoint = open_checkpoint(path, variant=options.pop("variant", None))
    dtype = DType(options.pop("dtype", "f32"))
    return Krea2Pipeline(checkpoint, dtype=dtype, **options)


INFO = FrontendInfo(
    name="krea2",
    description="Krea 2 Raw / Turbo: Qwen3-VL text taps, text fusion, 12.8B single-stream DiT, Qwen-Image VAE",
    detect=_detect,
    variants=("raw", "turbo"),
    settings=(
        SettingSpec("steps", None, "denoising steps (default: 8 Turbo, 28 Raw)"),
        SettingSpec("guidance", None, "CFG scale, cond + g (cond - uncond), on when > 0 (default: 0 Turbo, 4.5 Raw)"),
        SettingSpec("width", 1024, "image width in pixels (rounded up to a multiple of 16)", minimum=1),
        SettingSpec("height", 1024, "image height in pixels (rounded up to a multiple of 16)", minimum=1),
        SettingSpec("seed", 0, "noise seed (numpy PCG64)", minimum=0),
    ),
    pipeline=_pipeline,
    revision=__version__,
)


register_frontends, register_commands = frontend_hooks(INFO, "dif_frontend_krea2.cli:krea2")
