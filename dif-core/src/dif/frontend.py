"""The contract between dif and a model-family frontend package (FLUX.2, Krea 2, H3, a third party's).

A frontend registers a `FrontendInfo` through the `register_frontends` hook and its CLI group
through `register_commands`. Nothing here imports a model: `detect` must only look at files
(config JSON, safetensors headers), and `pipeline` imports the heavy parts when called.
The settings (`SettingSpec`) are declared once, here: the CLI options (`dif.kit.commands`), their
help, the Python API (`dif.load`) and the pipelines' defaults all read them.
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


def _pairs(values: Iterable[tuple[str, Any]] | Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    items = values.items() if isinstance(values, Mapping) else values
    return tuple((str(k), v) for k, v in items)


@frozen
class SettingSpec:
    """One user-facing generation setting (steps, guidance, width, ...) with its default and bounds.

    `by_kind` holds defaults that depend on the checkpoint's kind (("distilled", 4), ("base", 50));
    `default` is then None. `kind` is the value type when the default is None (else the default's
    type). `flags` are the CLI spellings (default `--name`); `default_doc` replaces the derived
    "(default: ...)" words where the default is not a value ("random", "the native size")."""

    name: str
    default: Any
    doc: str = ""
    minimum: float | None = None
    maximum: float | None = None
    multiple_of: int | None = None
    choices: tuple[Any, ...] | None = None
    by_kind: tuple[tuple[str, Any], ...] = field(default=(), converter=_pairs)
    kind: type | None = None
    flags: tuple[str, ...] = field(default=(), converter=strs)
    default_doc: str = ""

    @property
    def value_type(self) -> type | None:
        """The type values are converted to (None: taken as given)."""
        if self.kind is not None:
            return self.kind
        if self.default is not None:
            return type(self.default)
        return type(self.by_kind[0][1]) if self.by_kind else None

    def default_for(self, kind: str | None = None) -> Any:
        """The default for a checkpoint of `kind` (`by_kind`), else `default`."""
        return dict(self.by_kind).get(kind, self.default) if kind is not None else self.default

    @property
    def help(self) -> str:
        """`doc` with its default: "denoising steps (default: 4 distilled, 50 base)"."""
        if self.default_doc:
            said = self.default_doc
        elif self.by_kind:
            said = ", ".join(f"{value} {kind}" for kind, value in self.by_kind)
        elif self.default is not None:
            said = str(self.default)
        else:
            return self.doc
        return f"{self.doc} (default: {said})" if self.doc else f"default: {said}"

    def check(self, frontend: str, value: Any) -> Any:
        """`value` converted to the value type; None stays None (not given: the pipeline's default).
        Raises `UsageError` naming the setting and bound."""
        if value is None:
            return None
        where = f"{frontend}: setting '{self.name}'"
        kind = self.value_type
        if isinstance(self.default, bool) and isinstance(value, str):
            lowered = value.strip().lower()
            if lowered not in ("true", "false", "1", "0", "yes", "no"):
                raise UsageError(f"{where} must be true or false, got {value!r}")
            value = lowered in ("true", "1", "yes")
        if kind is not None and not isinstance(value, kind):
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


def size_settings(doc: str) -> tuple[SettingSpec, SettingSpec]:
    """The width (-W) and height (-H) settings of an image frontend, in pixels, default the
    checkpoint's native size; `doc` says the rule with "{}" for the side."""
    return tuple(  # type: ignore[return-value]
        SettingSpec(
            side,
            None,
            doc.format(side),
            minimum=1,
            kind=int,
            flags=(flag, f"--{side}"),
            default_doc="the checkpoint's native size",
        )  # fmt: skip
        for side, flag in (("width", "-W"), ("height", "-H"))
    )


SEED = SettingSpec(
    "seed",
    None,
    "Noise seed for the --rng generator; -1 draws a fresh one (reported)",
    minimum=-1,
    maximum=2**32 - 1,
    kind=int,
    default_doc="random",
)
"""The seed setting of an image frontend (`dif.noise`); None or -1 draws a fresh one (reported)."""

SAMPLER = SettingSpec(
    "sampler",
    "euler",
    "Sampler (flow-matching forms; heun calls the model twice a step)",
    choices=("euler", "heun", "dpm++2m"),
    flags=("--sampling-method",),
)
SCHEDULER = SettingSpec(
    "scheduler",
    "simple",
    "Sigma schedule: simple = the checkpoint's own; karras / exponential / beta respace it between its ends",
    choices=("simple", "karras", "exponential", "beta"),
)
RNG = SettingSpec(
    "rng",
    "numpy",
    "Noise generator: numpy (PCG64), or torch's CPU / CUDA stream (the seed then draws diffusers' noise)",
    choices=("numpy", "torch-cpu", "torch-cuda"),
)
SAMPLING = (SAMPLER, SCHEDULER, RNG)
"""How an image frontend samples (`dif.sched.SAMPLERS`, `dif.sched.SCHEDULERS`, `dif.rng.RNGS`: the
same names; dif-core/tests/test_samplers.py checks they agree)."""


@frozen
class FrontendInfo:
    """What a frontend plugin registers.

    `detect(path)` answers whether the checkpoint (folder or single file) at `path` is one this
    frontend loads. `pipeline(path, *, dtype="auto", backend=None, vram_budget=None, **load)`
    builds the runnable `dif.image_pipeline.TextToImagePipeline` (lazy imports inside; `load` are
    the frontend's own checkpoint options, e.g. FLUX.2's `base`). `validate(settings) -> settings`
    applies cross-setting rules after each setting passed its own `SettingSpec`.
    `default_checkpoint` is the embedded checkpoint used without a path; `describe(path, *,
    variant, weight_variant) -> (title, data)` is what `info` shows of a checkpoint or of a
    variant's published configs (`variants`).
    """

    name: str
    description: str
    detect: Callable[[Path], bool]
    variants: tuple[str, ...] = field(default=(), converter=strs)
    settings: tuple[SettingSpec, ...] = field(default=(), converter=_specs)
    validate: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    pipeline: Callable[..., Any] | None = None
    revision: str = ""
    default_checkpoint: Path | None = None
    describe: Callable[..., tuple[str, dict[str, Any]]] | None = None

    def setting(self, name: str) -> SettingSpec:
        """The setting called `name`; `UsageError` naming the known ones."""
        for spec in self.settings:
            if spec.name == name:
                return spec
        raise UsageError(f"{self.name}: unknown setting {name!r}", hint=f"its settings are: {self._names()}")

    def default(self, name: str, kind: str | None = None) -> Any:
        """The default of setting `name` for a checkpoint of `kind` (`SettingSpec.default_for`)."""
        return self.setting(name).default_for(kind)

    def defaults(self, kind: str | None = None) -> dict[str, Any]:
        return {s.name: s.default_for(kind) for s in self.settings}

    def _names(self) -> str:
        return ", ".join(s.name for s in self.settings) or "(none)"

    def resolve_settings(self, overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Defaults updated with `overrides` (None values mean "not given"), each checked."""
        specs = {s.name: s for s in self.settings}
        given = {k: v for k, v in (overrides or {}).items() if v is not None}
        unknown = sorted(set(given) - set(specs))
        if unknown:
            raise UsageError(
                f"{self.name}: unknown setting {', '.join(map(repr, unknown))}",
                hint=f"its settings are: {self._names()}",
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
            "settings": [{"name": s.name, "help": s.help, "by_kind": dict(s.by_kind)} for s in self.settings],
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
