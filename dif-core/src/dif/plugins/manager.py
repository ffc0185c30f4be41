"""Loading plugins and collecting what they register (backends, frontends, ops, formats, passes, commands).

`load_plugins()` is explicit and idempotent: nothing is loaded at import time. A plugin that fails
to import, implements a misspelled hook, raises inside a hook or registers a duplicate name is
recorded against its `PluginRecord` (shown by `dif plugins`) and skipped; it never stops dif.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from importlib import metadata
from typing import TYPE_CHECKING, Any

import pluggy
from attrs import define, field

from dif.env import DIF_LOAD_PLUGINS
from dif.errors import PluginError
from dif.plugins import hookspecs

if TYPE_CHECKING:
    from dif.backend import BackendInfo
    from dif.formats import FormatRegistry, PhysicalFormat
    from dif.frontend import FrontendInfo
    from dif.ops.registry import OpDef, OpTable

ENTRY_POINT_GROUP = "dif"

pm = pluggy.PluginManager("dif")
pm.add_hookspecs(hookspecs)


@define
class PluginRecord:
    """One plugin as `dif plugins` reports it. `errors` is empty for a healthy plugin."""

    name: str
    distribution: str
    version: str
    source: str  # "entry point" | "in-process" | "requested"
    errors: list[str] = field(factory=list)

    @property
    def error(self) -> str | None:
        return "; ".join(self.errors) if self.errors else None

    @property
    def hooks(self) -> tuple[str, ...]:
        plugin = pm.get_plugin(self.name)
        if plugin is None:
            return ()
        return tuple(sorted(caller.name for caller in pm.get_hookcallers(plugin) or ()))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "distribution": self.distribution,
            "version": self.version,
            "source": self.source,
            "hooks": list(self.hooks),
            "error": self.error,
        }


@define
class _State:
    loaded: bool = False
    records: dict[str, PluginRecord] = field(factory=dict)
    cache: dict[str, dict[str, Any]] = field(factory=dict)
    problems: list[PluginError] = field(factory=list)
    owners: dict[str, dict[str, str]] = field(factory=dict)
    hook_errors: dict[str, PluginError] = field(factory=dict)
    ops_done: set[str] = field(factory=set)


_state = _State()


def _problem(plugin: str, message: str) -> PluginError:
    """Record `message` against `plugin` and return the error (raised by callers in strict mode)."""
    record = _state.records.get(plugin)
    if record is None:
        record = _state.records[plugin] = PluginRecord(plugin, "", "", "in-process")
    error = PluginError(f"plugin '{plugin}': {message}")
    if message not in record.errors:  # collectors may run again after a cache reset
        record.errors.append(message)
        _state.problems.append(error)
    return error


def _invalidate() -> None:
    """Forget collected results; the next collector call asks the plugins again."""
    _state.cache.clear()
    _state.hook_errors.clear()


def _check_pending() -> None:
    """`pm.check_pending()`, but a plugin with a misspelled hookimpl is recorded and unregistered."""
    while True:
        try:
            pm.check_pending()
            return
        except pluggy.PluginValidationError as exc:
            name = pm.get_name(exc.plugin) or repr(exc.plugin)
            _problem(name, f"unknown hook implementation: {exc}")
            pm.unregister(exc.plugin)


def load_plugins() -> list[PluginRecord]:
    """Load the `dif` entry points (all, or those named in `DIF_LOAD_PLUGINS`). Safe to call again."""
    if _state.loaded:
        return plugin_records()
    _state.loaded = True
    wanted = DIF_LOAD_PLUGINS.get_list()
    found: set[str] = set()
    for ep in sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        if wanted is not None and ep.name not in wanted:
            continue
        dist = ep.dist
        record = PluginRecord(
            ep.name, dist.metadata["Name"] if dist else "", dist.version if dist else "", "entry point"
        )
        if ep.name in found:
            _problem(ep.name, f"entry-point name also used by distribution '{record.distribution}'; skipped")
            continue
        found.add(ep.name)
        _state.records[ep.name] = record
        try:
            plugin = ep.load()
        except Exception as exc:  # a broken plugin is reported, never fatal
            _problem(ep.name, f"import failed: {type(exc).__name__}: {exc}")
            continue
        try:
            pm.register(plugin, name=ep.name)
        except (ValueError, pluggy.PluginValidationError) as exc:
            _problem(ep.name, f"registration failed: {exc}")
    for name in wanted or ():
        if name not in found:
            _state.records[name] = PluginRecord(name, "", "", "requested")
            _problem(name, "named in DIF_LOAD_PLUGINS but no installed distribution has this 'dif' entry point")
    _check_pending()
    _invalidate()
    return plugin_records()


def register_plugin(plugin: object, name: str) -> PluginRecord:
    """Register an in-process plugin (a module or object with `@dif.hookimpl` methods); for tests.

    Raises `PluginError` if the name is taken or a hookimpl matches no hookspec."""
    load_plugins()
    if pm.get_plugin(name) is not None or name in _state.records:
        raise PluginError(f"a plugin named '{name}' is already registered")
    try:
        pm.register(plugin, name=name)
    except (ValueError, pluggy.PluginValidationError) as exc:
        raise PluginError(f"plugin '{name}': {exc}") from None
    record = _state.records[name] = PluginRecord(name, "", "", "in-process")
    try:
        pm.check_pending()
    except pluggy.PluginValidationError as exc:
        pm.unregister(plugin)
        del _state.records[name]
        raise PluginError(f"plugin '{name}': unknown hook implementation: {exc}") from None
    _invalidate()
    return record


def unregister_plugin(name: str) -> None:
    """Remove a plugin and forget what was collected from it (ops already in a table stay)."""
    plugin = pm.get_plugin(name)
    if plugin is not None:
        pm.unregister(plugin)
    _state.records.pop(name, None)
    _invalidate()


def reset_plugins() -> None:
    """Unregister every plugin and forget all state, so the next `load_plugins()` starts afresh."""
    for name, _plugin in list(pm.list_name_plugin()):
        unregister_plugin(name)
    global _state
    _state = _State()


@contextmanager
def isolated_plugins(load: str | None = "") -> Iterator[None]:
    """For tests: run with a fresh plugin state and `DIF_LOAD_PLUGINS=load` (None: unset, i.e. all).

    Everything registered inside is dropped on exit and the previous plugins and env come back."""
    global _state
    saved_state, saved_env = _state, os.environ.get(DIF_LOAD_PLUGINS.name)
    saved = [(name, plugin) for name, plugin in pm.list_name_plugin() if plugin is not None]
    for _name, plugin in saved:
        pm.unregister(plugin)
    _state = _State()
    if load is None:
        os.environ.pop(DIF_LOAD_PLUGINS.name, None)
    else:
        os.environ[DIF_LOAD_PLUGINS.name] = load
    try:
        yield
    finally:
        for _name, plugin in list(pm.list_name_plugin()):
            if plugin is not None:
                pm.unregister(plugin)
        for name, plugin in saved:
            pm.register(plugin, name=name)
        _state = saved_state
        if saved_env is None:
            os.environ.pop(DIF_LOAD_PLUGINS.name, None)
        else:
            os.environ[DIF_LOAD_PLUGINS.name] = saved_env


def plugin_records() -> list[PluginRecord]:
    """Every plugin seen by `load_plugins()` or `register_plugin()`, sorted by name."""
    return [_state.records[name] for name in sorted(_state.records)]


def problems() -> list[PluginError]:
    """Every problem recorded so far (import failures, bad hooks, duplicates, hook exceptions)."""
    return list(_state.problems)


def _hookimpls(hook: str) -> list[Any]:
    return sorted(getattr(pm.hook, hook).get_hookimpls(), key=lambda impl: impl.plugin_name)


def _collect(hook: str, what: str, kind: type | None, *, two_args: bool = False, strict: bool) -> dict[str, Any]:
    """Call each plugin's `hook` with a register callback; returns name -> registered object."""
    load_plugins()
    if hook in _state.cache:
        cached_error = _state.hook_errors.get(hook)
        if strict and cached_error is not None:
            raise cached_error
        return dict(_state.cache[hook])
    out: dict[str, Any] = {}
    owners: dict[str, str] = {}
    first_error: PluginError | None = None

    for impl in _hookimpls(hook):
        plugin = impl.plugin_name

        def register(*args: Any, _plugin: str = plugin) -> None:
            if two_args:
                name, item = args
                if not callable(item):
                    raise PluginError(f"{hook}: '{name}' is not callable")
            else:
                (item,) = args
                if kind is not None and not isinstance(item, kind):
                    raise PluginError(f"{hook} expects a {kind.__name__}, got {type(item).__name__}")
                name = item.name
            if name in out:
                raise PluginError(f"{what} '{name}' is already registered by plugin '{owners[name]}'")
            out[name] = item
            owners[name] = _plugin

        try:
            impl.function(**{arg: register for arg in impl.argnames})
        except Exception as exc:  # reported against the plugin, the others still count
            message = str(exc) if isinstance(exc, PluginError) else f"{hook} raised {type(exc).__name__}: {exc}"
            error = _problem(plugin, message)
            first_error = first_error or error
    _state.cache[hook] = out
    _state.owners[hook] = owners
    if first_error is not None:
        _state.hook_errors[hook] = first_error
    if strict and first_error is not None:
        raise first_error
    return dict(out)


