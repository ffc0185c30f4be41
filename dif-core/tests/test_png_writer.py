"""dif.media.png_writer: banded, threaded PNG encoding, read back by Pillow (an independent decoder)."""

from __future__ import annotations

import io
import struct
import zlib

import numpy as np
import pytest

from dif.errors import DifError
from dif.media.png_writer import MIN_BAND_ROWS, filter_rows, png_bytes


def _decode(data: bytes) -> tuple[np.ndarray, dict[str, str]]:
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        pixels = np.asarray(im)
        return (pixels[..., None] if pixels.ndim == 2 else pixels), dict(im.text)


def _photo(height: int, width: int, seed: int = 0) -> np.ndarray:
    """Smooth gradients plus noise: the kind of image filters help with."""
    y, x = np.mgrid[0:height, 0:width]
    base = np.stack([(x * 0.3 + y * 0.1) % 256, np.sin(x / 40) * 90 + 128, (y * 0.5) % 256], -1)
    noise = np.random.default_rng(seed).integers(-5, 6, base.shape)
    return (base + noise).clip(0, 255).astype(np.uint8)


@pytest.mark.parametrize("shape", [(1, 1, 1), (3, 5, 2), (70, 33, 4), (200, 7, 3), (2 * MIN_BAND_ROWS + 1, 40, 3)])
@pytest.mark.parametrize("threads", [1, 4])
def test_pixels_survive_a_round_trip(shape: tuple[int, int, int], threads: int) -> None:
    pixels = np.random.default_rng(sum(shape)).integers(0, 256, shape).astype(np.uint8)
    got, _ = _decode(png_bytes(pixels, threads=threads))
    np.testing.assert_array_equal(got, pixels)


def test_bands_make_one_valid_stream_and_cost_little() -> None:
    pixels = _photo(512, 300)
    one, many = png_bytes(pixels, threads=1), png_bytes(pixels, threads=8)
    np.testing.assert_array_equal(_decode(many)[0], pixels)
    assert len(many) <= 1.01 * len(one)
    # the zlib stream inside IDAT inflates to exactly the filtered rows (Adler-32 checked by zlib)
    start = many.index(b"IDAT") + 4
    (length,) = struct.unpack(">I", many[start - 8 : start - 4])
    assert len(zlib.decompress(many[start : start + length])) == 512 * (300 * 3 + 1)


def test_a_large_image_takes_more_bands_than_threads(monkeypatch: pytest.MonkeyPatch) -> None:
    import dif.media.png_writer as writer

    monkeypatch.setattr(writer, "MAX_BAND_BYTES", 64 * 1024)  # 512 rows of 900 bytes: 8 bands on 2 threads
    pixels = _photo(512, 300)
    np.testing.assert_array_equal(_decode(png_bytes(pixels, threads=2))[0], pixels)


def test_no_larger_than_pillow_on_a_photo_like_image() -> None:
    from PIL import Image

    pixels = _photo(256, 256)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    assert len(png_bytes(pixels)) <= len(buf.getvalue())


def test_filters_pick_the_cheapest_per_row() -> None:
    ramp = np.tile(np.arange(64, dtype=np.uint8) * 3, (4, 1))  # each row a left-to-right ramp, rows equal
    rows = filter_rows(ramp, np.zeros(64, np.uint8), 1)
    assert rows[0, 0] == 1  # sub: a constant step of 3
    assert (rows[1:, 0] == 2).all() and not rows[1:, 1:].any()  # up: every byte equals the one above


def _filtered_by_the_spec(raw: np.ndarray, bpp: int) -> np.ndarray:
    """filter_rows' result computed byte by byte from the PNG specification's definitions (section 9)."""
    rows, width = raw.shape
    out = np.zeros((rows, width + 1), np.uint8)
    prior = [0] * width
    for r in range(rows):
        line = [int(v) for v in raw[r]]
        candidates = []
        for kind in range(5):
            filtered = []
            for i, x in enumerate(line):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prior[i], prior[i - bpp] if i >= bpp else 0
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                paeth = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                predictor = (0, a, b, (a + b) // 2, paeth)[kind]
                filtered.append((x - predictor) % 256)
            candidates.append(filtered)
        costs = [sum(min(v, 256 - v) for v in f) for f in candidates]
        best = costs.index(min(costs))
        out[r, 0], out[r, 1:] = best, candidates[best]
        prior = line
    return out


@pytest.mark.parametrize("bpp", [1, 3, 4])
def test_filters_are_the_specifications_byte_for_byte(bpp: int) -> None:
    """Every filter, the paeth ties and the signed-magnitude cost (0x80 counting 128) against the definitions."""
    rng = np.random.default_rng(bpp)
    raw = rng.integers(0, 256, (6, 8 * bpp), dtype=np.uint8)
    raw[2] = raw[1] + 128  # differences of exactly 0x80
    raw[3] = raw[2] + rng.integers(0, 3, 8 * bpp, dtype=np.uint8)  # near-ties between the predictors
    got = filter_rows(raw, np.zeros(raw.shape[1], np.uint8), bpp)
    np.testing.assert_array_equal(got, _filtered_by_the_spec(raw, bpp))


def test_text_chunks_latin1_and_utf8() -> None:
    text = [("parameters", "a fox, Steps: 4"), ("dif", '{"prompt": "snow ✓"}')]
    data = png_bytes(np.zeros((2, 2, 3), np.uint8), text)
    assert b"tEXtparameters" in data and b"iTXtdif" in data
    assert _decode(data)[1] == dict(text)


@pytest.mark.parametrize(
    "bad", [np.zeros((2, 2, 3), np.float32), np.zeros((2, 2), np.uint8), np.zeros((2, 2, 5), np.uint8)]
)
def test_bad_pixels_are_refused(bad: np.ndarray) -> None:
    with pytest.raises(DifError, match="uint8"):
        png_bytes(bad)
