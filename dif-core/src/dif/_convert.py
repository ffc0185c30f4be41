"""attrs converters with precise types: mypy's attrs plugin cannot see through a generic converter
(`converter=tuple`, or one typed with a TypeVar), so each element type gets its own function.
Converters for dif's own classes live beside them (`dif.ir.program`, `dif.ops.registry`)."""

from __future__ import annotations

from collections.abc import Iterable


def strs(items: Iterable[str]) -> tuple[str, ...]:
    return tuple(items)


def ints(items: Iterable[int]) -> tuple[int, ...]:
    return tuple(items)
