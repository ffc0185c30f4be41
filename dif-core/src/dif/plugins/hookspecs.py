"""The hooks a dif plugin may implement (pluggy project name "dif").

Plugins are found through the `dif` entry-point group and loaded by `dif.plugins.load_plugins()`.
Every data hook receives a `register` callback: call it once per thing you provide. Names must be
unique across all plugins; a duplicate is reported as a `PluginError` against the later plugin.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("dif")


@hookspec
def register_backends(register: Callable[[Any], None]) -> None:
    """Register execution backends.

    Call `register(info)` with a `dif.backend.BackendInfo` for each backend the plugin offers.
    `BackendInfo.is_available()`, `probe()` and `create()` must import device libraries lazily, so
    that listing backends works on a machine without the hardware. `supported_ops` (and the
    profile's `dtypes`) decide which programs the backend is chosen for (`dif.runtime.get_backend`):
    declare exactly the ops its `prepare` lowers. docs/hooks.md has a complete minimal backend.
    """


@hookspec
def register_frontends(register: Callable[[Any], None]) -> None:
    """Register model-family frontends.

    Call `register(info)` with a `dif.frontend.FrontendInfo` (family name, `detect(path)`, default
    settings, lazily imported pipeline factory). CLI commands are added separately through
    `register_commands`.
    """


@hookspec
def register_ops(register: Callable[[Any], None]) -> None:
    """Register extra DiffIR ops.

    Call `register(opdef)` with a `dif.ops.registry.OpDef`. The op goes into the one op table
    (`dif.ops.registry.OPS`); it must carry a type rule, a numpy reference and a docstring like
    every core op. An op name that already exists is a `PluginError`.
    """


@hookspec
def register_physical_formats(register: Callable[[Any], None]) -> None:
    """Register physical (storage / compute) formats a program may be lowered to.

    Call `register(fmt)` with a `dif.formats.PhysicalFormat`, stating the TargetProfile dtypes,
    tensor-core formats and capabilities it needs and how dif can use it (search candidate,
    execution policy or hook only). Legality is then decided per target by `dif.formats.legal_on`.
    """


@hookspec
def register_passes(register: Callable[[str, Callable[..., Any]], None]) -> None:
    """Register optimizer passes.

    Call `register(name, fn)` where `fn(program, **options) -> Program` returns a new program
    (programs are immutable) or the same one when nothing applies. The name is what plans and logs
    record, e.g. `fuse_norm_modulate`. Options are passed by keyword when `fn` takes them: `ctx`, a
    `dif.passes.PassContext` (`ctx.target`, `ctx.supports(op)`, `ctx.applied/skipped(reason)`), and
    `target`. Plugin passes run after the core ones (`DIF_PASSES` selects); a plugin pass that
    raises or returns a program that does not verify is recorded as skipped, never fatal.
    """


@hookspec
def register_commands(cli: Any) -> None:
    """Add subcommands to the `dif` command line.

    `cli` is the root `click.Group`; decorate with `@cli.command()` or `@cli.group()`. Import heavy
    libraries (torch, cupy, pyopencl) inside the command function, never at module level, so
    `dif --help` stays fast.
    """
