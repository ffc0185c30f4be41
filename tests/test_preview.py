"""--preview FILE [--preview-every N]: a latent -> RGB preview written while sampling, with the
projection fitted by least squares against the checkpoint's VAE decoder (dif.preview). The packaged
projections of the embedded checkpoints are what perf/fit_preview.py computes (refitted here), apply only
to that VAE file, and another checkpoint is fitted at load."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import dif
from dif.preview import (
    PROJECTION_FILE,
    PreviewProjection,
    PreviewWriter,
    fit_projection,
    latent_channels,
    packaged_projection,
    preview_on_step,
    preview_pixels,
    projection_for,
)
from dif_tools.cli import build_cli

ARGS = ["flux2", "generate", "-p", "a fox", "-W", "64", "-H", "48", "--backend", "cpu"]


def test_cli_writes_the_preview_while_sampling(tmp_path: Path) -> None:
    out, preview = tmp_path / "fox.png", tmp_path / "preview.webp"
    args = [*ARGS, "--steps", "3", "--preview", str(preview), "--preview-every", "2", "-o", str(out)]
    result = CliRunner().invoke(build_cli(), args)
    assert result.exit_code == 0, result.output
    with Image.open(preview) as image:  # 3 x 4 tokens, upscaled x64 (nearest) to >= 256 px
        assert image.format == "WEBP" and image.size == (256, 192)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fox.png", "preview.webp"]  # no temp file left


def test_preview_is_refused_before_anything_runs(tmp_path: Path) -> None:
    args = [*ARGS, "--preview", str(tmp_path / "p.gif"), "-o", str(tmp_path / "x.png")]
    result = CliRunner().invoke(build_cli(), args)
    assert result.exit_code != 0 and "'.gif'" in result.output and list(tmp_path.iterdir()) == []
    args = [*ARGS, "--preview", str(tmp_path / "nope" / "p.png"), "-o", str(tmp_path / "x.png")]
    result = CliRunner().invoke(build_cli(), args)
    assert result.exit_code != 0 and "does not exist" in result.output and list(tmp_path.iterdir()) == []


def test_writer_cadence_and_pixels(tmp_path: Path) -> None:
    projection = PreviewProjection(np.eye(4, 3, dtype=np.float32), np.zeros(3, np.float32), "test", 1.0)
    writer = PreviewWriter(tmp_path / "p.png", 2, projection, (2, 3))
    latents = np.zeros((1, 6, 4), np.float32)
    latents[0, :, 0] = np.linspace(-1, 1, 6)  # red ramp over the tokens, row-major
    for step in range(1, 6):
        writer(step, 5, latents)
    assert writer.written == 3  # steps 2, 4 and the last
    pixels = preview_pixels(projection, latents, 2, 3)
    assert pixels.shape == (172, 258, 3)  # x86: the longer side >= 256
    red = pixels[::86, ::86, 0]
    np.testing.assert_array_equal(red, np.round((np.linspace(-1, 1, 6).reshape(2, 3) + 1) * 127.5).astype(np.uint8))
    assert (pixels[..., 1:] == 128).all()  # zero -> mid grey


@pytest.mark.parametrize("family", ["flux2", "krea2"])
def test_packaged_projection_is_what_the_script_fits(family: str) -> None:
    pipe = dif.load(family=family, backend="cpu", dtype="f32").pipeline
    packaged = projection_for(pipe)
    assert "perf/fit_preview.py" in packaged.source and packaged.channels == latent_channels(pipe)
    refit = fit_projection(pipe.decode, packaged.channels, np.dtype(np.float32), source="again", samples=4)
    np.testing.assert_allclose(refit.weight, packaged.weight, atol=1e-5)
    np.testing.assert_allclose(refit.bias, packaged.bias, atol=1e-5)
    assert refit.r2 == pytest.approx(packaged.r2, abs=1e-3) and packaged.r2 > 0.1  # a weak but real fit


def test_a_fit_at_load_drops_its_decoder_program(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint that is not the embedded one (a copy: its path differs, so does nothing else) is fitted
    with its own VAE; the fit's 32x32-token decoder is discarded again, the run's programs stay."""
    import shutil

    from dif.program_cache import ProgramCache
    from dif_frontend_flux2 import DEFAULT_CHECKPOINT

    copy = tmp_path / "klein"
    shutil.copytree(DEFAULT_CHECKPOINT, copy)
    vae = copy / "vae" / "diffusion_pytorch_model.safetensors"
    vae.write_bytes(vae.read_bytes() + b" ")  # other bytes: the packaged fit does not apply (safetensors ignores it)
    pipe = dif.load(copy, backend="cpu").pipeline
    pipe.prepare_all(64, 48)  # the run's programs, as its load stage makes them
    before = pipe._programs.keys()
    discarded: list[object] = []
    keep = ProgramCache.discard
    monkeypatch.setattr(ProgramCache, "discard", lambda self, key: (discarded.append(key), keep(self, key))[1])
    projection = projection_for(pipe)
    assert "fitted at load" in projection.source and projection.channels == 128
    assert discarded and pipe._programs.keys() == before  # the fit's decoder came and went


def test_another_vae_is_fitted_at_load(tmp_path: Path) -> None:
    import dif_frontend_flux2

    package = Path(dif_frontend_flux2.__file__).parent
    assert (package / PROJECTION_FILE).is_file()
    other = tmp_path / "vae.safetensors"
    other.write_bytes(b"not the same weights")
    assert packaged_projection(package, other) is None
    data = json.loads((package / PROJECTION_FILE).read_text())
    assert data["vae_bytes"] > 0 and len(data["vae_sha256"]) == 64

    class Stub:  # a pipeline whose checkpoint is not the embedded one: the projection is fitted now
        __module__ = "dif_frontend_flux2.pipeline"  # the frontend whose packaged projection does not apply
        dtype = dif.load(backend="cpu").pipeline.dtype
        checkpoint = type("C", (), {"root": tmp_path})()

        def __init__(self) -> None:
            self.calls = 0

        def decode(self, latents: np.ndarray, gh: int, gw: int) -> np.ndarray:
            self.calls += 1  # a "VAE" that is exactly linear: RGB = the first 3 channels, per 2x2-pixel patch
            rgb = latents[0, :, :3].reshape(gh, gw, 3).clip(-1, 1)
            return np.round((rgb.repeat(2, 0).repeat(2, 1) + 1) * 127.5).astype(np.uint8)

        def initial_noise(self, _req: object, gh: int, gw: int) -> np.ndarray:
            return np.zeros((1, gh * gw, 8), np.float32)

    stub = Stub()
    projection = projection_for(stub)
    assert stub.calls == 2 and "fitted at load" in projection.source and projection.channels == 8
    assert projection.r2 > 0.8  # a linear decoder is recovered (up to clipping and the ridge term)


def test_python_api_preview(tmp_path: Path) -> None:
    pipe = dif.load(backend="cpu")
    writer = preview_on_step(pipe, tmp_path / "live.jpg", width=64, height=32, every=1)
    pipe("a fox", steps=2, seed=1, width=64, height=32, on_step=writer)
    assert writer.written == 2 and writer.grid == (2, 4)
    with Image.open(tmp_path / "live.jpg") as image:
        assert image.size == (256, 128)
    with pytest.raises(dif.errors.UsageError, match="'.tga'"):
        preview_on_step(pipe, tmp_path / "live.tga")
