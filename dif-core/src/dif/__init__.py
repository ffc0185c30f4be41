"""dif: a diffusion compiler. This package is the core (DiffIR, compiler, planner, hooks).

Plugins implement hooks with `@dif.hookimpl`; see `dif.plugins.hookspecs`.
"""

import pluggy

__version__ = "0.1.0"

hookimpl = pluggy.HookimplMarker("dif")

__all__ = ["__version__", "hookimpl"]
