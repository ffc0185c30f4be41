"""`.diftensor`: tensor interchange (fixtures, captures, run inputs/outputs) as safetensors files.

Layout (the safetensors format, written here so bf16/fp8 need no torch):
    u64 little-endian N | N bytes of JSON header, space-padded | data
    header = {"__metadata__": {str: str}, NAME: {"dtype": "BF16", "shape": [..], "data_offsets": [b, e]}, ...}
Offsets are relative to the data start. dif files add "dif.format": "diftensor" and "dif.version":
"1" to `__metadata__`; plain safetensors files (no dif keys) load too, and `save_tensors(...,
dif_metadata=False)` writes them (the one safetensors writer in dif). Reads are zero-copy views of
one read-only mmap of the file; every header field is validated first, so a bad file raises a
`FormatError` naming the file (and the tensor), never a raw numpy/json error.
"""

from __future__ import annotations

import json
import math
import os
import struct
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from dif.errors import DifError, FormatError, VersionError
from dif.serialize.container import open_atomic

FORMAT_KEY, FORMAT = "dif.format", "diftensor"
VERSION_KEY, VERSION = "dif.version", "1"
SUFFIX = ".diftensor"
MAX_HEADER = 100_000_000  # the safetensors library's own limit
MAX_RANK = 32
MAX_BYTES = 1 << 56

# safetensors dtype name <-> numpy storage type (wider than dif.dtypes.DType: checkpoints may hold f64, i16 ...)
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
SAFETENSORS_NAME_OF: dict[np.dtype, str] = {v: k for k, v in NUMPY_OF.items()}


# -- reading --------------------------------------------------------------------------------------


def _unique_pairs(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key[:80]!r}")
        out[key] = value
    return out


