"""The contract between dif and a model-family frontend package (FLUX.2, Krea 2, H3, a third party's).

A frontend registers a `FrontendInfo` through the `register_frontends` hook and its CLI group
through `register_commands`. Nothing here imports a model: `detect` must only look at files
(config JSON, safetensors headers), and `pipeline` imports the heavy parts when called.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from attrs import field, frozen

from dif import hookimpl
from dif._convert import strs
from dif.errors import CheckpointError, UsageError


def _specs(values: Iterable[SettingSpec]) -> tuple[SettingSpec, ...]:
    return tuple(values)


@frozen
class SettingSpec:
    """One user-facing generation setting (steps, guidance, width, ...) with its default and bounds."""

    name: str
    default: Any
    doc: str = ""
    minimum: float | None = None
    maximum: float | None = None
    multiple_of: int | None = None
    choices: tuple[Any, ...] | None = None

    def check(self, frontend: str, value: Any) -> Any:
        """`value` converted to the default's type; raises `UsageError` naming the setting and bound."""
        where = f"{frontend}: setting '{self.name}'"
        kind = type(self.default)
        if isinstance(self.default, bool) and isinstance(value, str):
            lowered = value.strip().lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise UsageError(f"{where} must be true or false, got {value!r}")
            value = lowered in ("true", "1", "yes")
        if self.default is not None and not isinstance(value, kind):
            try:
                value = kind(value)
            except (TypeError, ValueError):
                raise UsageError(f"{where} must be {kind.__name__}, got {value!r}") from None
        if self.choices is not None and value not in self.choices:
            raise UsageError(f"{where}={value!r} is not one of {', '.join(map(repr, self.choices))}")
        if self.minimum is not None and value < self.minimum:
            raise UsageError(f"{where}={value!r} is below the minimum {self.minimum}")
        if self.maximum is not None and value > self.maximum:
            raise UsageError(f"{where}={value!r} is above the maximum {self.maximum}")
        if self.multiple_of is not None and value % self.multiple_of:
            raise UsageError(f"{where}={value!r} is not a multiple of {self.multiple_of}")
        return value


@frozen
class FrontendInfo:
    """What a frontend plugin registers.

    `detect(path)` answers whether the checkpoint (folder or single file) at `path` is one this
    frontend loads. `pipeline(path, **settings)` builds the runnable pipeline (lazy imports
    inside). `validate(settings) -> settings` applies cross-setting rules (e.g. a distilled model
    that ignores guidance) after each setting passed its own `SettingSpec`.
    """

    name: str
    description: str
    detect: Callable[[Path], bool]
    variants: tuple[str, ...] = field(default=(), converter=strs)
    settings: tuple[SettingSpec, ...] = field(default=(), converter=_specs)
    validate: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    pipeline: Callable[..., Any] | None = None
    revision: str = ""

    def defaults(self) -> dict[str, Any]:
        return {s.name: s.default for s in self.settings}

    def resolve_settings(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Defaults updated with `overrides` (None values mean "not given"), each checked."""
        specs = {s.name: s for s in self.settings}
        given = {k: v for k, v in (overrides or {}).items() if v is not None}
        unknown = sorted(set(given) - set(specs))
        if unknown:
            raise UsageError(
                f"{self.name}: unknown setting {', '.join(map(repr, unknown))}",
                hint=f"its settings are: {', '.join(specs) or '(none)'}",
            )
        out = {name: spec.check(self.name, given.get(name, spec.default)) for name, spec in specs.items()}
        return self.validate(out) if self.validate is not None else out

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready description (for `dif plugins --json` and telemetry)."""
        return {
            "name": self.name,
            "description": self.description,
            "variants": list(self.variants),
            "revision": self.revision,
            "defaults": self.defaults(),
        }


def detect_frontend(path: str | Path, frontends: Mapping[str, FrontendInfo]) -> FrontendInfo:
    """The single frontend whose `detect` accepts `path`; `CheckpointError` if none or several do."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"{path}: no such file or folder")
    matches = []
    for info in frontends.values():
        try:
            ok = bool(info.detect(path))
        except Exception as exc:  # a detector bug must not hide the other frontends
            raise CheckpointError(f"frontend '{info.name}' failed while inspecting {path}: {exc}") from exc
        if ok:
            matches.append(info)
    if not matches:
        known = ", ".join(frontends) or "none installed"
        raise CheckpointError(f"{path}: no frontend recognises this checkpoint (frontends: {known})")
    if len(matches) > 1:
        names = ", ".join(m.name for m in matches)
        raise CheckpointError(f"{path}: several frontends claim this checkpoint ({names})", hint="name the family")
    return matches[0]


def frontend_hooks(info: FrontendInfo, commands: str) -> tuple[Callable[..., None], Callable[..., None]]:
    """The two hookimpls of a frontend's plugin module: `register_frontends` registers `info`, and
    `register_commands` adds the click group `commands` names ("module:attribute", imported only
    when the `dif` command asks for its commands). In the plugin module:

        register_frontends, register_commands = frontend_hooks(INFO, "my_frontend.cli:group")
    """

    @hookimpl
    def register_frontends(register: Callable[[FrontendInfo], None]) -> None:
        register(info)

    @hookimpl
    def register_commands(cli: Any) -> None:
        module, _, attribute = commands.partition(":")
        cli.add_command(getattr(importlib.import_module(module), attribute))

    return register_frontends, register_commands
