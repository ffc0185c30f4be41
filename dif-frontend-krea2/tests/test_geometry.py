"""Geometry from the checkpoint: pixels per token = the VAE's scale factor x model_index's patch
size, read from the configs. A tiny checkpoint whose VAE has one resampling stage fewer (4x, so
8-pixel tokens) writes exactly the size it reports, through the CLI and `dif.load`."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

import dif
from dif.media import read_png_metadata
from dif.plugins import isolated_plugins, register_plugin
from dif.serialize.diftensor import save_tensors
from dif.testing.random_checkpoint import name_rng, param_shapes, random_weight
from dif_frontend_krea2 import DEFAULT_CHECKPOINT, plugin
from dif_frontend_krea2.config import QwenImageVaeConfig, load_configs
from dif_frontend_krea2.vae import build_vae_decoder


@pytest.fixture(scope="module")
def vae4x(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded checkpoint with a VAE of two resampling stages (scale factor 4), random weights."""
    root = tmp_path_factory.mktemp("krea2") / "vae4x"
    shutil.copytree(DEFAULT_CHECKPOINT, root)
    config_path = root / "vae" / "config.json"
    config = json.loads(config_path.read_text())
    config |= {"dim_mult": [1, 2, 4], "temperal_downsample": [False, True], "sample_size": 72}
    config_path.write_text(json.dumps(config))
    cfg = QwenImageVaeConfig.from_dict(config)
    shapes = param_shapes(build_vae_decoder(cfg, latent_h=2, latent_w=2))
    weights = {n: random_weight(name_rng(n), n, s).astype(np.float32) for n, s in shapes.items()}
    save_tensors(root / "vae" / "diffusion_pytorch_model.safetensors", weights, {"format": "pt"}, dif_metadata=False)
    return root


@pytest.fixture
def krea2_only() -> Iterator[None]:
    cpu = pytest.importorskip("dif_backend_cpu.plugin", reason="needs dif-backend-cpu")
    with isolated_plugins(""):
        register_plugin(cpu, "cpu")
        register_plugin(plugin, "krea2")
        yield


def test_pixels_per_token_comes_from_the_configs(vae4x: Path) -> None:
    assert load_configs(DEFAULT_CHECKPOINT).pixels_per_token == 16  # 8x VAE, 2x2 patch
    assert load_configs(vae4x).pixels_per_token == 8


def _png(path: Path) -> tuple[tuple[int, int], dict]:
    with Image.open(path) as im:
        size = im.size
        assert np.asarray(im.convert("RGB")).shape == (size[1], size[0], 3)
    return size, read_png_metadata(path)["dif"]


@pytest.mark.parametrize(("args", "size"), [(["-W", "20", "-H", "40"], (24, 40)), ([], (72, 72))])
def test_the_cli_writes_the_size_it_reports(
    vae4x: Path, tmp_path: Path, krea2_only: None, args: list[str], size: tuple[int, int]
) -> None:
    dif_tools = pytest.importorskip("dif_tools.cli", reason="needs dif-tools")
    out = tmp_path / "out.png"
    argv = ["krea2", "generate", "-p", "x", "-m", str(vae4x), *args, "--steps", "1", "--seed", "1", "-o", str(out)]
    result = CliRunner().invoke(dif_tools.build_cli(), [*argv, "--backend", "cpu", "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)["data"]
    written, meta = _png(out)
    assert written == size == (data["settings"]["width"], data["settings"]["height"]) == (meta["width"], meta["height"])
    if args:  # 20 is rounded up to the 8-pixel token, not to 16
        assert any("width 20 rounded up to 24" in w for w in data["warnings"])


def test_the_python_api_writes_the_size_it_reports(vae4x: Path, tmp_path: Path, krea2_only: None) -> None:
    result = dif.load(vae4x, backend="cpu")("x", steps=1, seed=2, width=40, height=24)
    assert result.image.size == (40, 24) == (result.settings["width"], result.settings["height"])
    result.save(tmp_path / "api.png")
    written, meta = _png(tmp_path / "api.png")
    assert written == (40, 24) and (meta["width"], meta["height"]) == (40, 24)
