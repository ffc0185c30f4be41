"""Checkpoint access: fp8 weights, plain (float8_e4m3fn / e5m2 tensors) and ComfyUI's scaled fp8.

Where it sits: between opening a single file and renaming it (`dif.weights.remap`). Plain fp8
tensors need nothing here: `bind_weights` widens them to the run dtype, and `--dtype auto` runs an
fp8 checkpoint in bf16 (which holds every e4m3 / e5m2 value exactly; `dif.checkpoint.RUN_DTYPES`).
ComfyUI's scaled fp8 files store `W_fp8 = W / s` and the scale beside it (`<module>.scale_weight`,
newer files `<module>.weight_scale`: a scalar or one value per output row), plus `scale_input`
tensors for fp8 matmuls and a `scaled_fp8` marker. `scaled_fp8(source)` presents such a file with
every `<module>.weight` already multiplied by its scale, in bf16 (as ComfyUI dequantizes them, in
its compute dtype), and the scale, input-scale and marker tensors hidden; it warns once that the
weights are dequantized, since no dif backend executes fp8 weights yet.
"""

from __future__ import annotations

import warnings

import ml_dtypes
import numpy as np

from dif.errors import DifWarning, WeightError
from dif.weights.safetensors_file import TensorInfo
from dif.weights.source import TensorSource

FP8 = ("F8_E4M3", "F8_E5M2")
SCALE_SUFFIXES = (".scale_weight", ".weight_scale")
HIDDEN_SUFFIXES = (".scale_input", ".input_scale")
MARKER = "scaled_fp8"


class ScaledFp8Source(TensorSource):
    """`base` with each scaled fp8 weight dequantized (fp8 x scale, rounded to bf16) when read."""

    def __init__(self, base: TensorSource, scales: dict[str, str]) -> None:
        self.base = base
        self.scales = dict(scales)  # weight name -> its scale tensor's name
        self.label = f"{base.label} (scaled fp8, dequantized)"
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
        scale = np.asarray(self.base[self.scales[name]], dtype=np.float32)
        if scale.size == 1:
            scale = scale.reshape(())
        elif scale.size == weight.shape[0]:
            scale = scale.reshape((weight.shape[0],) + (1,) * (weight.ndim - 1))
        else:
            raise WeightError(
                f"'{self.scales[name]}' in {self.base.file_of(self.scales[name])} has {scale.size} values; "
                f"a scale for '{name}' {list(weight.shape)} is one value or one per output row"
            )
        return (weight * scale).astype(ml_dtypes.bfloat16)


def scaled_fp8(source: TensorSource) -> TensorSource:
    """`source` with ComfyUI scaled fp8 weights dequantized (`ScaledFp8Source`), or `source` itself
    when it has no scale tensors. Warns (`DifWarning`) naming the file and the weight count when it
    dequantizes, or when plain fp8 tensors will be widened at bind."""
    scales: dict[str, str] = {}
    for name in source.names():
        for suffix in SCALE_SUFFIXES:
            if name.endswith(suffix):
                weight = name[: -len(suffix)] + ".weight"
                if weight in source and source.info(weight).dtype in FP8:
                    scales[weight] = name
    if not scales:
        plain = sum(1 for n in source.names() if source.info(n).dtype in FP8)
        if plain:
            warnings.warn(
                f"{source.label}: {plain} fp8 tensors are widened to the run dtype at load (bf16 with --dtype auto; "
                "dif's backends do not execute fp8 weights yet)",
                DifWarning,
                stacklevel=2,
            )
        return source
    warnings.warn(
        f"{source.label}: {len(scales)} scaled fp8 weights are dequantized to bf16 at load (dif's backends do "
        "not execute fp8 weights yet)",
        DifWarning,
        stacklevel=2,
    )
    return ScaledFp8Source(source, scales)
