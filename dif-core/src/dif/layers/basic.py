"""Parameter-declaring wrappers around single DiffIR ops (frontend side of the pipeline).

Each helper declares its weights under the checkpoint's own names (`{name}.weight`,
`{name}.bias`) with the activation dtype, and scopes the node it emits with exactly those tensor
names as provenance. Blocks in `dif.layers.*` and the frontends compose these.
"""

from __future__ import annotations

from collections.abc import Sequence

from dif.dtypes import DType
from dif.errors import DifError
from dif.ir.builder import ProgramBuilder, Var


def _tensor_names(*params: Var | None) -> tuple[str, ...]:
    return tuple(p.name for p in params if p is not None)


def linear(b: ProgramBuilder, x: Var, name: str, out_features: int, *, bias: bool = False) -> Var:
    """x [..., in] -> [..., out]; weight `{name}.weight` [out, in], bias `{name}.bias` [out]. Inside
    `dif.lora.slots.lora_slots` naming this weight, + (x @ down^T) @ up^T with `down` [r, in] and `up`
    [out, r] program inputs (an unmerged LoRA)."""
    from dif.lora.slots import current_slots, slot_inputs

    w = b.param(f"{name}.weight", (out_features, x.shape[-1]), x.dtype)
    bv = b.param(f"{name}.bias", (out_features,), x.dtype) if bias else None
    with b.scope(tensors=_tensor_names(w, bv)):
        y = b.emit("linear", x, w, bv)
    rank = current_slots().get(f"{name}.weight")
    if rank is None:
        return y
    down_name, up_name = slot_inputs(name)
    down = b.input(down_name, (rank, x.shape[-1]), x.dtype)
    up = b.input(up_name, (out_features, rank), x.dtype)
    with b.scope(tensors=(down_name, up_name)):
        return b.emit("add", y, b.emit("linear", b.emit("linear", x, down), up))


def conv2d(
    b: ProgramBuilder,
    x: Var,
    name: str,
    out_channels: int,
    kernel: int,
    *,
    stride: int = 1,
    padding: int | Sequence[int] = 0,
    bias: bool = True,
) -> Var:
    """x [N, C, H, W] -> [N, out, H', W']; `{name}.weight` [out, C, k, k] (+ `{name}.bias`).

    padding: an int (same on all four sides) or (top, bottom, left, right)."""
    pads = (padding,) * 4 if isinstance(padding, int) else tuple(padding)
    w = b.param(f"{name}.weight", (out_channels, x.shape[1], kernel, kernel), x.dtype)
    bv = b.param(f"{name}.bias", (out_channels,), x.dtype) if bias else None
    with b.scope(tensors=_tensor_names(w, bv)):
        return b.emit("conv2d", x, w, bv, stride=(stride, stride), padding=pads)


def rms_norm(
    b: ProgramBuilder,
    x: Var,
    name: str | None,
    *,
    eps: float,
    offset: float = 0.0,
    round_before_weight: bool = False,
) -> Var:
    """RMS norm over the last axis; `{name}.weight` [D] when name is given (else no weight)."""
    w = b.param(f"{name}.weight", (x.shape[-1],), x.dtype) if name is not None else None
    with b.scope(tensors=_tensor_names(w)):
        return b.emit("rms_norm", x, w, eps=eps, offset=offset, round_before_weight=round_before_weight)


def layer_norm(b: ProgramBuilder, x: Var, name: str | None, *, eps: float, bias: bool = True) -> Var:
    """LayerNorm over the last axis; without `name` it has no affine parameters."""
    if name is None:
        return b.emit("layer_norm", x, eps=eps)
    w = b.param(f"{name}.weight", (x.shape[-1],), x.dtype)
    bv = b.param(f"{name}.bias", (x.shape[-1],), x.dtype) if bias else None
    with b.scope(tensors=_tensor_names(w, bv)):
        return b.emit("layer_norm", x, w, bv, eps=eps)


def group_norm(b: ProgramBuilder, x: Var, name: str, *, groups: int, eps: float) -> Var:
    """GroupNorm of x [N, C, ...] with `{name}.weight` / `{name}.bias` [C]."""
    c = x.shape[1]
    w = b.param(f"{name}.weight", (c,), x.dtype)
    bv = b.param(f"{name}.bias", (c,), x.dtype)
    with b.scope(tensors=_tensor_names(w, bv)):
        return b.emit("group_norm", x, w, bv, groups=groups, eps=eps)


def embedding(b: ProgramBuilder, ids: Var, name: str, vocab: int, dim: int, dtype: DType | str) -> Var:
    """Table lookup: ids [...] (int) -> [..., dim]; table `{name}.weight` [vocab, dim]."""
    table = b.param(f"{name}.weight", (vocab, dim), dtype)
    with b.scope(tensors=(table.name,)):
        return b.emit("embedding", ids, table)


def activation(b: ProgramBuilder, x: Var, act: str) -> Var:
    """Elementwise activation by name: silu | gelu | gelu_tanh | relu."""
    if act == "gelu":
        return b.emit("gelu", x, approximate="none")
    if act == "gelu_tanh":
        return b.emit("gelu", x, approximate="tanh")
    return b.emit(act, x)


def split_heads(b: ProgramBuilder, x: Var, head_dim: int) -> Var:
    """[B, S, H*hd] -> [B, S, H, hd]."""
    *lead, width = x.shape
    return b.emit("reshape", x, shape=(*lead, width // head_dim, head_dim))


def merge_heads(b: ProgramBuilder, x: Var) -> Var:
    """[B, S, H, hd] -> [B, S, H*hd]."""
    *lead, h, hd = x.shape
    return b.emit("reshape", x, shape=(*lead, h * hd))


def split(b: ProgramBuilder, x: Var, sizes: Sequence[int], *, axis: int = -1) -> tuple[Var, ...]:
    """Split along `axis` into pieces of the given sizes."""
    return b.emit_multi("split", x, axis=axis, sizes=tuple(sizes))


def chunk(b: ProgramBuilder, x: Var, n: int, *, axis: int = -1) -> tuple[Var, ...]:
    """Split along `axis` into n equal pieces (torch.chunk for divisible sizes)."""
    size = x.shape[axis]
    if size % n:
        raise DifError(f"chunk: axis of size {size} does not split into {n} equal parts")
    return split(b, x, [size // n] * n, axis=axis)
