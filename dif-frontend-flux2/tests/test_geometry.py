"""Geometry from the checkpoint: pixels per token = the VAE's scale factor x its 2x2 latent patch x
the transformer's patch size, read from the configs. A tiny checkpoint whose VAE has one block
fewer (4x, so 8-pixel tokens) writes exactly the size it reports, through the CLI and `dif.load`."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import dif
from dif.media import read_png_metadata
from dif.serialize.diftensor import save_tensors
from dif.testing.random_checkpoint import name_rng, param_shapes, random_weight
from dif_frontend_flux2 import DEFAULT_CHECKPOINT
from dif_frontend_flux2.config import Flux2VaeConfig, load_configs
from dif_frontend_flux2.vae import build_vae_decoder

cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli


@pytest.fixture(scope="module")
def vae4x(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded checkpoint with a three-block VAE (scale factor 4) and fresh random VAE weights."""
    root = tmp_path_factory.mktemp("flux2") / "vae4x"
    shutil.copytree(DEFAULT_CHECKPOINT, root)
    config_path = root / "vae" / "config.json"
    config = json.loads(config_path.read_text())
    config |= {
        "block_out_channels": [8, 8, 8],
        "down_block_types": ["DownEncoderBlock2D"] * 3,
        "up_block_types": ["UpDecoderBlock2D"] * 3,
        "sample_size": 72,  # a multiple of 8, not of 16
    }
    config_path.write_text(json.dumps(config))
    cfg = Flux2VaeConfig.from_dict(config)
    shapes = param_shapes(build_vae_decoder(cfg, batch=1, latent_h=2, latent_w=2, from_packed=True))
    weights = {n: random_weight(name_rng(n), n, s).astype(np.float32) for n, s in shapes.items()}
    weights["bn.running_var"] = np.abs(weights["bn.running_var"]) + 0.5
    save_tensors(root / "vae" / "diffusion_pytorch_model.safetensors", weights, {"format": "pt"}, dif_metadata=False)
    return root


def test_pixels_per_token_comes_from_the_configs(vae4x: Path) -> None:
    assert load_configs(DEFAULT_CHECKPOINT).pixels_per_token == 16  # 8x VAE, 2x2 patch, transformer patch 1
    assert load_configs(vae4x).pixels_per_token == 8


def _png(path: Path) -> tuple[tuple[int, int], dict]:
    with Image.open(path) as im:
        size = im.size
        assert np.asarray(im.convert("RGB")).shape == (size[1], size[0], 3)
    return size, read_png_metadata(path)["dif"]


@pytest.mark.parametrize(("args", "size"), [(["-W", "24", "-H", "40"], (24, 40)), ([], (72, 72))])
def test_the_cli_writes_the_size_it_reports(
    vae4x: Path, tmp_path: Path, args: list[str], size: tuple[int, int]
) -> None:
    out = tmp_path / "out.png"
    result = CliRunner().invoke(
        cli,
        [
            "flux2",
            "generate",
            "-p",
            "x",
            "-m",
            str(vae4x),
            *args,
            "--steps",
            "1",
            "--seed",
            "1",
            "-o",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    reported = json.loads(result.stdout)["data"]["settings"]
    written, meta = _png(out)
    assert written == size == (reported["width"], reported["height"]) == (meta["width"], meta["height"])
    bad = CliRunner().invoke(cli, ["flux2", "generate", "-p", "x", "-m", str(vae4x), "-W", "20", "-o", str(out)])
    assert bad.exit_code == 2 and "not a positive multiple of 8" in bad.output


def test_the_python_api_writes_the_size_it_reports(vae4x: Path, tmp_path: Path) -> None:
    result = dif.load(vae4x)("x", steps=1, seed=2, width=40, height=24)
    assert result.image.size == (40, 24) == (result.settings["width"], result.settings["height"])
    result.save(tmp_path / "api.png")
    written, meta = _png(tmp_path / "api.png")
    assert written == (40, 24) and (meta["width"], meta["height"]) == (40, 24)
