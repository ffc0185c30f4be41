"""Entry point of dif-frontend-flux2 (`[project.entry-points.dif] flux2 = "dif_frontend_flux2.plugin"`).

Registers the FLUX.2 [klein] frontend (detection, default settings, pipeline factory) and adds the
`dif flux2` command group. Nothing heavy is imported here: the pipeline and the CLI body load
when used, so `dif --help` stays fast.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from dif.frontend import FrontendInfo, SettingSpec, frontend_hooks
from dif_frontend_flux2 import __version__


def _detect(path: Path) -> bool:
    from dif_frontend_flux2.weights import detect

    return detect(path)


def _pipeline(path: str | Path, **options: Any) -> Any:
    """A `Flux2Pipeline` for the checkpoint at `path` (options: dtype, backend, variant)."""
    from dif.dtypes import DType
    from dif_frontend_flux2.pipeline import Flux2Pipeline
    from dif_frontend_flux2.weights import open_checkpoint

    checkpoint = open_checkpoint(path, variant=options.pop("variant", None))
    dtype = DType(options.pop("dtype", "f32"))
    return Flux2Pipeline(checkpoint, dtype=dtype, **options)


INFO = FrontendInfo(
    name="flux2",
    description="FLUX.2 [klein] 4B/9B, base and step-distilled: Qwen3 text encoder, Flux2 DiT, Flux2 VAE",
    detect=_detect,
    variants=("klein-4b", "klein-9b", "klein-base-4b", "klein-base-9b"),
    settings=(
        SettingSpec("steps", None, "denoising steps (default: 4 distilled, 50 base)"),
        SettingSpec("guidance", None, "CFG scale (base models only; default 4.0)"),
        SettingSpec("width", 1024, "image width in pixels", minimum=16, multiple_of=16),
        SettingSpec("height", 1024, "image height in pixels", minimum=16, multiple_of=16),
        SettingSpec("seed", 0, "noise seed (numpy PCG64)", minimum=0),
    ),
    pipeline=_pipeline,
    revision=__version__,
)


register_frontends, register_commands = frontend_hooks(INFO, "dif_frontend_flux2.cli:flux2")
