"""1D signal layers (audio decoders) composed from core ops: convolution, transposed convolution,
replicate padding, Snake activations.

Frontend side of the pipeline, like `dif.layers.basic`. Tensors are [N, C, L]. Nothing here adds an op:
a 1D convolution is `conv2d` on [N, C, 1, L]; a transposed convolution is its polyphase form (one
`conv2d` per output phase with every `stride`-th kernel tap, phases interleaved), which multiplies no
inserted zeros; replicate padding is edge slices broadcast and concatenated. Every backend that runs
`conv2d`, `slice`, `concat` and `broadcast_to` runs these.
"""

from __future__ import annotations

from dif.errors import DifError
from dif.ir.builder import ProgramBuilder, Var


def conv1d(
    b: ProgramBuilder,
    x: Var,
    w: Var,
    bias: Var | None = None,
    *,
    stride: int = 1,
    padding: tuple[int, int] = (0, 0),
    dilation: int = 1,
    groups: int = 1,
) -> Var:
    """torch's conv1d: x [N, C, L], w [O, C/groups, k], bias [O] -> [N, O, L'] (zero padding (left, right))."""
    n, c, length = x.shape
    o, cg, k = w.shape
    x4 = b.emit("reshape", x, shape=(n, c, 1, length))
    w4 = b.emit("reshape", w, shape=(o, cg, 1, k))
    y = b.emit(
        "conv2d",
        x4,
        w4,
        bias,
        stride=(1, stride),
        padding=(0, 0, padding[0], padding[1]),
        dilation=(1, dilation),
        groups=groups,
    )
    return b.emit("reshape", y, shape=(n, o, y.shape[3]))


def flip_taps(b: ProgramBuilder, w: Var, taps: range | list[int]) -> Var:
    """w [..., k] -> w[..., taps[::-1]] (the chosen kernel taps, last first), by slices and one concat."""
    pieces = [b.emit("slice", w, axis=-1, start=t, stop=t + 1) for t in reversed(list(taps))]
    return pieces[0] if len(pieces) == 1 else b.emit("concat", *pieces, axis=-1)


def conv_transpose1d(
    b: ProgramBuilder, x: Var, w: Var, bias: Var | None = None, *, stride: int = 1, padding: int = 0
) -> Var:
    """torch's conv_transpose1d (groups 1, no output padding): x [N, Cin, L], w [Cin, Cout, k] (torch's
    layout), bias [Cout] -> [N, Cout, (L - 1) * stride - 2 * padding + k].

    Output sample m = q * stride + r of the unpadded result is sum_j x[q - j] w[j * stride + r]: for each
    phase r a correlation of x (left-padded) with taps r, r + stride, ... reversed. The phases are stacked
    on a trailing axis, flattened (interleaving them) and the `padding` samples cut from both ends."""
    n, cin, length = x.shape
    wcin, cout, k = w.shape
    if wcin != cin:
        raise DifError(f"conv_transpose1d: weight {w.shape} does not take {cin} input channels")
    if k < stride:
        raise DifError(f"conv_transpose1d: kernel {k} shorter than stride {stride} leaves phases without taps")
    q_len = length - 1 + -(-k // stride)  # phase length: ceil(((L - 1) * stride + k) / stride)
    wt = b.emit("transpose", w, perm=(1, 0, 2))  # [Cout, Cin, k]
    phases = []
    for r in range(stride):
        taps = range(r, k, stride)
        kr = flip_taps(b, wt, taps)
        y = conv1d(b, x, kr, padding=(len(taps) - 1, q_len - length))
        phases.append(b.emit("reshape", y, shape=(n, cout, q_len, 1)))
    y = phases[0] if stride == 1 else b.emit("concat", *phases, axis=3)
    y = b.emit("reshape", y, shape=(n, cout, q_len * stride))
    out_len = (length - 1) * stride - 2 * padding + k
    if out_len < 1:
        raise DifError(f"conv_transpose1d: padding {padding} leaves no output for length {length}")
    y = b.emit("slice", y, axis=2, start=padding, stop=padding + out_len)
    if bias is not None:
        y = b.emit("add", y, b.emit("reshape", bias, shape=(cout, 1)))
    return y


def replicate_pad1d(b: ProgramBuilder, x: Var, left: int, right: int) -> Var:
    """x [..., L] padded by repeating its first sample `left` times and its last `right` times."""
    *lead, length = x.shape
    parts = []
    if left:
        edge = b.emit("slice", x, axis=-1, start=0, stop=1)
        parts.append(b.emit("broadcast_to", edge, shape=(*lead, left)))
    parts.append(x)
    if right:
        edge = b.emit("slice", x, axis=-1, start=length - 1, stop=length)
        parts.append(b.emit("broadcast_to", edge, shape=(*lead, right)))
    return parts[0] if len(parts) == 1 else b.emit("concat", *parts, axis=-1)


def snake(b: ProgramBuilder, x: Var, alpha: Var, beta: Var, *, log_scale: bool, eps: float = 1e-9) -> Var:
    """x [N, C, L] + 1 / (beta + eps) * sin(alpha * x)^2 with per-channel alpha, beta [C] (SnakeBeta;
    Snake is beta = alpha). With `log_scale` both are stored as logarithms and exponentiated first."""
    c = x.shape[1]
    a = b.emit("reshape", alpha, shape=(c, 1))
    s = b.emit("reshape", beta, shape=(c, 1))
    if log_scale:
        a, s = b.emit("exp", a), b.emit("exp", s)
    inv = b.emit("reciprocal", b.emit("scalar_affine", s, bias=eps))
    wave = b.emit("square", b.emit("sin", b.emit("mul", a, x)))
    return b.emit("add", x, b.emit("mul", inv, wave))
