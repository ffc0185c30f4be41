"""Kernel sources and compiled programs for one OpenCL context (used by `lower` while preparing).

Each `kernels/*.cl` file is compiled once per context (plus once per build-time define set, e.g.
attention head dims), with `kernels/common.cl` prepended. Build options are fixed here: never
`-cl-fast-relaxed-math`, whose approximate exp/rsqrt break norms and softmax; `-cl-mad-enable`
only lets a*b+c fuse, which stays within fp32 tolerance. pyopencl caches built binaries on disk.
"""

from __future__ import annotations

from functools import cache
from importlib import resources
from typing import Any

from dif.errors import BackendError

BUILD_OPTIONS: tuple[str, ...] = ("-cl-mad-enable", "-cl-std=CL1.2")
"""Options every program is built with (plus -D defines)."""

FORBIDDEN_OPTIONS = ("-cl-fast-relaxed-math", "-cl-unsafe-math-optimizations", "-cl-finite-math-only")


@cache
def source(name: str) -> str:
    """The text of `kernels/<name>.cl` shipped as package data."""
    return (resources.files("dif_backend_opencl") / "kernels" / f"{name}.cl").read_text(encoding="utf-8")


def full_source(name: str) -> str:
    return source("common") + "\n" + source(name)


def build(program: Any, options: list[str] | None = None) -> Any:
    """`program.build(options)` without pyopencl's CompilerWarning for a build that succeeded but logged
    something: Intel's CPU runtime logs "Compilation started ... done" for every build, and the warning text
    lands on stderr, in the middle of a `--json` tool's output. A failed build still raises, with its log."""
    import warnings

    import pyopencl as cl

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", cl.CompilerWarning)
        return program.build(options=options or [])


class KernelLibrary:
    """Programs built on demand for one context; `kernel()` returns a fresh `cl.Kernel` so each
    launch can keep its own arguments bound (set once at prepare time, never again)."""

    def __init__(self, context: Any, row_group: int) -> None:
        self.context = context
        self.row_group = row_group  # WG of the row / reduction kernels (power of two)
        self._programs: dict[tuple[str, tuple[tuple[str, int], ...]], Any] = {}

    def options(self, defines: dict[str, int]) -> list[str]:
        opts = [*BUILD_OPTIONS, f"-DWG={self.row_group}"]
        opts += [f"-D{k}={v}" for k, v in sorted(defines.items())]
        bad = [o for o in opts if o in FORBIDDEN_OPTIONS]
        if bad:
            raise BackendError(f"refusing OpenCL build options {bad}: they break exp precision in norms/softmax")
        return opts

    def program(self, name: str, defines: dict[str, int] | None = None) -> Any:
        import pyopencl as cl

        key = (name, tuple(sorted((defines or {}).items())))
        prog = self._programs.get(key)
        if prog is None:
            try:
                prog = build(cl.Program(self.context, full_source(name)), self.options(dict(key[1])))
            except cl.Error as exc:
                raise BackendError(f"OpenCL build of kernels/{name}.cl failed: {exc}") from exc
            self._programs[key] = prog
        return prog

    def kernel(self, name: str, kernel: str, defines: dict[str, int] | None = None) -> Any:
        import pyopencl as cl

        return cl.Kernel(self.program(name, defines), kernel)

    @property
    def built(self) -> list[str]:
        """Programs built so far, as `file[DEFINE=v,...]` (for logs and tests)."""
        return [f"{n}[{','.join(f'{k}={v}' for k, v in d)}]" for n, d in self._programs]
