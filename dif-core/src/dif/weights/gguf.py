"""Checkpoint access: GGUF files (llama.cpp / stable-diffusion.cpp / ComfyUI-GGUF), read and dequantized.

Where it sits: beside `safetensors_file`; `open_gguf(path)` returns a `TensorSource`, so frontends
map its names (`dif.weights.remap`) and bind it like any checkpoint. The header (metadata and the
tensor table) is parsed and checked against the file's size at open, so a truncated download, a
file that is not GGUF, an unknown or unsupported tensor type fail there with a `FormatError` naming
the file and tensor. Data is mapped (np.memmap) and each tensor dequantized when read, vectorized
over its blocks, to float32 (F16 / BF16 / F32 tensors are zero-copy views); `bind_weights` then
converts to the run dtype. Block layouts (ggml): Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (32 values a block),
Q4_K, Q5_K, Q6_K (256 values, 8 or 16 scaled sub-blocks). Shapes: GGUF lists dimensions innermost
first; numpy shapes are the reverse. ComfyUI-GGUF's `comfy.gguf.orig_shape.<name>` metadata
restores a tensor it reshaped.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
from attrs import frozen

from dif.errors import CheckpointError, FormatError, WeightError
from dif.weights.safetensors_file import TensorInfo
from dif.weights.source import TensorSource

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 8
MAX_STRING = 1 << 30  # no key, name or metadata string is a gigabyte


@frozen
class GGMLType:
    """One ggml tensor type: id, name, values per block, bytes per block."""

    id: int
    name: str
    block: int
    nbytes: int


# Every type id the ggml format defines (so a known-but-unsupported type is named, not "unknown").
GGML_TYPES: dict[int, GGMLType] = {
    t.id: t
    for t in (
        GGMLType(0, "F32", 1, 4),
        GGMLType(1, "F16", 1, 2),
        GGMLType(2, "Q4_0", 32, 18),
        GGMLType(3, "Q4_1", 32, 20),
        GGMLType(6, "Q5_0", 32, 22),
        GGMLType(7, "Q5_1", 32, 24),
        GGMLType(8, "Q8_0", 32, 34),
        GGMLType(9, "Q8_1", 32, 36),
        GGMLType(10, "Q2_K", 256, 84),
        GGMLType(11, "Q3_K", 256, 110),
        GGMLType(12, "Q4_K", 256, 144),
        GGMLType(13, "Q5_K", 256, 176),
        GGMLType(14, "Q6_K", 256, 210),
        GGMLType(15, "Q8_K", 256, 292),
        GGMLType(16, "IQ2_XXS", 256, 66),
        GGMLType(17, "IQ2_XS", 256, 74),
        GGMLType(18, "IQ3_XXS", 256, 98),
        GGMLType(19, "IQ1_S", 256, 50),
        GGMLType(20, "IQ4_NL", 32, 18),
        GGMLType(21, "IQ3_S", 256, 110),
        GGMLType(22, "IQ2_S", 256, 82),
        GGMLType(23, "IQ4_XS", 256, 136),
        GGMLType(24, "I8", 1, 1),
        GGMLType(25, "I16", 1, 2),
        GGMLType(26, "I32", 1, 4),
        GGMLType(27, "I64", 1, 8),
        GGMLType(28, "F64", 1, 8),
        GGMLType(29, "IQ1_M", 256, 56),
        GGMLType(30, "BF16", 1, 2),
        GGMLType(34, "TQ1_0", 256, 54),
        GGMLType(35, "TQ2_0", 256, 66),
        GGMLType(39, "MXFP4", 32, 17),
    )
}


# -- dequantization: (n_blocks, block bytes) uint8 -> (n_blocks, values per block) float32 --------


def _f16(blocks: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of every block, as an (n, 1) float32 column."""
    return blocks[:, start : start + 2].copy().view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, k) bytes -> (n, 2k): the low nibbles, then the high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1)


