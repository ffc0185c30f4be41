"""Where a bound weight's values are stored: the file-level tensor behind a program parameter, through the
sources between (renames, a chunk of a fused tensor's rows, LoRA merges that leave it as it is, ComfyUI's
scaled fp8).

Where it sits: under the stored-format readers, `dif.weights.fp8` (fp8 bytes and scales kept as fp8) and
`dif.weights.gguf_int4` (GGUF Q4_0 blocks kept as 4-bit groups). They ask `locate_stored` for the tensor
and decide from its stored type whether a format pass may read it as stored instead of its values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from attrs import frozen

from dif.weights.remap import Chunk, MappedSource
from dif.weights.source import ArraySource, FileSource, TensorSource


@frozen
class StoredTensor:
    """Tensor `tensor` of the file-level `source` (a safetensors file, arrays, a GGUF file), its scaled-fp8
    scale tensor `scale` there (None: none), and the row chunks rename rules take of it (innermost first: one
    of a fused qkv's parts)."""

    source: TensorSource
    tensor: str
    scale: str | None = None
    rows: tuple[Chunk, ...] = ()


def locate_stored(source: TensorSource, name: str) -> StoredTensor | None:
    """The stored form of tensor `name` of `source`, or None where a source between changes its values (a
    LoRA adapting it, a transform other than a chunk of rows) or is of a kind not looked through. Reads
    headers only."""
    from dif.lora.merge import LoraMergedSource  # dif.lora builds on dif.weights
    from dif.weights.fp8 import ScaledFp8Source
    from dif.weights.gguf import GGUFFile

    rows: list[Chunk] = []
    while True:
        if isinstance(source, LoraMergedSource):
            if name in source.merged:  # an adapted weight: its values are the merge's, not the file's
                return None
            source = source.base
        elif isinstance(source, ScaledFp8Source):
            if name in source.scales:
                return StoredTensor(source.base, name, source.scales[name], tuple(reversed(rows)))
            source = source.base
        elif isinstance(source, MappedSource):
            rule = source.rules.get(name)
            if rule is not None:
                if rule.transform is not None:
                    if not (isinstance(rule.transform, Chunk) and rule.transform.axis == 0):
                        return None
                    rows.append(rule.transform)
                name = rule.source
            source = source.base
        elif isinstance(source, FileSource | ArraySource | GGUFFile):
            return StoredTensor(source, name, None, tuple(reversed(rows))) if name in source else None
        else:
            return None


def stored_of(weights: Mapping[str, Any], param: str) -> StoredTensor | None:
    """The stored form of parameter `param` of bound weights (`dif.weights.bind.BoundWeights`); None for other
    parameters and for weights that are not bound from a checkpoint."""
    from dif.weights.bind import BoundWeights

    if not isinstance(weights, BoundWeights) or param not in weights:
        return None
    return locate_stored(weights.source, weights.tensor_of(param))
