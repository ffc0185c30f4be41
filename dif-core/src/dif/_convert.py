"""attrs converters with precise types (a bare `converter=tuple` loses the element type for mypy)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TypeVar

T = TypeVar("T")


def to_tuple(items: Iterable[T]) -> tuple[T, ...]:
    return tuple(items)
