"""Checkpoint access, step 1: one `.safetensors` file, header validated, tensors mapped lazily.

Every length and offset in the header is checked (by `dif.serialize.diftensor`) against the bytes
on disk before anything is sliced, so a truncated download or a file that is not safetensors at
all fails here with a `FormatError` naming the file (and the tensor, when one is to blame), never
later inside numpy. Tensors are zero-copy views of one read-only `np.memmap` of the file, mapped
on first access (opening a 9B checkpoint reads only its headers). Files are written by
`dif.serialize.diftensor.save_tensors` (`dif_metadata=False` for plain checkpoints).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
from attrs import frozen

from dif.errors import WeightError
from dif.serialize.diftensor import NUMPY_OF, map_file, read_safetensors_header, tensor_view


@frozen
class TensorInfo:
    """Where one tensor lives: file, dtype (safetensors name), shape, byte range in the data section."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int
    file: Path

    @property
    def nbytes(self) -> int:
        return self.end - self.begin

    @property
    def numpy_dtype(self) -> np.dtype:
        return NUMPY_OF[self.dtype]

    def describe(self) -> str:
        return f"{self.dtype}[{','.join(map(str, self.shape))}]"


def read_header(path: str | Path) -> tuple[dict[str, TensorInfo], dict[str, str], int]:
    """(tensors by name, `__metadata__`, byte offset of the data section) of a safetensors file.

    Validation is `dif.serialize.diftensor.read_safetensors_header`: it raises `FormatError`
    naming the file (and tensor) for a file too short for a header, an absurd header length, a
    header that is not a JSON object, malformed entries, unknown dtypes, byte ranges that
    disagree with dtype x shape or overlap, and data that ends before a tensor does (truncation).
    """
    path = Path(path)
    header, data_start = read_safetensors_header(path)
    metadata = dict(header.get("__metadata__") or {})
    tensors = {
        name: TensorInfo(name, e["dtype"], tuple(e["shape"]), e["data_offsets"][0], e["data_offsets"][1], path)
        for name, e in header.items()
        if name != "__metadata__"
    }
    return tensors, metadata, data_start


class SafetensorsFile:
    """One safetensors file: header read at open, data mapped on first tensor access."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.tensors, self.metadata, self._data_start = read_header(self.path)
        self._map: np.ndarray | None = None

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def get(self, name: str) -> np.ndarray:
        """The tensor as a read-only view of the mapped file (no copy)."""
        info = self.tensors.get(name)
        if info is None:
            raise WeightError(f"tensor '{name}' is not in {self.path}")
        if info.nbytes == 0:
            return np.zeros(info.shape, dtype=info.numpy_dtype)
        if self._map is None:
            self._map = map_file(self.path)
        start = self._data_start + info.begin
        return tensor_view(self._map, self.path, name, info.numpy_dtype, info.shape, start, info.nbytes)