def backends(*, strict: bool = False) -> dict[str, BackendInfo]:
    """Registered backends by name (unavailable ones included; ask `info.is_available()`)."""
    from dif.backend import BackendInfo

    return _collect("register_backends", "backend", BackendInfo, strict=strict)


def frontends(*, strict: bool = False) -> dict[str, FrontendInfo]:
    """Registered frontends by family name."""
    from dif.frontend import FrontendInfo

    return _collect("register_frontends", "frontend", FrontendInfo, strict=strict)


def passes(*, strict: bool = False) -> dict[str, Callable[..., Any]]:
    """Optimizer passes contributed by plugins, by name."""
    return _collect("register_passes", "pass", None, two_args=True, strict=strict)


def plugin_ops(table: OpTable | None = None, *, strict: bool = False) -> dict[str, OpDef]:
    """Plugin ops, registered into `table` (default: the global `OPS`). Idempotent for `OPS`."""
    from dif.ops.registry import OPS, OpDef

    ops = _collect("register_ops", "op", OpDef, strict=strict)
    target = OPS if table is None else table
    done = _state.ops_done if target is OPS else set()
    _install("register_ops", {n: o for n, o in ops.items() if n not in done}, target.register, strict, done)
    return ops


def physical_formats(registry: FormatRegistry | None = None, *, strict: bool = False) -> dict[str, PhysicalFormat]:
    """Plugin physical formats, registered into `registry` (default: the global `FORMATS`)."""
    from dif.formats import FORMATS, PhysicalFormat

    formats = _collect("register_physical_formats", "physical format", PhysicalFormat, strict=strict)
    _install("register_physical_formats", formats, (FORMATS if registry is None else registry).register, strict)
    return formats


