"""Checkpoint access, step 3: present a checkpoint under the names a program uses.

A frontend that reads a non-native layout (an original single file with fused projections, a
repack with a prefix) describes it as rules: each program-side name comes from one checkpoint
tensor, optionally through a small shape transform (take one of n equal chunks, swap the two
halves, drop trailing 1-sized axes, take one index of an axis). `MappedSource` applies the rules
lazily, so nothing is copied until a tensor is used, and error messages still name the original
tensor and file.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from attrs import frozen

from dif.errors import WeightError
from dif.weights.safetensors_file import TensorInfo
from dif.weights.source import TensorSource


@frozen
class Chunk:
    """Piece `index` of `parts` equal chunks along `axis` (fused qkv -> q, k, v)."""

    index: int
    parts: int
    axis: int = 0

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if shape[self.axis] % self.parts:
            raise WeightError(f"axis {self.axis} of size {shape[self.axis]} does not split into {self.parts} chunks")
        out = list(shape)
        out[self.axis] //= self.parts
        return tuple(out)

    def apply(self, arr: np.ndarray) -> np.ndarray:
        n = arr.shape[self.axis] // self.parts
        index = [slice(None)] * arr.ndim
        index[self.axis] = slice(self.index * n, (self.index + 1) * n)
        return arr[tuple(index)]

    def describe(self) -> str:
        return f"chunk {self.index} of {self.parts} on axis {self.axis}"


@frozen
class SwapHalves:
    """The two halves along `axis` exchanged ((shift, scale) -> (scale, shift))."""

    axis: int = 0

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if shape[self.axis] % 2:
            raise WeightError(f"axis {self.axis} of size {shape[self.axis]} has no halves")
        return shape

    def apply(self, arr: np.ndarray) -> np.ndarray:
        a, b = np.split(arr, 2, axis=self.axis)
        return np.concatenate([b, a], axis=self.axis)

    def describe(self) -> str:
        return f"halves swapped on axis {self.axis}"


@frozen
class DropUnitAxes:
    """Trailing 1-sized axes removed (a 1x1 conv kernel [O,I,1,1] used as a linear [O,I])."""

    keep: int = 2

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if any(d != 1 for d in shape[self.keep :]):
            raise WeightError(f"shape {list(shape)} has non-unit axes after the first {self.keep}")
        return shape[: self.keep]

    def apply(self, arr: np.ndarray) -> np.ndarray:
        return arr.reshape(arr.shape[: self.keep])

    def describe(self) -> str:
        return "trailing unit axes dropped"


@frozen
class Take:
    """Index `index` of `axis`, that axis removed (a causal 3D conv kernel [O,I,T,kh,kw] read as the
    2D kernel of its last temporal tap: Take(axis=2, index=-1)). Negative indexes count from the end;
    `what` names the piece in messages ("last temporal tap")."""

    axis: int
    index: int
    what: str = ""

    def shape(self, shape: tuple[int, ...]) -> tuple[int, ...]:
        if not -len(shape) <= self.axis < len(shape):
            raise WeightError(f"shape {list(shape)} has no axis {self.axis}")
        size = shape[self.axis]
        if not -size <= self.index < size:
            raise WeightError(f"axis {self.axis} of size {size} has no index {self.index}")
        axis = self.axis % len(shape)
        return shape[:axis] + shape[axis + 1 :]

    def apply(self, arr: np.ndarray) -> np.ndarray:
        return np.take(arr, self.index, axis=self.axis)

    def describe(self) -> str:
        where = f"index {self.index} of axis {self.axis}"
        return f"{self.what} ({where})" if self.what else where


Transform = Chunk | SwapHalves | DropUnitAxes | Take


@frozen
class Rule:
    """Program-side tensor taken from checkpoint tensor `source`, through `transform` if given."""

    source: str
    transform: Transform | None = None


class MappedSource(TensorSource):
    """`base` seen through `rules` (target name -> Rule).

    With `keep_unmapped=True` every base tensor not consumed by a rule is still visible under its
    own name, so `bind_weights` reports it as unexpected instead of it vanishing silently.
    """

    def __init__(self, base: TensorSource, rules: Mapping[str, Rule], *, keep_unmapped: bool = True) -> None:
        self.base = base
        self.rules = dict(rules)
        self.label = base.label
        for target, rule in self.rules.items():
            if rule.source not in base:
                raise WeightError(f"tensor '{rule.source}' (needed for '{target}') is not in {base.label}")
        used = {r.source for r in self.rules.values()}
        self._names = list(self.rules)
        if keep_unmapped:
            self._names += [n for n in base.names() if n not in used and n not in self.rules]
        self._name_set = set(self._names)

    def names(self) -> list[str]:
        return list(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._name_set

    def info(self, name: str) -> TensorInfo:
        rule = self.rules.get(name)
        if rule is None:
            return self.base.info(name)
        src = self.base.info(rule.source)
        shape = src.shape if rule.transform is None else rule.transform.shape(src.shape)
        return TensorInfo(name, src.dtype, shape, src.begin, src.end, src.file)

    def file_of(self, name: str) -> str:
        rule = self.rules.get(name)
        if rule is None:
            return self.base.file_of(name)
        how = "" if rule.transform is None else f", {rule.transform.describe()}"
        return f"{self.base.file_of(rule.source)} (from '{rule.source}'{how})"

    def _load(self, name: str) -> np.ndarray:
        rule = self.rules.get(name)
        if rule is None:
            return self.base[name]
        arr = self.base[rule.source]
        return arr if rule.transform is None else rule.transform.apply(arr)
