"""The tail of an image decoder: its picture as 8-bit pixels, made where the decoder ran.

Converting on the host costs more than the decoder's device time for small pictures (a 512x512 SD decode:
13 ms of numpy against 19 ms on the H200), and downloads twice the bytes. These ops compute exactly what
`dif.media.png.to_uint8` computes on the host, so a pipeline may use either.
"""

from __future__ import annotations

from dif.dtypes import DType
from dif.ir.builder import ProgramBuilder, Var
from dif.layers.probe import finite_probe

VALUE_RANGES = ("-1,1", "0,1")


def to_pixels(b: ProgramBuilder, image: Var, *, value_range: str) -> tuple[Var, Var]:
    """image [1, C, H, W] float -> (pixels [H, W, C] u8, probe [] f32), as `to_uint8` does it: for
    "-1,1" x*0.5 then +0.5, each rounded in the image's dtype (diffusers' processor on an fp16 / bf16
    tensor); then clamp to [0, 1] and round(x*255) ties to even, in fp32.

    `probe` is the picture's `finite_probe`: 0 when every value is finite, NaN otherwise, so the caller can
    still refuse a non-finite picture."""
    if value_range not in VALUE_RANGES:
        raise ValueError(f"value range {value_range!r}: one of {', '.join(VALUE_RANGES)}")
    n, c, h, w = image.shape
    if n != 1:
        raise ValueError(f"one picture at a time, got a batch of {n}")
    x = image
    if value_range == "-1,1":
        x = b.emit("scalar_affine", x, scale=0.5, bias=0.0)  # rounded in the image's dtype, then
        x = b.emit("scalar_affine", x, scale=1.0, bias=0.5)  # again, as two torch ops round
    if x.dtype != DType.F32:
        x = b.emit("cast", x, dtype="f32")
    x = b.emit("scalar_affine", b.emit("clamp", x, lo=0.0, hi=1.0), scale=255.0, bias=0.0)
    chw = b.emit("reshape", b.emit("cast", b.emit("round", x), dtype="u8"), shape=(c, h, w))
    pixels = b.emit("transpose", chw, perm=(1, 2, 0))
    return pixels, finite_probe(b, image)


def output_picture(b: ProgramBuilder, image: Var, *, pixels: bool, value_range: str) -> None:
    """A decoder's outputs: `image` itself, or with `pixels` its 8-bit pixels and their finiteness probe
    (`to_pixels`; meta "outputs" names them)."""
    if not pixels:
        b.output(image)
        return
    picture, probe = to_pixels(b, image, value_range=value_range)
    b.output(picture)
    b.output(probe)
    b.meta["outputs"] = "pixels,finite_probe"