def _install(
    hook: str, items: dict[str, Any], register: Callable[[Any], None], strict: bool, done: set[str] | None = None
) -> None:
    """`register` each collected item into its table; a clash is recorded against the plugin that
    registered the item (raised when `strict`). Names registered are added to `done`."""
    for name, item in items.items():
        try:
            register(item)
        except PluginError as exc:
            error = _problem(_owner(hook, name), str(exc))
            if strict:
                raise error from None
            continue
        if done is not None:
            done.add(name)


def _owner(hook: str, name: str) -> str:
    """The plugin whose hook registered `name` (for errors found after collection)."""
    return _state.owners.get(hook, {}).get(name, "?")


_REGISTRIES = (
    ("register_backends", "backends"),
    ("register_frontends", "frontends"),
    ("register_ops", "ops"),
    ("register_physical_formats", "physical_formats"),
    ("register_passes", "passes"),
)


def registrations() -> dict[str, dict[str, list[str]]]:
    """plugin name -> {"backends": [names], "frontends": [...], ...}, running every collector."""
    backends()
    frontends()
    plugin_ops()
    physical_formats()
    passes()
    out: dict[str, dict[str, list[str]]] = {}
    for hook, key in _REGISTRIES:
        for name, plugin in sorted(_state.owners.get(hook, {}).items()):
            out.setdefault(plugin, {}).setdefault(key, []).append(name)
    return out


def add_commands(cli: Any) -> None:
    """Let every plugin add its click commands to `cli` (errors are recorded, not raised)."""
    load_plugins()
    for impl in _hookimpls("register_commands"):
        try:
            impl.function(**{arg: cli for arg in impl.argnames})
        except Exception as exc:
            _problem(impl.plugin_name, f"register_commands raised {type(exc).__name__}: {exc}")
