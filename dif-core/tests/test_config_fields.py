"""dif.config_fields: each validator accepts what a config.json legitimately holds and rejects the
rest with a ConfigError naming the config, the field and the offending value."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from attrs import frozen

from dif.config_fields import (
    UNKNOWN_KEYS_HINT,
    check_class_name,
    flag,
    int_tuple,
    known_fields,
    non_negative_int,
    positive_float,
    positive_int,
)
from dif.errors import CheckpointError, ConfigError

WHAT = "demo/config.json"


@pytest.mark.parametrize(
    ("check", "value", "expected"),
    [
        (positive_int, 3, 3),
        (non_negative_int, 0, 0),
        (positive_float, 2, 2.0),
        (positive_float, 1e-6, 1e-6),
        (flag, False, False),
        (int_tuple, [1, 2], (1, 2)),
    ],
)
def test_accepts_valid_values(check: Callable[[str, str, Any], Any], value: Any, expected: Any) -> None:
    result = check(WHAT, "field", value)
    assert result == expected and type(result) is type(expected)


@pytest.mark.parametrize(
    ("check", "value", "kind"),
    [
        (positive_int, 0, "a positive integer"),
        (positive_int, True, "a positive integer"),
        (positive_int, 2.0, "a positive integer"),
        (positive_int, "4", "a positive integer"),
        (non_negative_int, -1, "a non-negative integer"),
        (non_negative_int, False, "a non-negative integer"),
        (positive_float, 0.0, "a positive number"),
        (positive_float, True, "a positive number"),
        (positive_float, "1e-6", "a positive number"),
        (flag, 1, "true/false"),
        (flag, None, "true/false"),
        (int_tuple, [], "a non-empty list of integers"),
        (int_tuple, 4, "a non-empty list of integers"),
    ],
)
def test_rejects_with_what_field_and_value(check: Callable[[str, str, Any], Any], value: Any, kind: str) -> None:
    with pytest.raises(ConfigError) as info:
        check(WHAT, "width", value)
    assert str(info.value) == f"{WHAT}: 'width' must be {kind}, got {value!r}"
    assert isinstance(info.value, CheckpointError)


def test_int_tuple_names_the_bad_entry() -> None:
    with pytest.raises(ConfigError, match=r"demo/config\.json: 'dims\[1\]' must be a positive integer, got 0"):
        int_tuple(WHAT, "dims", [2, 0])
    with pytest.raises(ConfigError, match=r"'taps\[0\]' must be a non-negative integer, got -1"):
        int_tuple(WHAT, "taps", [-1, 2], allow_zero=True)
    assert int_tuple(WHAT, "taps", (0, 3), allow_zero=True) == (0, 3)


def test_check_class_name() -> None:
    check_class_name(WHAT, {}, "DemoModel")  # absent: the caller's default class
    check_class_name(WHAT, {"_class_name": "DemoModel"}, "DemoModel")
    with pytest.raises(ConfigError, match=r"demo/config\.json: _class_name is 'Other', expected 'DemoModel'"):
        check_class_name(WHAT, {"_class_name": "Other"}, "DemoModel")


@frozen
class _Demo:
    width: int = 1
    depth: int = 2


def test_known_fields_keeps_fields_and_rejects_unknown_keys() -> None:
    data = {"width": 4, "_diffusers_version": "0.42", "sample_size": 64}
    assert known_fields(_Demo, WHAT, data, ignored=frozenset({"sample_size"})) == {"width": 4}
    with pytest.raises(ConfigError, match=r"demo/config\.json: unknown config keys colour, sample_size") as info:
        known_fields(_Demo, WHAT, {**data, "colour": 1})
    assert info.value.hint == UNKNOWN_KEYS_HINT
    with pytest.raises(ConfigError) as custom:
        known_fields(_Demo, WHAT, {"colour": 1}, hint="try again")
    assert custom.value.hint == "try again"
    assert known_fields(_Demo, WHAT, {**data, "colour": 1}, strict=False) == {"width": 4}
