"""Checkpoint access, step 1: one `.safetensors` file, header validated, tensors mapped lazily.

Every length and offset in the header is checked against the bytes on disk before anything is
sliced, so a truncated download or a file that is not safetensors at all fails here with a
`FormatError` naming the file (and the tensor, when one is to blame), never later inside numpy.
Tensors are zero-copy views of one read-only `np.memmap` of the file.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Iterator
from pathlib import Path

import ml_dtypes
import numpy as np
from attrs import frozen

from dif.errors import FormatError, WeightError

# A header is JSON metadata; real checkpoints have headers of a few MB at most. Anything far
# larger is a garbage length field (random bytes, a pickle, an LFS pointer, ...).
MAX_HEADER_BYTES = 100 * 1024 * 1024

# safetensors dtype name -> numpy storage type. Wider than `dif.dtypes.DType` on purpose: a
# checkpoint may hold f64 or i16 tensors; `bind_weights` decides whether they can be used.
NUMPY_OF: dict[str, np.dtype] = {
    "F64": np.dtype(np.float64),
    "F32": np.dtype(np.float32),
    "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "F8_E4M3": np.dtype(ml_dtypes.float8_e4m3fn),
    "F8_E5M2": np.dtype(ml_dtypes.float8_e5m2),
    "I64": np.dtype(np.int64),
    "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16),
    "I8": np.dtype(np.int8),
    "U64": np.dtype(np.uint64),
    "U32": np.dtype(np.uint32),
    "U16": np.dtype(np.uint16),
    "U8": np.dtype(np.uint8),
    "BOOL": np.dtype(np.bool_),
}


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

    Raises `FormatError` naming the file for: a file too short to hold a header, a header length
    that is absurd or runs past the end, a header that is not a JSON object, malformed entries,
    unknown dtypes, byte ranges that disagree with dtype x shape, and data that ends before a
    tensor does (a truncated file).
    """
    path = Path(path)
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise FormatError(f"{path}: {size} bytes is too short for a safetensors file (no header length)")
            (hlen,) = struct.unpack("<Q", head)
            if hlen > MAX_HEADER_BYTES or hlen > size - 8:
                raise FormatError(
                    f"{path}: header length field says {hlen} bytes but the file has {size} bytes",
                    hint="the file is not safetensors (garbage header) or was cut off; download it again",
                )
            raw = f.read(hlen)
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FormatError(f"{path}: header is not valid JSON ({exc})", hint="the file is corrupt or not safetensors") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: header is JSON but not an object")
    data_start = 8 + hlen
    data_size = size - data_start
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise FormatError(f"{path}: __metadata__ must map strings to strings")
    tensors: dict[str, TensorInfo] = {}
    for name, entry in header.items():
        info = _parse_entry(path, name, entry)
        if info.end > data_size:
            raise FormatError(
                f"{path}: tensor '{name}' ends at data byte {info.end} but the file holds only {data_size} data bytes",
                hint="the file is truncated (interrupted download or copy); fetch it again",
            )
        tensors[name] = info
    return tensors, dict(metadata), data_start


def _parse_entry(path: Path, name: str, entry: object) -> TensorInfo:
    where = f"{path}: tensor '{name}'"
    if not isinstance(entry, dict):
        raise FormatError(f"{where}: header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if dtype not in NUMPY_OF:
        raise FormatError(f"{where}: unsupported dtype {dtype!r}", hint=f"supported: {', '.join(NUMPY_OF)}")
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
        raise FormatError(f"{where}: shape {shape!r} is not a list of non-negative integers")
    if (
        not isinstance(offsets, list)
        or len(offsets) != 2
        or not all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)
        or not 0 <= offsets[0] <= offsets[1]
    ):
        raise FormatError(f"{where}: data_offsets {offsets!r} is not [begin, end] with 0 <= begin <= end")
    expected = math.prod(shape) * NUMPY_OF[dtype].itemsize
    if offsets[1] - offsets[0] != expected:
        raise FormatError(
            f"{where}: byte range holds {offsets[1] - offsets[0]} bytes but {dtype}{shape} needs {expected}"
        )
    return TensorInfo(name, dtype, tuple(shape), offsets[0], offsets[1], path)


class SafetensorsFile:
    """One safetensors file: header read at open, data mapped on first tensor access."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.tensors, self.metadata, self._data_start = read_header(self.path)
        self._map: np.memmap | None = None

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
            self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        start = self._data_start + info.begin
        if start + info.nbytes > self._map.size:  # the file shrank after the header was read
            raise FormatError(f"{self.path}: tensor '{name}' runs past the end of the file (truncated?)")
        raw = self._map[start : start + info.nbytes]
        return np.asarray(raw).view(info.numpy_dtype).reshape(info.shape)
