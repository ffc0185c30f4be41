"""dif.media.png: pixels, A1111 `parameters` + JSON chunks, atomic writes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dif.errors import DifError
from dif.media import encode_png, format_parameters, read_png_metadata, to_uint8, write_png


def test_to_uint8_matches_reference_rounding() -> None:
    x = np.array([[[-1.0, 0.0, 1.0], [2.0, -3.0, 0.001]]], np.float32)  # (1, 2, 3) HWC
    out = to_uint8(x)
    assert out.dtype == np.uint8 and out.shape == (1, 2, 3)
    expected = np.round(np.clip(x * np.float32(0.5) + np.float32(0.5), 0, 1) * np.float32(255)).astype(np.uint8)
    np.testing.assert_array_equal(out, expected)
    chw = np.zeros((3, 4, 5), np.float32)
    assert to_uint8(chw).shape == (4, 5, 3)
    assert to_uint8(np.ones((2, 2, 3), np.float32), value_range="0,1").max() == 255


def test_to_uint8_maps_a_bf16_image_in_bf16() -> None:
    import ml_dtypes

    bf16 = np.dtype(ml_dtypes.bfloat16)
    x = (np.random.default_rng(0).standard_normal((3, 8, 8)) * 1.2).astype(bf16)
    # the image processor's x/2 + 0.5 on a bf16 tensor rounds after each operation
    half = (x.astype(np.float32) * np.float32(0.5)).astype(bf16)
    mapped = (half.astype(np.float32) + np.float32(0.5)).astype(bf16)
    np.testing.assert_array_equal(to_uint8(x), to_uint8(mapped, value_range="0,1"))


def test_format_parameters_a1111_style() -> None:
    text = format_parameters(
        "a cat, sitting",
        "blurry",
        {"Steps": 4, "Sampler": "Euler", "CFG scale": 1.0, "Seed": 42, "Note": "a: b", "X": None},
    )
    lines = text.split("\n")
    assert lines[0] == "a cat, sitting"
    assert lines[1] == "Negative prompt: blurry"
    assert lines[2] == 'Steps: 4, Sampler: Euler, CFG scale: 1.0, Seed: 42, Note: "a: b"'
    assert "Negative prompt" not in format_parameters("p", "", {"Steps": 1})


def test_write_and_read_back(tmp_path: Path) -> None:
    from PIL import Image

    pixels = (np.arange(4 * 6 * 3) % 256).astype(np.uint8).reshape(4, 6, 3)
    params = format_parameters("ünïcode prompt ✓", None, {"Steps": 2})
    path = write_png(tmp_path / "out.png", pixels, parameters=params, metadata={"seed": 7, "prompt": "✓"})
    meta = read_png_metadata(path)
    assert meta["parameters"] == params
    assert meta["dif"] == {"seed": 7, "prompt": "✓"}
    assert meta["size"] == (6, 4) and meta["mode"] == "RGB"
    with Image.open(path) as im:
        np.testing.assert_array_equal(np.asarray(im), pixels)
    assert [p.name for p in tmp_path.iterdir()] == ["out.png"]  # no temp file left behind


def test_failed_write_leaves_nothing(tmp_path: Path) -> None:
    with pytest.raises(DifError, match="does not exist"):
        write_png(tmp_path / "missing" / "out.png", np.zeros((2, 2, 3), np.uint8))
    with pytest.raises(DifError, match="uint8"):
        encode_png(np.zeros((2, 2, 3), np.float32))
    target = tmp_path / "keep.png"
    target.write_bytes(b"old")
    with pytest.raises(DifError):
        write_png(target, np.zeros((2, 2, 2), np.uint8))  # bad channel count: old file untouched
    assert target.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.png"]