def _q8_0(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * b[:, 2:].view(np.int8).astype(np.float32)


def _q4_0(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * (_nibbles(b[:, 2:18]).astype(np.float32) - 8.0)


def _q4_1(b: np.ndarray) -> np.ndarray:
    return _f16(b, 0) * _nibbles(b[:, 4:20]).astype(np.float32) + _f16(b, 2)


def _high_bits(qh: np.ndarray) -> np.ndarray:
    """(n, 4) bytes of a little-endian uint32 -> (n, 32) bit j of it, 0 or 16."""
    word = qh.copy().view("<u4")  # (n, 1)
    return (((word >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.uint8)


def _q5_0(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 6:22]) | _high_bits(b[:, 2:6])
    return _f16(b, 0) * (q.astype(np.float32) - 16.0)


def _q5_1(b: np.ndarray) -> np.ndarray:
    q = _nibbles(b[:, 8:24]) | _high_bits(b[:, 4:8])
    return _f16(b, 0) * q.astype(np.float32) + _f16(b, 2)


def _k_scales(s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The 12 packed scale bytes of a Q4_K / Q5_K block -> (scales, mins), each (n, 8), 6-bit:
    sub-blocks 0-3 in the low 6 bits of bytes 0-3 / 4-7; 4-7 from the nibbles of bytes 8-11 plus
    the top 2 bits of bytes 0-3 / 4-7."""
    low, mid, top = s[:, 0:4], s[:, 4:8], s[:, 8:12]
    scales = np.concatenate([low & 63, (top & 0x0F) | ((low >> 6) << 4)], axis=1)
    mins = np.concatenate([mid & 63, (top >> 4) | ((mid >> 6) << 4)], axis=1)
    return scales.astype(np.float32), mins.astype(np.float32)


def _k_subblocks(low_high: np.ndarray) -> np.ndarray:
    """(n, 128) bytes: 4 runs of 32, each giving two sub-blocks (low nibbles, then high) -> (n, 8, 32)."""
    runs = low_high.reshape(-1, 4, 32)
    return np.stack([runs & 0x0F, runs >> 4], axis=2).reshape(-1, 8, 32)


def _q4_k(b: np.ndarray) -> np.ndarray:
    d, dmin = _f16(b, 0), _f16(b, 2)
    scales, mins = _k_scales(b[:, 4:16])
    q = _k_subblocks(b[:, 16:144]).astype(np.float32)
    out = (d * scales)[:, :, None] * q - (dmin * mins)[:, :, None]
    return out.reshape(-1, 256)


def _q5_k(b: np.ndarray) -> np.ndarray:
    d, dmin = _f16(b, 0), _f16(b, 2)
    scales, mins = _k_scales(b[:, 4:16])
    qh = b[:, 16:48]  # bit k of byte l: the 5th bit of value l of sub-block k
    high = ((qh[:, None, :] >> np.arange(8, dtype=np.uint8)[None, :, None]) & 1) << 4
    q = (_k_subblocks(b[:, 48:176]) | high).astype(np.float32)
    out = (d * scales)[:, :, None] * q - (dmin * mins)[:, :, None]
    return out.reshape(-1, 256)


def _q6_k(b: np.ndarray) -> np.ndarray:
    ql = b[:, 0:128].reshape(-1, 2, 64)
    qh = b[:, 128:192].reshape(-1, 2, 32)
    scales = b[:, 192:208].view(np.int8).astype(np.float32).reshape(-1, 16)
    d = _f16(b, 208)
    # per half of 128 values: four runs of 32, low / high 4 bits from ql, 2 bits each from qh
    low = np.stack(
        [ql[:, :, :32] & 0x0F, ql[:, :, 32:] & 0x0F, ql[:, :, :32] >> 4, ql[:, :, 32:] >> 4], axis=2
    )  # (n, 2, 4, 32)
    high = (qh[:, :, None, :] >> (2 * np.arange(4, dtype=np.uint8))[None, None, :, None]) & 3
    q = ((low | (high << 4)).astype(np.float32) - 32.0).reshape(-1, 16, 16)
    return ((d * scales)[:, :, None] * q).reshape(-1, 256)


DEQUANTIZE: dict[str, Callable[[np.ndarray], np.ndarray]] = {
    "Q8_0": _q8_0,
    "Q4_0": _q4_0,
    "Q4_1": _q4_1,
    "Q5_0": _q5_0,
    "Q5_1": _q5_1,
    "Q4_K": _q4_k,
    "Q5_K": _q5_k,
    "Q6_K": _q6_k,
}
PLAIN: dict[str, tuple[np.dtype[Any], str]] = {
    "F32": (np.dtype("<f4"), "F32"),
    "F16": (np.dtype("<f2"), "F16"),
    "BF16": (np.dtype(ml_dtypes.bfloat16), "BF16"),
}
SUPPORTED = (*PLAIN, *DEQUANTIZE)


CHUNK_BLOCKS = 1 << 15
"""Blocks per dequantization task: the numpy loops release the GIL, so large tensors spread over threads."""


def dequantize(raw: np.ndarray, type_name: str, shape: tuple[int, ...], *, threads: int | None = None) -> np.ndarray:
    """The float32 values of one tensor's raw bytes (uint8) of ggml type `type_name`, in `shape`
    (blocks dequantized in chunks on up to `threads` threads, default one per CPU core)."""
    kind = next(t for t in GGML_TYPES.values() if t.name == type_name)
    blocks = np.asarray(raw).reshape(-1, kind.nbytes)
    run = DEQUANTIZE[type_name]
    n = len(blocks)
    workers = min(threads or os.cpu_count() or 1, -(-n // CHUNK_BLOCKS))
    if workers <= 1:
        return run(np.ascontiguousarray(blocks)).reshape(shape)
    out = np.empty((n, kind.block), np.float32)

    def part(start: int) -> None:
        stop = min(start + CHUNK_BLOCKS, n)
        out[start:stop] = run(np.ascontiguousarray(blocks[start:stop]))

    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dif-gguf") as pool:
        list(pool.map(part, range(0, n, CHUNK_BLOCKS)))
    return out.reshape(shape)


# -- the header ----------------------------------------------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


class _Cursor:
    """Reads little-endian values from the mapped header, refusing to read past the end."""

    def __init__(self, data: np.ndarray, path: Path) -> None:
        self.data, self.path, self.pos = data, path, 0

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise FormatError(
                f"{self.path}: truncated GGUF: {what} needs {n} bytes at offset {self.pos}, "
                f"the file has {len(self.data)}",
                hint="the download is incomplete; fetch the file again",
            )
        out = self.data[self.pos : self.pos + n].tobytes()
        self.pos += n
        return out

    def scalar(self, fmt: str, what: str) -> Any:
        return struct.unpack(fmt, self.take(struct.calcsize(fmt), what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", what)
        if n > MAX_STRING:
            raise FormatError(f"{self.path}: {what}: a string of {n} bytes (corrupt header)")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise FormatError(f"{self.path}: {what} is not UTF-8 text (corrupt header)") from None

    def value(self, kind: int, what: str, depth: int = 0) -> Any:
        if kind in _SCALARS:
            return self.scalar(_SCALARS[kind], what)
        if kind == _STRING:
            return self.string(what)
        if kind == _ARRAY and depth < 4:
            item = self.scalar("<I", what)
            count = self.scalar("<Q", what)
            if count > len(self.data) - self.pos:  # every item takes at least one byte
                raise FormatError(f"{self.path}: {what}: an array of {count} items in a smaller file (corrupt header)")
            if item in _SCALARS:  # numbers: one read, no per-item Python loop
                size = struct.calcsize(_SCALARS[item])
                raw = self.take(size * count, what)
                return np.frombuffer(raw, dtype=np.dtype(_SCALARS[item])).tolist()
            return [self.value(item, what, depth + 1) for _ in range(count)]
        raise FormatError(f"{self.path}: {what}: unknown GGUF metadata value type {kind} (corrupt header)")


@frozen
class GGUFTensor:
    """One tensor of the table: name, numpy shape, ggml type, byte range in the data section."""

    name: str
    shape: tuple[int, ...]
    type: GGMLType
    offset: int
    nbytes: int


class GGUFFile(TensorSource):
    """A GGUF file as a tensor source: header parsed at open, tensors mapped and dequantized on read."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.label = str(self.path)
        if not self.path.is_file():
            raise CheckpointError(f"{self.path}: no such file")
        if self.path.stat().st_size < 24:
            raise FormatError(f"{self.path}: truncated GGUF: {self.path.stat().st_size} bytes, shorter than a header")
        self._map = np.memmap(self.path, dtype=np.uint8, mode="r")
        self.metadata, self.tensors, self.version = self._parse()

    def _parse(self) -> tuple[dict[str, Any], dict[str, GGUFTensor], int]:
        c = _Cursor(self._map, self.path)
        if c.take(4, "magic") != MAGIC:
            raise FormatError(f"{self.path}: not a GGUF file (no 'GGUF' magic)")
        version = c.scalar("<I", "version")
        if version not in (2, 3):
            raise FormatError(f"{self.path}: GGUF version {version}; dif reads versions 2 and 3")
        n_tensors, n_kv = c.scalar("<Q", "tensor count"), c.scalar("<Q", "metadata count")
        if n_tensors > len(self._map) // 24 or n_kv > len(self._map) // 12:
            raise FormatError(f"{self.path}: header claims {n_tensors} tensors and {n_kv} metadata keys (corrupt)")
        metadata: dict[str, Any] = {}
        for i in range(n_kv):
            key = c.string(f"metadata key {i}")
            metadata[key] = c.value(c.scalar("<I", f"metadata '{key}'"), f"metadata '{key}'")
        table: list[tuple[str, tuple[int, ...], int, int]] = []
        for i in range(n_tensors):
            name = c.string(f"tensor name {i}")
            n_dims = c.scalar("<I", f"tensor '{name}'")
            if not 1 <= n_dims <= MAX_DIMS:
                raise FormatError(f"{self.path}: tensor '{name}' has {n_dims} dimensions (corrupt header)")
            dims = tuple(c.scalar("<Q", f"tensor '{name}'") for _ in range(n_dims))
            if any(d >= 1 << 40 for d in dims):
                raise FormatError(f"{self.path}: tensor '{name}' has dimensions {list(dims)} (corrupt header)")
            kind, offset = c.scalar("<I", f"tensor '{name}'"), c.scalar("<Q", f"tensor '{name}'")
            table.append((name, dims, kind, offset))
        alignment = metadata.get("general.alignment", DEFAULT_ALIGNMENT)
        if not isinstance(alignment, int) or alignment <= 0 or alignment & (alignment - 1):
            raise FormatError(f"{self.path}: general.alignment {alignment!r} is not a power of two")
        self._data_start = (c.pos + alignment - 1) // alignment * alignment
        available = len(self._map) - self._data_start
        tensors: dict[str, GGUFTensor] = {}
        for name, dims, kind_id, offset in table:
            kind = GGML_TYPES.get(kind_id)
            if kind is None:
                raise FormatError(
                    f"{self.path}: tensor '{name}' has unknown GGUF type id {kind_id}",
                    hint=f"dif reads {', '.join(SUPPORTED)}",
                )
            count = math.prod(dims)  # Python ints: a hostile header cannot overflow this
            if dims[0] % kind.block:
                raise FormatError(
                    f"{self.path}: tensor '{name}' ({kind.name}): row length {dims[0]} is not a multiple of its "
                    f"block of {kind.block}"
                )
            nbytes = count // kind.block * kind.nbytes
            if offset + nbytes > available:
                raise FormatError(
                    f"{self.path}: truncated GGUF: tensor '{name}' ends at byte {self._data_start + offset + nbytes}, "
                    f"the file has {len(self._map)}",
                    hint="the download is incomplete; fetch the file again",
                )
            shape = tuple(reversed(dims))
            restored = metadata.get(f"comfy.gguf.orig_shape.{name}")
            if (
                isinstance(restored, list)
                and all(isinstance(d, int) and d >= 0 for d in restored)
                and math.prod(restored) == count
            ):
                shape = tuple(restored)
            if name in tensors:
                raise FormatError(f"{self.path}: tensor '{name}' is listed twice")
            tensors[name] = GGUFTensor(name, shape, kind, offset, nbytes)
        return metadata, tensors, version

    @property
    def architecture(self) -> str | None:
        arch = self.metadata.get("general.architecture")
        return arch if isinstance(arch, str) else None

    def names(self) -> list[str]:
        return list(self.tensors)

    def __contains__(self, name: object) -> bool:
        return name in self.tensors

    def stored_type(self, name: str) -> str:
        """The ggml type the tensor is stored in ("Q8_0", "BF16", ...)."""
        return self._tensor(name).type.name

    def _tensor(self, name: str) -> GGUFTensor:
        try:
            return self.tensors[name]
        except KeyError:
            raise WeightError(f"tensor '{name}' is not in {self.path}") from None

    def info(self, name: str) -> TensorInfo:
        t = self._tensor(name)
        dtype = PLAIN[t.type.name][1] if t.type.name in PLAIN else "F32"  # what `_load` returns
        return TensorInfo(name, dtype, t.shape, t.offset, t.offset + t.nbytes, self.path)

    def file_of(self, name: str) -> str:
        t = self.tensors.get(name)
        return str(self.path) if t is None or t.type.name in PLAIN else f"{self.path} ({t.type.name})"

    def raw(self, name: str) -> np.ndarray:
        """The tensor's stored bytes (uint8, mapped): its blocks as the file holds them."""
        t = self._tensor(name)
        start = self._data_start + t.offset
        return self._map[start : start + t.nbytes]

    def _load(self, name: str) -> np.ndarray:
        t = self._tensor(name)
        raw = self.raw(name)
        if t.type.name in PLAIN:
            return raw.view(PLAIN[t.type.name][0]).reshape(t.shape)
        if t.type.name not in DEQUANTIZE:
            raise FormatError(
                f"{self.path}: tensor '{name}' is stored as {t.type.name}, which dif does not dequantize",
                hint=f"dif reads {', '.join(SUPPORTED)}; re-quantize the file (Q8_0, Q6_K, Q5_K, Q4_K ...)",
            )
        return dequantize(raw, t.type.name, t.shape)

    def unsupported(self) -> dict[str, str]:
        """Tensor name -> type name, for tensors stored in a type dif does not read."""
        return {n: t.type.name for n, t in self.tensors.items() if t.type.name not in SUPPORTED}


def open_gguf(path: str | Path) -> GGUFFile:
    """A source over one GGUF file; `FormatError` naming the file (and tensor) for a truncated or
    corrupt file, an unknown type id or a tensor type dif does not dequantize."""
    source = GGUFFile(path)
    bad = source.unsupported()
    if bad:
        first = next(iter(bad))
        kinds = ", ".join(sorted(set(bad.values())))
        raise FormatError(
            f"{source.path}: {len(bad)} tensor(s) are stored as {kinds}, which dif does not dequantize "
            f"(e.g. '{first}')",
            hint=f"dif reads {', '.join(SUPPORTED)}; use a file quantized to one of those",
        )
    return source


def is_gguf(path: str | Path) -> bool:
    """Whether the file starts with the GGUF magic (reads 4 bytes)."""
    try:
        with open(path, "rb") as f:
            return f.read(4) == MAGIC
    except OSError:
        return False


# -- writing (for tools and benchmarks: a checkpoint re-stored as GGUF) ---------------------------


def quantize_q8_0(x: np.ndarray) -> np.ndarray:
    """float values (..., n), n a multiple of 32 -> Q8_0 blocks (..., n / 32 * 34) uint8: per block of
    32, d = max|x| / 127 as float16 and q = round(x / d) (halves away from zero), as ggml stores it."""
    x = np.asarray(x, dtype=np.float32)
    if x.shape[-1] % 32:
        raise WeightError(f"Q8_0 needs rows that are a multiple of 32 values, got {x.shape[-1]}")
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1, keepdims=True) / np.float32(127)
    with np.errstate(divide="ignore"):
        inverse = np.where(d == 0, np.float32(0), np.float32(1) / d)
    scaled = blocks * inverse
    q = (np.trunc(np.abs(scaled) + np.float32(0.5)) * np.sign(scaled)).astype(np.int8)
    out = np.concatenate([d.astype(np.float16).view(np.uint8), q.view(np.uint8)], axis=1)
    return out.reshape(*x.shape[:-1], -1)


def write_gguf(
    path: str | Path,
    tensors: Sequence[tuple[str, str, tuple[int, ...]]],
    data: Callable[[str], np.ndarray],
    metadata: Mapping[str, str] = {},  # noqa: B006 (read only)
) -> None:
    """Write a GGUF v3 file of `tensors` (name, ggml type name, numpy shape), each tensor's raw bytes
    from `data(name)` (uint8, produced one at a time, so a 9B checkpoint is never all in memory) and
    string `metadata`; 32-byte aligned, atomically (temp file, then rename)."""
    from dif.serialize.container import open_atomic

    def text(value: str) -> bytes:
        raw = value.encode()
        return struct.pack("<Q", len(raw)) + raw

    by_name = {t.name: t for t in GGML_TYPES.values()}
    head = MAGIC + struct.pack("<IQQ", 3, len(tensors), len(metadata))
    for key, value in metadata.items():
        head += text(key) + struct.pack("<I", 8) + text(value)
    offset, sizes = 0, []
    for name, kind, shape in tensors:
        dims = tuple(reversed(shape)) or (1,)
        head += text(name) + struct.pack("<I", len(dims)) + struct.pack(f"<{len(dims)}Q", *dims)
        head += struct.pack("<IQ", by_name[kind].id, offset)
        nbytes = math.prod(dims) // by_name[kind].block * by_name[kind].nbytes
        sizes.append(nbytes)
        offset += nbytes + (-nbytes % DEFAULT_ALIGNMENT)
    head += bytes(-len(head) % DEFAULT_ALIGNMENT)
    with open_atomic(Path(path)) as f:
        f.write(head)
        for (name, kind, _), nbytes in zip(tensors, sizes, strict=True):
            raw = np.ascontiguousarray(data(name)).view(np.uint8).reshape(-1)
            if raw.size != nbytes:
                raise WeightError(f"tensor '{name}' ({kind}): {raw.size} bytes given, {nbytes} expected")
            f.write(raw.tobytes())
            f.write(bytes(-nbytes % DEFAULT_ALIGNMENT))
