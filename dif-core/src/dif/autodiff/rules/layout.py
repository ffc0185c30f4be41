"""VJPs of `dif.ops.layout`: the adjoints of pure data movement."""

from __future__ import annotations

from dif.autodiff.emit import add_all, flip, interleave_zeros, one_hot, pad_axis, sum_to, zeros_like
from dif.autodiff.registry import VjpArgs, vjp
from dif.ir.builder import Var


@vjp("reshape")
def _reshape(a: VjpArgs) -> list[Var | None]:
    return [a.b.emit("reshape", a.g, shape=a.x.shape)]


@vjp("transpose")
def _transpose(a: VjpArgs) -> list[Var | None]:
    perm = tuple(a.attrs["perm"])
    inverse = tuple(sorted(range(len(perm)), key=perm.__getitem__))
    return [a.b.emit("transpose", a.g, perm=inverse)]


@vjp("concat")
def _concat(a: VjpArgs) -> list[Var | None]:
    axis = int(a.attrs["axis"]) % a.y.type.rank
    sizes = tuple(v.shape[axis] for v in a.operands if v is not None)
    pieces = a.b.emit_multi("split", a.g, axis=axis, sizes=sizes) if len(sizes) > 1 else (a.g,)
    return [p if want else None for p, want in zip(pieces, a.wants, strict=True)]


@vjp("split")
def _split(a: VjpArgs) -> list[Var | None]:
    parts = [g if g is not None else zeros_like(a.b, r) for g, r in zip(a.cotangents, a.results, strict=True)]
    return [a.b.emit("concat", *parts, axis=int(a.attrs["axis"])) if len(parts) > 1 else parts[0]]


@vjp("slice")
def _slice(a: VjpArgs) -> list[Var | None]:
    """Scatter g back: zeros between strided picks, then zeros before start and after the last pick."""
    b, x = a.b, a.x
    axis = int(a.attrs["axis"]) % x.type.rank
    n = x.shape[axis]
    start, _, step = slice(a.attrs["start"], a.attrs["stop"], a.attrs["step"]).indices(n)
    picked = a.y.shape[axis]
    if picked == 0:
        return [zeros_like(b, x)]
    spread = interleave_zeros(b, a.g, axis, step)
    return [pad_axis(b, spread, axis, start, n - start - spread.shape[axis])]


@vjp("pad")
def _pad(a: VjpArgs) -> list[Var | None]:
    """Constant padding: the interior of g. Reflect padding also folds each mirrored border back
    onto the rows it copied (edge excluded)."""
    b, x = a.b, a.x
    pads = tuple(a.attrs["pads"])
    g = a.g
    for axis in range(x.type.rank):
        before, after = pads[2 * axis], pads[2 * axis + 1]
        if not before and not after:
            continue
        n = x.shape[axis]
        inner = b.emit("slice", g, axis=axis, start=before, stop=before + n)
        if a.attrs["mode"] == "reflect":
            parts = [inner]
            if before:  # out[before - 1 - j] = x[j + 1]
                head = flip(b, b.emit("slice", g, axis=axis, start=0, stop=before), axis)
                parts.append(pad_axis(b, head, axis, 1, n - 1 - before))
            if after:  # out[before + n + j] = x[n - 2 - j]
                tail = flip(b, b.emit("slice", g, axis=axis, start=before + n, stop=before + n + after), axis)
                parts.append(pad_axis(b, tail, axis, n - 1 - after, 1))
            inner = add_all(b, parts)
        g = inner
    return [g]


@vjp("broadcast_to")
def _broadcast_to(a: VjpArgs) -> list[Var | None]:
    return [sum_to(a.b, a.g, a.x.shape)]


def _scatter(a: VjpArgs, x: Var, idx: Var, axis: int) -> Var:
    """The adjoint of a gather along `axis`: one-hot(idx)^T contracted with g (a matmul, so every
    backend runs it; the one-hot is idx.numel x axis length)."""
    b = a.b
    pre, size, post = x.shape[:axis], x.shape[axis], x.shape[axis + 1 :]
    p, q, m = 1, 1, idx.type.numel
    for d in pre:
        p *= d
    for d in post:
        q *= d
    g = b.emit("reshape", a.g, shape=(p, m, q))
    g = b.emit("transpose", g, perm=(0, 2, 1))  # [P, Q, M]
    hot = one_hot(b, idx, size, a.g.dtype)  # [M, size]
    out = b.emit("matmul", g, b.emit("reshape", hot, shape=(1, m, size)))  # [P, Q, size]
    out = b.emit("transpose", out, perm=(0, 2, 1))
    return b.emit("reshape", out, shape=x.shape)


@vjp("take")
def _take(a: VjpArgs) -> list[Var | None]:
    x, idx = a.operands
    assert x is not None and idx is not None
    return [_scatter(a, x, idx, int(a.attrs["axis"]) % x.type.rank), None]


@vjp("embedding")
def _embedding(a: VjpArgs) -> list[Var | None]:
    ids, table = a.operands
    assert ids is not None and table is not None
    return [None, _scatter(a, table, ids, 0) if a.wants[1] else None]
