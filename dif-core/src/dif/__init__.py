"""dif: a diffusion compiler. This package is the core (DiffIR, compiler, planner, hooks).

Plugins implement hooks with `@dif.hookimpl`; see `dif.plugins.hookspecs`. `dif.load(path)` is the
Python API (`dif.api`): it loads plugins only when called, never at `import dif`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    from dif.api import ImagePipeline

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("dif")


def load(path: Any = None, **options: Any) -> ImagePipeline:
    """`dif.api.load`: the pipeline of a checkpoint (or of a family's embedded one), callable with a
    prompt. Imported on the first call, so `import dif` stays light and loads no plugin."""
    from dif.api import load as load_pipeline

    return load_pipeline(path, **options)


__all__ = ["__version__", "hookimpl", "load"]
