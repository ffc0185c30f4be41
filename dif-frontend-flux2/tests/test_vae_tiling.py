"""Tiled VAE decoding (`dif.kit.tiling`, `--vae-tiling`) against diffusers' own tiled decode
(`AutoencoderKLFlux2.enable_tiling()`), fp32: the tile decoder at a tiny config (non-square latent, edge
tiles of three other shapes), and the whole embedded klein pipeline with tiling on; `auto` tiles exactly when
the budget cannot hold the whole decode, with the same image; an unknown mode is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import dif
from dif.errors import UsageError
from dif.interp import interpret
from dif.kit.tiling import TileLayout, decode_tiled
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_frontend_flux2.config import Flux2VaeConfig
from dif_frontend_flux2.vae import build_vae_decoder

from .test_oracle_vae import TINY as WHOLE_TINY
from .test_oracle_vae import _pipeline_unpack

TINY = {**WHOLE_TINY, "sample_size": 16}  # tiles of 8 latent pixels, starting every 6, blended over 4 output pixels


@pytest.mark.oracle
def test_tiled_decode_matches_diffusers(torch, tmp_path, randomize, load_weights, rel_l2_fn):  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers", reason="oracle tests need diffusers")
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLFlux2(**TINY).eval()
    randomize(vae, torch, seed=3)
    vae.save_pretrained(tmp_path)
    cfg = Flux2VaeConfig.from_json(tmp_path / "config.json")
    layout = TileLayout(cfg.tile_latent, cfg.scale_factor)
    latent = np.random.default_rng(0).standard_normal((1, 4, 18, 26)).astype(np.float32)
    assert layout.shapes(18, 26) == [(6, 2), (6, 8), (8, 2), (8, 8)]
    vae.enable_tiling()
    with torch.no_grad():
        expected = vae.decode(torch.from_numpy(latent), return_dict=False)[0].numpy()
    weights = load_weights(tmp_path)
    programs = {shape: build_vae_decoder(cfg, batch=1, latent_h=shape[0], latent_w=shape[1]) for shape in
                layout.shapes(18, 26)}  # fmt: skip

    def decode(tile: np.ndarray) -> np.ndarray:
        program = programs[tile.shape[2:]]
        return interpret(program, {"latent": tile}, weights)[program.outputs[0]]

    got = decode_tiled(latent, layout, decode)
    assert got.shape == expected.shape == (1, 3, 36, 52)
    err = rel_l2_fn(got, expected)
    assert err <= 1e-5, f"rel-L2 {err:.3e}"
    whole = interpret(build_vae_decoder(cfg, batch=1, latent_h=18, latent_w=26), {"latent": latent}, weights)
    assert rel_l2_fn(next(iter(whole.values())), got) > 1e-3  # the tiles really were blended, not one decode


WIDTH, HEIGHT = 640, 576  # the embedded VAE tiles at 512 pixels: 2 x 2 tiles, the right and bottom ones narrower


@pytest.mark.oracle
def test_the_pipeline_decodes_tiled_as_diffusers_does(torch) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers", reason="oracle tests need diffusers")
    pipe = dif.load(backend="cpu", vae_tiling="on")
    result = pipe("a fox", steps=1, seed=5, width=WIDTH, height=HEIGHT)
    assert "tiled" in result.settings["vae_decode"]
    vae = diffusers.AutoencoderKLFlux2.from_pretrained(DEFAULT_CHECKPOINT / "vae").eval()
    vae.enable_tiling()
    ppt = pipe.pipeline.pixels_per_token
    with torch.no_grad():
        latent = _pipeline_unpack(torch, vae, result.run.latents.astype(np.float32), HEIGHT // ppt, WIDTH // ppt)
        image = vae.decode(latent, return_dict=False)[0][0].numpy()
    want = np.round(np.clip((image.transpose(1, 2, 0) + 1) * 127.5, 0, 255)).astype(np.int16)
    got = np.asarray(result.image).astype(np.int16)
    assert got.shape == want.shape == (HEIGHT, WIDTH, 3)
    assert np.abs(got - want).max() <= 1  # fp32 on both sides: at most a rounding step apart


def test_auto_tiles_only_when_the_whole_decode_does_not_fit(tmp_path: Path) -> None:
    whole = dif.load(backend="cpu", vae_tiling="off")
    plain = whole("a fox", steps=1, seed=5, width=WIDTH, height=HEIGHT)
    assert "vae_decode" not in plain.settings
    programs = whole.pipeline.memory_report()["programs"]
    decoder = programs["flux2_vae_decoder"]["min_memory_bytes"]
    tiled = dif.load(backend="cpu", vae_tiling="on")
    on = tiled("a fox", steps=1, seed=5, width=WIDTH, height=HEIGHT)
    tiles = [p["min_memory_bytes"] for name, p in tiled.pipeline.memory_report()["programs"].items()
             if name.startswith("flux2_vae_decoder")]  # fmt: skip
    assert len(tiles) == 4 and max(tiles) < decoder
    auto = dif.load(backend="cpu", vram_budget=decoder - 1)
    capped = auto("a fox", steps=1, seed=5, width=WIDTH, height=HEIGHT)
    assert capped.settings["vae_decode"] == on.settings["vae_decode"]
    np.testing.assert_array_equal(np.asarray(capped.image), np.asarray(on.image))
    roomy = dif.load(backend="cpu")  # auto with room: the whole decode, the unbudgeted image
    np.testing.assert_array_equal(np.asarray(roomy("a fox", steps=1, seed=5, width=WIDTH, height=HEIGHT).image),
                                  np.asarray(plain.image))  # fmt: skip
    with pytest.raises(UsageError, match="vae tiling 'sometimes' is not one of auto, on, off"):
        dif.load(backend="cpu", vae_tiling="sometimes")
