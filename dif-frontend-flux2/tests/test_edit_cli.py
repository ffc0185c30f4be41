"""Reference images, img2img, inpainting and batches through `dif flux2 generate` on the embedded
checkpoint: the files written (one per image of a batch, named by -o's %d or NAME-i), their metadata,
and bad input refused with one error line, exit != 0 and nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from dif.media import read_png_metadata

cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
SMALL = ["--steps", "2", "--seed", "3"]


def run(*args: str) -> object:
    return CliRunner().invoke(cli, ["flux2", "generate", "-p", "a fox", *SMALL, *args])


def picture(path: Path, width: int, height: int, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB").save(path)
    return path


def test_reference_images_set_the_size_and_are_recorded(tmp_path: Path) -> None:
    a, b = picture(tmp_path / "a.png", 80, 64), picture(tmp_path / "b.png", 64, 96, 1)
    out = tmp_path / "edit.png"
    result = run("-r", str(a), "--ref-image", str(b), "-o", str(out), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.output)
    assert doc["data"]["settings"]["reference_images"] == [str(a), str(b)]
    meta = read_png_metadata(out)
    assert meta["size"] == (80, 64)  # the first reference's size when -W/-H are left out
    assert meta["dif"]["reference_images"] == [str(a), str(b)]


def test_a_batch_writes_one_file_per_image_with_consecutive_seeds(tmp_path: Path) -> None:
    result = run("-W", "32", "-H", "32", "-b", "3", "-o", str(tmp_path / "cat-%d.png"), "--json")
    assert result.exit_code == 0, result.output
    files = [tmp_path / f"cat-{i}.png" for i in range(3)]
    assert [read_png_metadata(f)["dif"]["seed"] for f in files] == [3, 4, 5]
    assert [b["output"] for b in json.loads(result.output)["data"]["batch"]] == [str(f) for f in files]
    pixels = [np.asarray(Image.open(f)) for f in files]
    assert not np.array_equal(pixels[0], pixels[1])
    plain = run("-W", "32", "-H", "32", "-b", "2", "-o", str(tmp_path / "dog.png"))
    assert plain.exit_code == 0, plain.output
    assert (tmp_path / "dog-0.png").is_file() and (tmp_path / "dog-1.png").is_file()
    assert not (tmp_path / "dog.png").exists() and "wrote " + str(tmp_path / "dog-1.png") in plain.output


def test_img2img_and_inpainting_run_at_the_init_image_size(tmp_path: Path) -> None:
    source = picture(tmp_path / "src.png", 50, 40)  # cut to 48x32
    mask = tmp_path / "mask.png"
    Image.new("L", (50, 40), 255).save(mask)
    out = tmp_path / "i2i.png"
    result = run("-i", str(source), "--strength", "0.5", "--mask", str(mask), "-o", str(out))
    assert result.exit_code == 0, result.output
    meta = read_png_metadata(out)
    assert meta["size"] == (48, 32)
    assert (meta["dif"]["strength"], meta["dif"]["denoised_steps"], meta["dif"]["steps"]) == (0.5, 1, 2)


@pytest.mark.parametrize(
    "args, message",
    [
        (["-r", "{bad}"], "reference image {bad} cannot be decoded as an image"),
        (["-r", "{missing}"], "reference image {missing}: no such file"),
        (["-r", "{a}"] * 5, "5 reference images given; this model takes at most 4"),
        (["-i", "{a}", "--strength", "0"], "strength 0.0 is outside (0, 1]"),
        (["-i", "{a}", "--strength", "1.5"], "strength 1.5 is outside (0, 1]"),
        (["--strength", "0.5"], "--strength needs an init image"),
        (["-i", "{a}", "--mask", "{small}"], "mask {small} is 64x64 but init image {a} is 80x64"),
        (["-i", "{a}", "-W", "32"], "width 32 differs from the init image's 80"),
        (["-i", "{a}", "-r", "{a}"], "is not supported"),
        (["-b", "0"], "batch 0 is outside 1..64"),
        (
            ["-i", "{a}", "--mask", "{a}", "--sampling-method", "heun"],
            "--mask (inpainting) runs with the euler sampler",
        ),
        (["--kv-cache"], "--kv-cache caches the reference images' keys and values"),
        (["-r", "{tiny}"], "reference image {tiny} is 32x80; both sides must be at least 64 pixels"),
    ],
)
def test_bad_image_input_is_one_error_and_nothing_is_written(tmp_path: Path, args: list[str], message: str) -> None:
    names = {
        "a": picture(tmp_path / "a.png", 80, 64),
        "small": picture(tmp_path / "small.png", 64, 64),
        "tiny": picture(tmp_path / "tiny.png", 32, 80),
        "bad": tmp_path / "bad.png",
        "missing": tmp_path / "missing.png",
    }
    names["bad"].write_bytes(b"\x89PNG\r\n\x1a\n not really a png")
    out = tmp_path / "out.png"
    result = run(*(a.format(**names) for a in args), "-o", str(out))
    assert result.exit_code != 0
    assert message.format(**names) in result.output, result.output
    assert "Traceback" not in result.output
    assert not out.exists() and not list(tmp_path.glob("out*"))


def test_the_python_api_takes_images_and_returns_a_list_for_a_batch(tmp_path: Path) -> None:
    import dif

    pipe = dif.load()
    ref = Image.fromarray(np.random.default_rng(4).integers(0, 256, (64, 96, 3), dtype=np.uint8), "RGB")
    images = pipe("a fox", steps=2, seed=9, ref_images=[ref], batch=2)
    assert isinstance(images, list) and len(images) == 2
    assert [im.settings["seed"] for im in images] == [9, 10]
    assert images[0].image.size == (96, 64) and images[0].settings["reference_images"] == ["<reference image 1>"]
    one = pipe("a fox", steps=2, seed=10, ref_images=[ref])
    assert not isinstance(one, list)
    np.testing.assert_array_equal(one.run.noise, images[1].run.noise)
    np.testing.assert_allclose(one.run.latents, images[1].run.latents, rtol=0, atol=1e-4)
    with pytest.raises(dif.errors.UsageError, match="strength 2 is outside"):
        pipe("a fox", init_image=ref, strength=2)


def test_krea2_refuses_reference_and_init_images(tmp_path: Path) -> None:
    ref = picture(tmp_path / "a.png", 64, 64)
    out = tmp_path / "k.png"
    for args, message in (
        (["-r", str(ref)], "this model takes no reference images"),
        (["-i", str(ref)], "this model has no img2img"),
    ):
        result = CliRunner().invoke(cli, ["krea2", "generate", "-p", "x", *SMALL, *args, "-o", str(out)])
        assert result.exit_code != 0 and message in result.output, result.output
        assert not out.exists()
