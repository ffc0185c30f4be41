"""Tensor types: a static shape and an element type. Programs are built per shape."""

from __future__ import annotations

import math

from attrs import field, frozen

from dif.dtypes import DType


def _as_shape(shape: object) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)  # type: ignore[attr-defined]


@frozen
class TensorType:
    shape: tuple[int, ...] = field(converter=_as_shape)
    dtype: DType = field(converter=DType)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def numel(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.numel * self.dtype.itemsize

    def __str__(self) -> str:
        return f"{self.dtype.value}[{','.join(str(d) for d in self.shape)}]"
