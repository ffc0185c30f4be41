"""The decoders end in 8-bit pixels made by the decoder's backend (`dif.layers.pixels`): for the KL VAE
([-1, 1]) and TAESD ([0, 1]), in f32 and f16, they are exactly `to_uint8` of the float picture, and a
non-finite picture is still refused by name."""

from __future__ import annotations

import numpy as np
import pytest

from dif.errors import DifError
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.layers.pixels import to_pixels
from dif.media.png import to_uint8
from dif_frontend_sdturbo import DEFAULT_CHECKPOINT
from dif_frontend_sdturbo.plugin import INFO


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("fast_vae", [False, True])
def test_device_pixels_are_to_uint8_of_the_picture(dtype: str, fast_vae: bool) -> None:
    pipe = INFO.pipeline(DEFAULT_CHECKPOINT, dtype=dtype, backend="cpu", fast_vae=fast_vae)
    latents = 2.0 * np.random.default_rng(4).standard_normal((1, 4, 8, 6)).astype(np.float32)  # non-square
    picture = pipe.decode_image(latents)[0]
    packed = latents.reshape(1, 4, 48).transpose(0, 2, 1)
    pixels = pipe.decode(packed, 8, 6)
    assert pixels.dtype == np.uint8 and pixels.shape == (64, 48, 3)
    want = to_uint8(picture, value_range="0,1" if fast_vae else "-1,1")
    assert np.array_equal(pixels, want)
    assert 0 < np.count_nonzero(want == 0) + np.count_nonzero(want == 255) < want.size  # the clamp was exercised


@pytest.mark.parametrize("value_range", ["-1,1", "0,1"])
def test_to_pixels_rounds_ties_to_even_and_probes_finiteness(value_range: str) -> None:
    b = ProgramBuilder("pixels")
    image = b.input("image", (1, 3, 2, 5), "f16")
    pixels, probe = to_pixels(b, image, value_range=value_range)
    b.output(pixels)
    b.output(probe)
    program = b.build()
    x = np.linspace(-1.2, 1.2, 30, dtype=np.float16).reshape(1, 3, 2, 5)
    x[0, 0, 0, 0] = 0.5 if value_range == "0,1" else 0.0  # 127.5 after x*255: ties go to the even 128
    got = interpret(program, {"image": x}, {})
    assert np.array_equal(got[program.outputs[0]], to_uint8(x[0], value_range=value_range))
    assert got[program.outputs[0]][0, 0, 0] == 128
    assert float(got[program.outputs[1]]) == 0.0
    x[0, 2, 1, 3] = np.inf
    assert np.isnan(interpret(program, {"image": x}, {})[program.outputs[1]])


def test_a_nonfinite_picture_is_refused() -> None:
    pipe = INFO.pipeline(DEFAULT_CHECKPOINT, dtype="f32", backend="cpu")
    latents = np.full((1, 48, 4), np.nan, np.float32)
    with pytest.raises(DifError, match="decoded image"):
        pipe.decode(latents, 8, 6)
