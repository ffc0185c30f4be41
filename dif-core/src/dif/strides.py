"""Element strides of row-major tensors: the index arithmetic every backend's lowering and the planner's
buffer views (`dif.plan.views`) share. Strides count elements (multiply by the item size for bytes)."""

from __future__ import annotations

from collections.abc import Sequence


def contiguous_strides(shape: Sequence[int]) -> list[int]:
    """Strides of a contiguous row-major `shape` (the last axis 1; a zero extent gives zeros before it)."""
    out, acc = [0] * len(shape), 1
    for i in reversed(range(len(shape))):
        out[i] = acc
        acc *= shape[i]
    return out


def broadcast_strides(shape: Sequence[int], out_shape: Sequence[int]) -> list[int]:
    """Element strides of a contiguous `shape` read as `out_shape` under numpy broadcasting (0 = repeat)."""
    base, pad = contiguous_strides(shape), len(out_shape) - len(shape)
    out = []
    for i, d in enumerate(out_shape):
        j = i - pad
        out.append(0 if j < 0 or (shape[j] == 1 and d != 1) else base[j])
    return out


def collapse(shape: Sequence[int], strides: Sequence[Sequence[int]]) -> tuple[list[int], list[list[int]]]:
    """Drop size-1 axes and merge neighbours that are contiguous for every operand (fewer index divisions):
    `shape` with one stride list per operand -> (shape, strides) of at least one axis ([1] and zero strides
    for a single element)."""
    dims = [i for i, d in enumerate(shape) if d != 1]
    if not dims:
        return [1], [[0] for _ in strides]
    new_shape = [shape[dims[0]]]
    new_strides = [[s[dims[0]]] for s in strides]
    for i in dims[1:]:
        d = shape[i]
        if all(ns[-1] == s[i] * d for ns, s in zip(new_strides, strides, strict=True)):
            new_shape[-1] *= d
            for ns, s in zip(new_strides, strides, strict=True):
                ns[-1] = s[i]
        else:
            new_shape.append(d)
            for ns, s in zip(new_strides, strides, strict=True):
                ns.append(s[i])
    return new_shape, new_strides
