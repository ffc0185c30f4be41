"""Field validators for a checkpoint's config.json, shared by the frontends' `config.py`.

A frontend reads a JSON object (`dif.checkpoint.read_json_object`), then checks each field it uses
with these helpers before any builder sees it. Every failure is a `dif.errors.ConfigError` whose
message starts with `what` (the file or the config's name) and names the field and offending value.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

from attrs import fields

from dif.errors import ConfigError

UNKNOWN_KEYS_HINT = "this diffusers version may have added options dif does not implement yet"


MAX_CONFIG_INT = 1 << 24
"""The largest integer a config field may hold (16,777,216): past every width, head count, layer count,
vocabulary and position count of a real model, and small enough that a product of two such fields
still has a name when it overflows a shape (`width_product`) rather than a parameter shape's error."""


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _too_large(what: str, name: str, value: int, maximum: int) -> ConfigError:
    return ConfigError(
        f"{what}: {name}={value} is more than {maximum}; no model dif builds is that large",
        hint="the config is damaged or not a model's config: fix the value or re-download the file",
    )


def positive_int(what: str, name: str, value: Any, *, maximum: int = MAX_CONFIG_INT) -> int:
    """`value` if it is an integer in [1, maximum] (JSON true/false are not integers here)."""
    if not _is_int(value) or value <= 0:
        raise ConfigError(f"{what}: '{name}' must be a positive integer, got {value!r}")
    if value > maximum:
        raise _too_large(what, name, value, maximum)
    return int(value)


def non_negative_int(what: str, name: str, value: Any, *, maximum: int = MAX_CONFIG_INT) -> int:
    """`value` if it is an integer in [0, maximum] (a layer count, a layer index)."""
    if not _is_int(value) or value < 0:
        raise ConfigError(f"{what}: '{name}' must be a non-negative integer, got {value!r}")
    if value > maximum:
        raise _too_large(what, name, value, maximum)
    return int(value)


def width_product(what: str, factors: Mapping[str, int], *, maximum: int = MAX_CONFIG_INT) -> int:
    """The product of `factors` (config key -> value, e.g. heads x head width), which must be at most
    `maximum`; the `ConfigError` names every key and value."""
    product = 1
    for value in factors.values():
        product *= value
    if product > maximum:
        terms = " x ".join(f"{name}={value}" for name, value in factors.items())
        raise ConfigError(
            f"{what}: {terms} = {product} is more than {maximum}; no model dif builds is that wide",
            hint="the config is damaged or not a model's config: fix the values or re-download the file",
        )
    return product


def positive_float(what: str, name: str, value: Any) -> float:
    """`value` as a float if it is a finite number > 0 (integers accepted, booleans not)."""
    # a comparison, not math.isfinite: it refuses NaN, Infinity and integers past float range without raising
    if not (_is_int(value) or isinstance(value, float)) or not 0 < value <= sys.float_info.max:
        raise ConfigError(f"{what}: '{name}' must be a positive number, got {value!r}")
    return float(value)


def flag(what: str, name: str, value: Any) -> bool:
    """`value` if it is a JSON boolean."""
    if not isinstance(value, bool):
        raise ConfigError(f"{what}: '{name}' must be true/false, got {value!r}")
    return value


def int_tuple(what: str, name: str, value: Any, *, allow_zero: bool = False) -> tuple[int, ...]:
    """A non-empty JSON list of positive integers (non-negative with `allow_zero`) as a tuple;
    a bad entry is named `name[i]`."""
    if not isinstance(value, list | tuple) or not value:
        raise ConfigError(f"{what}: '{name}' must be a non-empty list of integers, got {value!r}")
    check = non_negative_int if allow_zero else positive_int
    return tuple(check(what, f"{name}[{i}]", v) for i, v in enumerate(value))


def check_class_name(what: str, data: Mapping[str, Any], expected: str) -> None:
    """`_class_name`, when present, must be `expected` (absent means the caller's default class)."""
    name = data.get("_class_name", expected)
    if name != expected:
        raise ConfigError(f"{what}: _class_name is {name!r}, expected {expected!r}")


def known_fields(
    cls: type,
    what: str,
    data: Mapping[str, Any],
    *,
    ignored: frozenset[str] = frozenset(),
    strict: bool = True,
    hint: str = UNKNOWN_KEYS_HINT,
) -> dict[str, Any]:
    """The entries of `data` naming fields of the attrs class `cls`. With `strict`, any other key
    (not `_*`, not in `ignored`) is an error, since an option dif does not implement may change the
    architecture."""
    names = {f.name for f in fields(cls)}
    if strict:
        unknown = sorted(k for k in data if k not in names and k not in ignored and not k.startswith("_"))
        if unknown:
            raise ConfigError(f"{what}: unknown config keys {', '.join(unknown)}", hint=hint)
    return {k: v for k, v in data.items() if k in names}
