"""The load-time weight transform of the format passes: a quantized program's derived parameters computed from
the checkpoint's weights when a backend reads them (between binding and `backend.prepare`).

A format pass (`dif.passes.quantize`) replaces parameter `W` of a linear by parameters named
`W@FORMAT.q` and `W@FORMAT.scale`; the name says how each is derived, so nothing else needs recording and a
saved program stays self-describing. `QuantizedWeights` presents the bound weights with those names added,
each pair computed once, on first read, from `W` (`dif.ops.quant.quantize_weight_rows` per output channel
for fp8-e4m3 / int8, `quantize_weight_groups` for int4-group), so a streamed or mmap'd checkpoint is read
as it would be anyway and nothing quantizes the weights again at run time. A weight the checkpoint already
stores as fp8-e4m3 (plain, or ComfyUI scaled: `dif.weights.fp8`) gives its fp8-e4m3 pair as stored, and one a
GGUF file stores as Q4_0 its int4-group32 pair (`dif.weights.gguf_int4`: the blocks re-packed).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from dif.errors import WeightError
from dif.ir.program import Program

SEPARATOR = "@"
PARTS = ("q", "scale")
ROW_FORMATS = {"fp8-e4m3": "f8e4m3", "int8": "i8"}
GROUP_FORMAT = "int4-group"


def derived_name(source: str, fmt: str, part: str, group_size: int = 0) -> str:
    """`W@fp8-e4m3.q`, `W@int4-group64.scale`: the name of a derived parameter (the group size is part of
    the int4 format's name, so the transform can be read back from the name)."""
    tag = f"{fmt}{group_size}" if fmt == GROUP_FORMAT else fmt
    return f"{source}{SEPARATOR}{tag}.{part}"


def parse_derived(name: str) -> tuple[str, str, int, str] | None:
    """(source, format, group size, part) of a derived parameter name, or None for any other name."""
    source, sep, rest = name.rpartition(SEPARATOR)
    if not sep or not source:
        return None
    tag, dot, part = rest.rpartition(".")
    if not dot or part not in PARTS:
        return None
    if tag in ROW_FORMATS:
        return source, tag, 0, part
    if tag.startswith(GROUP_FORMAT) and tag[len(GROUP_FORMAT) :].isdigit():
        return source, GROUP_FORMAT, int(tag[len(GROUP_FORMAT) :]), part
    return None


CHUNK_ELEMENTS = 1 << 22
"""Rows are quantized in chunks of about this many elements, one chunk per thread (numpy releases the GIL in
most of the arithmetic): a 9B checkpoint is transformed at several times one core's rate. Rows and groups are
independent, so the result is the same as in one piece."""
_POOL: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _POOL
    if _POOL is None:
        _POOL = ThreadPoolExecutor(max_workers=os.cpu_count() or 4, thread_name_prefix="dif-quantize")
    return _POOL


def derive(source: np.ndarray, fmt: str, group_size: int) -> dict[str, np.ndarray]:
    """{"q": ..., "scale": ...} of weight `source` [out, in] in format `fmt`."""
    from dif.ops.quant import quantize_weight_groups, quantize_weight_rows

    w = np.asarray(source)

    def one(part: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if fmt == GROUP_FORMAT:
            return quantize_weight_groups(part, group_size)
        return quantize_weight_rows(part, ROW_FORMATS[fmt])

    rows = max(1, CHUNK_ELEMENTS // max(1, w.shape[1]))
    if w.shape[0] <= rows:
        q, scale = one(w)
    else:
        parts = list(_pool().map(one, [w[i : i + rows] for i in range(0, w.shape[0], rows)]))
        q, scale = np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])
    return {"q": q, "scale": scale}


class QuantizedWeights(Mapping[str, Any]):
    """`base` (bound weights by parameter name) plus the derived parameters of `program`, computed on
    first read (thread-safe: a backend may read weights from several threads) and kept."""

    def __init__(self, program: Program, base: Mapping[str, Any]) -> None:
        self.base = base
        self._derived = {p.name: parsed for p in program.params if (parsed := parse_derived(p.name)) is not None}
        self._cache: dict[tuple[str, str, int], dict[str, np.ndarray]] = {}
        self._lock = threading.Lock()

    @property
    def derived(self) -> list[str]:
        return list(self._derived)

    def __getitem__(self, name: str) -> Any:
        parsed = self._derived.get(name)
        if parsed is None:
            return self.base[name]
        source, fmt, group, part = parsed
        key = (source, fmt, group)
        with self._lock:
            pair = self._cache.get(key)
            if pair is None:
                if source not in self.base:
                    raise WeightError(
                        f"parameter '{name}' is derived from '{source}', which is missing from the weights",
                        hint="bind the checkpoint's weights for the program before the format pass ran",
                    )
                pair = self._cache[key] = self._derive(source, fmt, group)
        return pair[part]

    def _derive(self, source: str, fmt: str, group: int) -> dict[str, np.ndarray]:
        """The pair of `source` in `fmt`: a weight the checkpoint stores as fp8-e4m3 (`dif.weights.fp8.stored_fp8`:
        bytes and scale) or as GGUF Q4_0 blocks (`dif.weights.gguf_int4.stored_q4_0`, for int4 groups of 32) is
        taken as stored, since quantizing its dequantized values again with new scales would round them anew;
        any other is `derive`d."""
        from dif.weights.fp8 import E4M3, FORMAT, stored_fp8
        from dif.weights.gguf_int4 import GROUP, stored_q4_0

        stored: Any = None
        if fmt == FORMAT and (fp8 := stored_fp8(self.base, source)) is not None and fp8.dtype == E4M3:
            stored = fp8
        elif fmt == GROUP_FORMAT and group == GROUP:
            stored = stored_q4_0(self.base, source)
        if stored is not None:
            q, scale = stored.load()
            return {"q": q, "scale": scale}
        return derive(self.base[source], fmt, group)

    def __contains__(self, name: object) -> bool:
        return name in self._derived or name in self.base

    def __iter__(self) -> Iterator[str]:
        yield from self.base
        yield from (n for n in self._derived if n not in self.base)

    def __len__(self) -> int:
        return len(self.base) + sum(1 for n in self._derived if n not in self.base)


def with_quantized_weights(program: Program, weights: Mapping[str, Any]) -> Mapping[str, Any]:
    """`weights` as `program` reads them: unchanged when it has no derived parameter, else `QuantizedWeights`."""
    if not any(parse_derived(p.name) is not None for p in program.params):
        return weights
    if isinstance(weights, QuantizedWeights):
        weights = weights.base
    return QuantizedWeights(program, weights)
