"""Output format by extension: -o x.png / x.jpg / x.jpeg / x.webp write that format with the run's
metadata (PNG text chunks; EXIF UserComment + ImageDescription for JPEG and WebP), read back by Pillow's
own parsers; an unknown extension is refused before anything loads, naming it and the supported ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import dif
from dif.errors import UsageError
from dif.media.image_file import encode_image, exif_bytes, image_format, read_image_metadata, write_image
from dif_tools.cli import build_cli

ARGS = ["flux2", "generate", "-p", "a fox, café", "--steps", "2", "--seed", "4", "-W", "32", "-H", "32"]


@pytest.mark.parametrize(("name", "fmt"), [("a.png", "PNG"), ("a.jpg", "JPEG"), ("a.JPEG", "JPEG"), ("a.webp", "WEBP")])
def test_cli_writes_the_format_the_extension_names(tmp_path: Path, name: str, fmt: str) -> None:
    out = tmp_path / name
    result = CliRunner().invoke(build_cli(), [*ARGS, "--backend", "cpu", "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    with Image.open(out) as image:
        assert image.format == fmt and image.size == (32, 32)
    meta = read_image_metadata(out)
    settings = json.loads(result.stdout)["data"]["settings"]
    assert meta["parameters"].startswith("a fox, café\nSteps: 2, Sampler: Euler, Schedule type: Simple")
    assert meta["dif"]["seed"] == 4 and meta["dif"]["prompt"] == "a fox, café"
    assert {k: meta["dif"][k] for k in settings} == settings


@pytest.mark.parametrize("name", ["a.gif", "a.tiff", "noext"])
def test_unknown_extension_is_refused_before_anything_runs(tmp_path: Path, name: str) -> None:
    out = tmp_path / name
    result = CliRunner().invoke(build_cli(), [*ARGS, "--backend", "cpu", "-o", str(out)])
    assert result.exit_code != 0
    assert ".png, .jpg, .jpeg, .webp" in result.output and "Traceback" not in result.output
    assert ("'" + Path(name).suffix + "'" if Path(name).suffix else "no extension") in result.output
    assert "denoise" not in result.output and list(tmp_path.iterdir()) == []  # nothing ran, nothing written


def test_api_save_follows_the_extension(tmp_path: Path) -> None:
    image = dif.load(backend="cpu")("a fox", steps=1, seed=2, width=32, height=32)
    image.save(tmp_path / "x.webp")
    assert read_image_metadata(tmp_path / "x.webp")["format"] == "WEBP"
    with pytest.raises(UsageError, match="'.bmp'"):
        image.save(tmp_path / "x.bmp")
    assert not (tmp_path / "x.bmp").exists()


def test_lossy_formats_stay_close_and_png_is_exact(tmp_path: Path) -> None:
    yy, xx = np.mgrid[0:64, 0:64]
    pixels = np.stack([xx * 4, yy * 4, (xx + yy) * 2], axis=-1).astype(np.uint8)  # smooth: JPEG's best case
    for ext in ("png", "jpg", "webp"):
        path = write_image(tmp_path / f"g.{ext}", pixels, parameters="p", metadata={"a": 1})
        with Image.open(path) as img:
            back = np.asarray(img.convert("RGB")).astype(np.int16)
        err = np.abs(back - pixels).mean()
        assert err == 0 if ext == "png" else err < 3, (ext, err)


def test_exif_block_layout() -> None:
    block = exif_bytes("x\ny", {"k": "é"})
    assert block.startswith(b"Exif\0\0MM\0\x2a")
    exif = Image.Exif()
    exif.load(block)
    assert exif[0x010E] == json.dumps({"k": "é"}, ensure_ascii=True)
    assert exif.get_ifd(0x8769)[0x9286] == b"UNICODE\0" + "x\ny".encode("utf-16-be")
    assert image_format("A.WebP") == "webp"
    with pytest.raises(UsageError, match="(?s)'.gif' is not an image format.*.png, .jpg, .jpeg, .webp"):
        image_format("a.gif")
    assert encode_image(np.zeros((4, 4, 3), np.uint8), "jpeg").startswith(b"\xff\xd8")