def _no_constants(name: str) -> None:
    raise ValueError(f"JSON constant {name} is not allowed")


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _check_entry(path: Path, name: str, entry: object, data_len: int) -> tuple[int, int]:
    where = f"{path}: tensor '{name}'"
    if not isinstance(entry, dict):
        raise FormatError(f"{where}: header entry is not an object")
    dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), entry.get("data_offsets")
    if not isinstance(dtype, str) or dtype not in NUMPY_OF:
        raise FormatError(f"{where}: unsupported dtype {str(dtype)[:40]!r}", hint=f"supported: {', '.join(NUMPY_OF)}")
    if not isinstance(shape, list) or len(shape) > MAX_RANK or not all(_is_int(d) and d >= 0 for d in shape):
        raise FormatError(f"{where}: shape {str(shape)[:80]} is not a list of at most {MAX_RANK} dims >= 0")
    itemsize = NUMPY_OF[dtype].itemsize
    if math.prod(max(d, 1) for d in shape) * itemsize > MAX_BYTES:
        raise FormatError(f"{where}: shape {shape} is absurdly large")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(map(_is_int, offsets))):
        raise FormatError(f"{where}: data_offsets {str(offsets)[:80]} is not [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end <= data_len:
        raise FormatError(
            f"{where}: data_offsets [{begin}, {end}] are outside the {data_len} data bytes",
            hint="the file is truncated or its header is corrupt",
        )
    need = math.prod(shape) * itemsize
    if end - begin != need:
        raise FormatError(f"{where}: byte range holds {end - begin} bytes but {dtype}{shape} needs {need}")
    return begin, end


def read_safetensors_header(path: str | Path) -> tuple[dict[str, Any], int]:
    """(header, data_offset) of a safetensors file, fully validated.

    `header` is the JSON header as stored: {name: {"dtype", "shape", "data_offsets"}} plus an
    optional "__metadata__" {str: str}. `data_offset` is the file offset of the data section, to
    which every `data_offsets` pair is relative. Checks: header length vs file size, UTF-8 JSON
    object, unique names, known dtypes, offsets inside the data, end - begin == numel * itemsize,
    no two tensors overlapping. Raises `FormatError` naming the file (and tensor)."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            head = f.read(8)
            if len(head) < 8:
                raise FormatError(f"{path}: {size} bytes is too short for a safetensors file")
            (hlen,) = struct.unpack("<Q", head)
            if hlen > MAX_HEADER or hlen > size - 8:
                raise FormatError(
                    f"{path}: header length field says {hlen} bytes but the file has {size}",
                    hint="the file is truncated or not safetensors",
                )
            raw = f.read(hlen)
    except OSError as exc:
        raise FormatError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        header = json.loads(raw.decode("utf-8"), object_pairs_hook=_unique_pairs, parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise FormatError(f"{path}: header is not valid JSON ({str(exc)[:120]})", hint="the file is corrupt") from None
    if not isinstance(header, dict):
        raise FormatError(f"{path}: header is not a JSON object")
    meta = header.get("__metadata__")
    if meta is not None and not (isinstance(meta, dict) and all(isinstance(v, str) for v in meta.values())):
        raise FormatError(f"{path}: __metadata__ is not a string -> string object")
    data_offset = 8 + hlen
    ranges = sorted(
        (_check_entry(path, name, entry, size - data_offset), name)
        for name, entry in header.items()
        if name != "__metadata__"
    )
    last_end, last_name = 0, ""
    for (begin, end), name in ranges:
        if begin == end:
            continue
        if begin < last_end:
            raise FormatError(f"{path}: tensors '{last_name}' and '{name}' overlap in the data section")
        last_end, last_name = end, name
    return header, data_offset


def map_file(path: Path) -> np.ndarray:
    """The whole file as one read-only uint8 memmap; FormatError naming the file when it cannot be mapped.
    Shared with `dif.weights.safetensors_file`, so both readers map and slice the same way."""
    try:
        return np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:
        raise FormatError(f"{path}: cannot map the file: {exc}") from None


def tensor_view(
    buf: np.ndarray, path: Path, name: str, dtype: np.dtype, shape: tuple[int, ...], start: int, nbytes: int
) -> np.ndarray:
    """Tensor `name` as a zero-copy view of `buf` (the file mapped by `map_file`) at byte `start`. The header
    was checked against the file's size when it was read; the file may have shrunk since."""
    if start + nbytes > buf.size:
        raise FormatError(f"{path}: tensor '{name}' runs past the end of the file (truncated?)")
    return np.asarray(buf[start : start + nbytes]).view(dtype).reshape(shape)


def _open(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    path = Path(path)
    header, data_offset = read_safetensors_header(path)
    buf: np.ndarray | None = None
    tensors: dict[str, np.ndarray] = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype, shape, (begin, end) = NUMPY_OF[entry["dtype"]], tuple(entry["shape"]), entry["data_offsets"]
        if begin == end:
            arr = np.zeros(shape, dtype=dtype)
            arr.flags.writeable = False
        else:
            buf = buf if buf is not None else map_file(path)
            arr = tensor_view(buf, path, name, dtype, shape, data_offset + begin, end - begin)
        tensors[name] = arr
    return tensors, dict(header.get("__metadata__") or {})


def open_safetensors(path: str | Path) -> dict[str, np.ndarray]:
    """Every tensor of a safetensors file as a read-only zero-copy view of one mmap (name -> array)."""
    return _open(path)[0]


def load_tensors(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, caller metadata) of a `.diftensor` or plain safetensors file.

    Tensors are read-only mmap views (copy them to modify). The metadata excludes the dif keys;
    a file claiming another dif format or version raises `FormatError` / `VersionError`."""
    tensors, meta = _open(path)
    fmt, version = meta.pop(FORMAT_KEY, None), meta.pop(VERSION_KEY, None)
    if fmt is not None and fmt != FORMAT:
        raise FormatError(
            f"{path}: dif.format is {fmt[:40]!r}, not {FORMAT!r}", hint="load it with the tool that wrote it"
        )
    if fmt is not None and version != VERSION:
        raise VersionError(
            f"{path}: diftensor version {str(version)[:20]!r} is not supported (this dif reads {VERSION})",
            hint="re-create the file with this version of dif",
        )
    return tensors, meta


# -- writing --------------------------------------------------------------------------------------


def _prepare(name: object, array: object) -> tuple[np.ndarray, str]:
    if not isinstance(name, str) or not name or name == "__metadata__":
        raise DifError(f"tensor name {name!r} cannot be stored", hint="use a non-empty string other than __metadata__")
    arr = np.asarray(array)
    if arr.dtype.byteorder == ">":
        arr = arr.astype(arr.dtype.newbyteorder("<"))
    st_name = SAFETENSORS_NAME_OF.get(arr.dtype)
    if st_name is None:
        raise FormatError(f"tensor '{name}': numpy dtype {arr.dtype} cannot be stored in safetensors")
    return (arr if arr.flags.c_contiguous else arr.copy(order="C")), st_name  # keeps 0-d arrays 0-d


def save_tensors(
    path: str | Path,
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str] | None = None,
    *,
    dif_metadata: bool = True,
) -> None:
    """Write `tensors` (any dtype in `NUMPY_OF`, incl. bf16/fp8 via ml_dtypes) as a safetensors file.

    dif_metadata=True (a `.diftensor`): `__metadata__` also gets "dif.format" and "dif.version".
    dif_metadata=False: a plain safetensors file (checkpoints, latents for other tools), with
    `__metadata__` only when `metadata` is given. Either way `load_tensors`, transformers and
    diffusers read it. Atomic (temp file in the same folder, then rename) and streamed, so large
    captures are not assembled in memory. Data is ordered by itemsize (descending) then name, so
    every tensor is aligned to its itemsize; the layout has no holes, as the safetensors library
    requires; the header is space-padded to 8 bytes."""
    meta = dict(metadata or {})
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise DifError("safetensors metadata must map strings to strings")
    if FORMAT_KEY in meta or VERSION_KEY in meta:
        raise DifError(f"metadata keys {FORMAT_KEY!r} and {VERSION_KEY!r} are reserved for dif")
    if dif_metadata:
        meta.update({FORMAT_KEY: FORMAT, VERSION_KEY: VERSION})
    prepared = {name: _prepare(name, arr) for name, arr in tensors.items()}
    order = sorted(prepared, key=lambda n: (-prepared[n][0].dtype.itemsize, n))
    header: dict[str, Any] = {"__metadata__": dict(sorted(meta.items()))} if meta else {}
    offset = 0
    for name in order:
        arr, st_name = prepared[name]
        header[name] = {"dtype": st_name, "shape": list(arr.shape), "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    raw = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode()
    raw += b" " * (-(len(raw) + 8) % 8)
    with open_atomic(path) as f:
        f.write(struct.pack("<Q", len(raw)) + raw)
        for name in order:
            arr = prepared[name][0]
            if arr.nbytes:
                f.write(arr.reshape(-1).view(np.uint8).data)
