"""Checkpoint access: fp8 weights, plain (float8_e4m3fn / e5m2 tensors) and ComfyUI's scaled fp8.

Where it sits: between opening a single file and renaming it (`dif.weights.remap`), and again where a pipeline
optimizes a program bound to such weights (`dif.program_cache`). ComfyUI's scaled fp8 files store
`W_fp8 = W / s` and the scale beside it (`<module>.scale_weight`, newer files `<module>.weight_scale`: a scalar
or one value per output row), plus `scale_input` tensors for fp8 matmuls and a `scaled_fp8` marker.

- Read as values, fp8 weights are dequantized: `scaled_fp8(source)` presents every scaled `<module>.weight`
  multiplied by its scale, in bf16 (as ComfyUI dequantizes them, in its compute dtype), the scale, input-scale
  and marker tensors hidden; plain fp8 tensors are widened by `bind_weights` to the run dtype (`--dtype auto`
  runs an fp8 checkpoint in bf16, which holds every e4m3 / e5m2 value exactly; `dif.checkpoint.RUN_DTYPES`).
- Kept as fp8: where the `quantize_fp8` pass converts a linear whose weight is stored as e4m3, its derived
  `W@fp8-e4m3.q` / `.scale` are the stored bytes and scale (`stored_fp8`, read by `dif.weights.quantized`),
  never the dequantized values quantized again. `choose_fp8` decides whether a program gets that pass for its
  stored weights: when its frontend asks, `DIF_FP8_WEIGHTS` allows it, and the backend executes fp8-e4m3;
  `Fp8Choice.outcome` says what came of it, for the plan, and gives the note to warn with when they run
  dequantized.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np
from attrs import frozen

from dif.errors import WeightError
from dif.weights.remap import Chunk
from dif.weights.safetensors_file import TensorInfo
from dif.weights.source import TensorSource

if TYPE_CHECKING:
    from dif.ir.program import Program
    from dif.target import TargetProfile
    from dif.weights.stored import StoredTensor

FP8 = ("F8_E4M3", "F8_E5M2")
E4M3 = "F8_E4M3"
FORMAT = "fp8-e4m3"  # the physical format (`dif.formats`) fp8 weights are kept in; its pass is quantize_fp8
SCALE_SUFFIXES = (".scale_weight", ".weight_scale")
HIDDEN_SUFFIXES = (".scale_input", ".input_scale")
MARKER = "scaled_fp8"


def row_scale(source: TensorSource, scale: str, weight: str) -> np.ndarray:
    """[out] f32: scale tensor `scale` of `source` (one value, or one per output row) for weight `weight`."""
    shape = source.info(weight).shape
    rows = shape[0]
    s = np.asarray(source[scale], dtype=np.float32)
    if s.size not in (1, rows):
        raise WeightError(
            f"'{scale}' in {source.file_of(scale)} has {s.size} values; "
            f"a scale for '{weight}' {list(shape)} is one value or one per output row"
        )
    return np.broadcast_to(s.reshape(-1), (rows,)).astype(np.float32)


class ScaledFp8Source(TensorSource):
    """`base` with each scaled fp8 weight dequantized (fp8 x scale, rounded to bf16) when read."""

    def __init__(self, base: TensorSource, scales: dict[str, str]) -> None:
        self.base = base
        self.scales = dict(scales)  # weight name -> its scale tensor's name
        self.label = f"{base.label} (scaled fp8)"
        hidden = set(self.scales.values())
        self._names = [n for n in base.names() if n not in hidden and n != MARKER and not n.endswith(HIDDEN_SUFFIXES)]
        self._set = set(self._names)

    def names(self) -> list[str]:
        return list(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._set

    def info(self, name: str) -> TensorInfo:
        info = self.base.info(name)
        if name in self.scales:
            return TensorInfo(name, "BF16", info.shape, info.begin, info.end, info.file)
        return info

    def file_of(self, name: str) -> str:
        where = self.base.file_of(name)
        return f"{where} (x '{self.scales[name]}')" if name in self.scales else where

    def _load(self, name: str) -> np.ndarray:
        if name not in self.scales:
            return self.base[name]
        weight = np.asarray(self.base[name], dtype=np.float32)
        scale = row_scale(self.base, self.scales[name], name).reshape((-1,) + (1,) * (weight.ndim - 1))
        return (weight * scale).astype(ml_dtypes.bfloat16)


def scaled_fp8(source: TensorSource) -> TensorSource:
    """`source` with ComfyUI scaled fp8 weights dequantized when read as values (`ScaledFp8Source`), or
    `source` itself when it has no scale tensors. Whether they run dequantized is decided per program
    (`choose_fp8`), which says so."""
    scales: dict[str, str] = {}
    for name in source.names():
        for suffix in SCALE_SUFFIXES:
            if name.endswith(suffix):
                weight = name[: -len(suffix)] + ".weight"
                if weight in source and source.info(weight).dtype in FP8:
                    scales[weight] = name
    return ScaledFp8Source(source, scales) if scales else source


# -- the stored form of a bound weight ----------------------------------------------------------------------


@frozen
class StoredFp8:
    """Where a weight's fp8 values live: tensor `tensor` of `source` (stored as `dtype`, "F8_E4M3" or
    "F8_E5M2"), its scale tensor `scale` there (None: 1), and the row chunks rename rules take of it
    (innermost first: one of a fused qkv's parts)."""

    source: TensorSource
    tensor: str
    dtype: str
    scale: str | None = None
    rows: tuple[Chunk, ...] = ()

    def load(self) -> tuple[np.ndarray, np.ndarray]:
        """(values [out, in] as stored, scale [out] f32): the weight is values x scale per output row."""
        q = np.asarray(self.source[self.tensor])
        s = np.ones(q.shape[0], np.float32) if self.scale is None else row_scale(self.source, self.scale, self.tensor)
        for chunk in self.rows:
            q, s = chunk.apply(q), chunk.apply(s)
        return q, np.ascontiguousarray(s)


def _as_fp8(found: StoredTensor | None) -> StoredFp8 | None:
    if found is None:
        return None
    dtype = found.source.info(found.tensor).dtype
    return StoredFp8(found.source, found.tensor, dtype, found.scale, found.rows) if dtype in FP8 else None


def locate_fp8(source: TensorSource, name: str) -> StoredFp8 | None:
    """The stored fp8 form of tensor `name` of `source` (`dif.weights.stored.locate_stored`: through renames,
    a chunk of rows, merged LoRAs that leave it as it is, and scaled fp8); None when it is not stored as fp8
    or a source between changes its values. Reads headers only."""
    from dif.weights.stored import locate_stored

    return _as_fp8(locate_stored(source, name))


def stored_fp8(weights: Mapping[str, Any], param: str) -> StoredFp8 | None:
    """The stored fp8 form of parameter `param` of bound weights (`dif.weights.bind.BoundWeights`); None for
    other parameters and for weights that are not bound from a checkpoint."""
    from dif.weights.stored import stored_of

    return _as_fp8(stored_of(weights, param))


# -- the per-program decision -------------------------------------------------------------------------------


@frozen
class Fp8Choice:
    """A program's fp8-stored parameters (name -> stored dtype) and whether it runs them in fp8: `why_not`
    None appends `passes`; otherwise it says why they run dequantized."""

    label: str
    stored: dict[str, str]
    dtype: str
    why_not: str | None

    @property
    def passes(self) -> tuple[str, ...]:
        """The optimizer passes to append to the pipeline (the fp8 format pass, or none)."""
        from dif.passes.quantize import FORMAT_PASSES

        return () if self.why_not else (FORMAT_PASSES[FORMAT],)

    def outcome(self, optimized: Program) -> tuple[str, str, str | None]:
        """(summary, why, the note to warn with or None) once the program is `optimized`: how many stored fp8
        weights run as stored (their linear became `scaled_linear` over the stored bytes and scales) and how
        many run dequantized. The note is given only when none runs as stored and `why_not` says why."""
        from dif.weights.quantized import derived_name

        names = {p.name for p in optimized.params}
        kept = sum(1 for p, d in self.stored.items() if d == E4M3 and derived_name(p, FORMAT, "q") in names)
        rest = len(self.stored) - kept
        if kept:
            how = "appended as the backend executes fp8-e4m3" if self.why_not is None else "in the pipeline"
            why = f"{self.label}: quantize_fp8 ({how}) reads their stored bytes and scales, not re-quantized"
            if rest:
                why += f"; {rest} more run dequantized to {self.dtype}, where quantize_fp8 left their linear as it was"
            return f"{kept} kept as stored ({FORMAT})", why, None
        reason = self.why_not or "quantize_fp8 converted none of their linears"
        note = f"{self.label}: {rest} fp8 weights are dequantized to {self.dtype}: {reason}"
        return f"{rest} dequantized to {self.dtype}", note, note if self.why_not else None


def choose_fp8(
    program: Program, weights: Mapping[str, Any], target: TargetProfile | None, *, keep: bool
) -> Fp8Choice | None:
    """Whether `program`, bound to `weights`, runs the weights its checkpoint stores as fp8 in fp8 on `target`
    (None: the reference interpreter, which runs programs as built); None when it has no such weight.
    `keep`: its frontend asks for it (a denoiser); `DIF_FP8_WEIGHTS=dequantize` declines it everywhere."""
    from dif.env import DIF_FP8_WEIGHTS
    from dif.formats import execution_on

    stored = {p.name: s.dtype for p in program.params if (s := stored_fp8(weights, p.name)) is not None}
    if not stored:
        return None
    dtype = program.types[next(iter(stored))].dtype.value
    label = getattr(weights, "source", None)
    label = label.label if isinstance(label, TensorSource) else program.name
    why_not: str | None = None
    if not keep:
        why_not = f"its frontend runs program '{program.name}' in the run dtype (fp8 is kept in denoisers)"
    elif DIF_FP8_WEIGHTS.get_choice(("auto", "dequantize")) == "dequantize":
        why_not = f"{DIF_FP8_WEIGHTS.name}=dequantize"
    elif E4M3 not in stored.values():
        why_not = f"they are fp8-e5m2, and the fp8 format dif executes is {FORMAT}"
    elif target is None:
        why_not = "the reference interpreter runs programs as built"
    elif not (verdict := execution_on(FORMAT, target)).startswith("executed"):
        why_not = f"backend '{target.backend}' does not execute {FORMAT} ({verdict})"
    return Fp8Choice(label, stored, dtype, why_not)
