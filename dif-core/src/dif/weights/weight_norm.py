"""Checkpoint access, step 3 (like `remap`): weight-normalized layers folded into plain weights.

`torch.nn.utils.weight_norm` stores a layer's weight as `<name>.weight_g` (the norms, [d0, 1, ...]) and
`<name>.weight_v` (the direction, the weight's shape); the layer computes `g * v / ||v||` with the norm
over every axis but 0 (for a ConvTranspose1d axis 0 is the *input* channel). `WeightNormSource` shows
each such pair as one `<name>.weight`, folded on first access (float32, the norm accumulated in
float64) and cached, so programs declare ordinary weights and nothing is recomputed per run.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from dif.errors import WeightError
from dif.weights.safetensors_file import TensorInfo
from dif.weights.source import TensorSource

G, V = ".weight_g", ".weight_v"


def fold_weight_norm(g: np.ndarray, v: np.ndarray) -> np.ndarray:
    """g * v / ||v|| (norm over all axes but 0), float32: torch's `_weight_norm(v, g, 0)`."""
    vf = np.asarray(v, dtype=np.float32)
    norm = np.sqrt(np.sum(np.square(vf, dtype=np.float64), axis=tuple(range(1, vf.ndim)), keepdims=True))
    return vf * (np.asarray(g, dtype=np.float32) / norm.astype(np.float32))


class WeightNormSource(TensorSource):
    """`base` with every `<name>.weight_g` / `<name>.weight_v` pair shown as a folded `<name>.weight`
    (F32, v's shape); other tensors pass through. A half pair or a `g` not shaped [v.shape[0], 1, ...]
    is a `WeightError` naming both tensors and the file."""

    def __init__(self, base: TensorSource) -> None:
        self.base = base
        self.label = base.label
        names = base.names()
        present = set(names)
        self._pairs: dict[str, str] = {}
        problems = []
        for n in names:
            if n.endswith(V) or n.endswith(G):
                stem = n[: -len(V)]
                other = stem + (G if n.endswith(V) else V)
                if other not in present:
                    problems.append(f"'{n}' in {base.file_of(n)} has no '{other}'")
                elif n.endswith(V):
                    self._pairs[stem + ".weight"] = stem
        for target, stem in self._pairs.items():
            g, v = base.info(stem + G).shape, base.info(stem + V).shape
            if len(g) != len(v) or not v or g[0] != v[0] or any(d != 1 for d in g[1:]):
                problems.append(
                    f"'{stem + G}' {list(g)} is not the norm shape [{v[0] if v else '?'}, 1, ...] "
                    f"of '{stem + V}' {list(v)}"
                )
            if target in present:
                problems.append(f"'{target}' is stored beside its weight-norm pair '{stem + G}' / '{stem + V}'")
        if problems:
            raise WeightError(f"weight-norm tensors in {base.label}: " + "; ".join(problems))
        folded = {s + G for s in self._pairs.values()} | {s + V for s in self._pairs.values()}
        self._names = [n for n in names if n not in folded] + list(self._pairs)
        self._name_set = set(self._names)
        self._cache: dict[str, np.ndarray] = {}

    @property
    def folded(self) -> Iterable[str]:
        """The names shown as folded weights."""
        return list(self._pairs)

    def names(self) -> list[str]:
        return list(self._names)

    def __contains__(self, name: object) -> bool:
        return name in self._name_set

    def info(self, name: str) -> TensorInfo:
        stem = self._pairs.get(name)
        if stem is None:
            return self.base.info(name)
        v = self.base.info(stem + V)
        return TensorInfo(name, "F32", v.shape, v.begin, v.end, v.file)

    def file_of(self, name: str) -> str:
        stem = self._pairs.get(name)
        if stem is None:
            return self.base.file_of(name)
        return f"{self.base.file_of(stem + V)} (folded from '{stem + G}' and '{stem + V}')"

    def _load(self, name: str) -> np.ndarray:
        stem = self._pairs.get(name)
        if stem is None:
            return self.base[name]
        cached = self._cache.get(name)
        if cached is None:
            cached = fold_weight_norm(self.base[stem + G], self.base[stem + V])
            self._cache[name] = cached
        return cached
