"""DiffIR element types and their numpy storage types.

bf16 and fp8 are stored through `ml_dtypes`, so a bf16 tensor is really 2 bytes per element in
every buffer, file and arena; compute precision is each op's business (see `dif.ops`).
"""

from __future__ import annotations

import enum

import ml_dtypes
import numpy as np

from dif.errors import DifError


class DType(enum.StrEnum):
    F32 = "f32"
    F16 = "f16"
    BF16 = "bf16"
    F8E4M3 = "f8e4m3"
    F8E5M2 = "f8e5m2"
    I8 = "i8"
    I32 = "i32"
    I64 = "i64"
    U8 = "u8"
    BOOL = "bool"

    @property
    def np(self) -> np.dtype:
        return _TO_NUMPY[self]

    @property
    def itemsize(self) -> int:
        return _TO_NUMPY[self].itemsize

    @property
    def is_float(self) -> bool:
        return self in FLOAT_DTYPES

    @property
    def safetensors_name(self) -> str:
        return _TO_SAFETENSORS[self]


FLOAT_DTYPES = frozenset({DType.F32, DType.F16, DType.BF16, DType.F8E4M3, DType.F8E5M2})
INT_DTYPES = frozenset({DType.I8, DType.I32, DType.I64, DType.U8})

_TO_NUMPY: dict[DType, np.dtype] = {
    DType.F32: np.dtype(np.float32),
    DType.F16: np.dtype(np.float16),
    DType.BF16: np.dtype(ml_dtypes.bfloat16),
    DType.F8E4M3: np.dtype(ml_dtypes.float8_e4m3fn),
    DType.F8E5M2: np.dtype(ml_dtypes.float8_e5m2),
    DType.I8: np.dtype(np.int8),
    DType.I32: np.dtype(np.int32),
    DType.I64: np.dtype(np.int64),
    DType.U8: np.dtype(np.uint8),
    DType.BOOL: np.dtype(np.bool_),
}
_FROM_NUMPY = {v: k for k, v in _TO_NUMPY.items()}

_TO_SAFETENSORS = {
    DType.F32: "F32",
    DType.F16: "F16",
    DType.BF16: "BF16",
    DType.F8E4M3: "F8_E4M3",
    DType.F8E5M2: "F8_E5M2",
    DType.I8: "I8",
    DType.I32: "I32",
    DType.I64: "I64",
    DType.U8: "U8",
    DType.BOOL: "BOOL",
}
_FROM_SAFETENSORS = {v: k for k, v in _TO_SAFETENSORS.items()}


def dtype_of(array: np.ndarray) -> DType:
    """The DiffIR dtype of a numpy array; raises `DifError` for unsupported storage types."""
    try:
        return _FROM_NUMPY[np.dtype(array.dtype)]
    except KeyError:
        raise DifError(f"numpy dtype {array.dtype} has no DiffIR equivalent") from None


def parse_dtype(name: str) -> DType:
    """`DType` from its DiffIR name ('bf16') or safetensors name ('BF16')."""
    if name in _FROM_SAFETENSORS:
        return _FROM_SAFETENSORS[name]
    try:
        return DType(name)
    except ValueError:
        known = ", ".join(d.value for d in DType)
        raise DifError(f"unknown dtype '{name}'", hint=f"use one of {known}") from None
