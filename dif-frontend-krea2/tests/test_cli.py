"""`dif krea2 generate` / `dif krea2 info` through the real `dif` command, with this frontend and the
CPU backend registered in-process, on the embedded tiny checkpoint (no torch needed)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

from dif.media import read_png_metadata
from dif.plugins import isolated_plugins, register_plugin
from dif.serialize.diftensor import save_tensors
from dif.telemetry import validate_document
from dif.weights import open_safetensors
from dif_frontend_krea2 import DEFAULT_CHECKPOINT, plugin


@pytest.fixture
def dif_cli() -> Iterator[Callable[..., Any]]:
    cpu = pytest.importorskip("dif_backend_cpu.plugin", reason="needs dif-backend-cpu")
    dif_tools = pytest.importorskip("dif_tools.cli", reason="needs dif-tools")
    with isolated_plugins(""):
        register_plugin(cpu, "cpu")
        register_plugin(plugin, "krea2")
        runner = CliRunner()

        def invoke(*args: str, ok: bool = True) -> Any:
            result = runner.invoke(dif_tools.build_cli(), list(args))
            if ok:
                assert result.exit_code == 0, result.output
            return result

        yield invoke


def test_generate_writes_png_with_metadata(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    out, lat = tmp_path / "fox.png", tmp_path / "lat.safetensors"
    res = dif_cli(
        "krea2",
        "generate",
        "-p",
        "a red fox",
        "-W",
        "40",
        "-H",
        "32",
        "--steps",
        "2",
        "--seed",
        "5",
        "--dtype",
        "f32",
        "--backend",
        "cpu",
        "-o",
        str(out),
        "--save-latents",
        str(lat),
        "--json",
    )
    doc = json.loads(res.stdout)
    validate_document(doc)
    s = doc["data"]["settings"]
    assert (s["width"], s["height"], s["steps"], s["seed"], s["cfg"], s["backend"]) == (48, 32, 2, 5, False, "cpu")
    assert s["mu"] == pytest.approx(1.15) and s["variant"] == "turbo"
    assert any("width 40 rounded up to 48" in w for w in doc["data"]["warnings"])
    meta = read_png_metadata(out)
    assert "a red fox" in meta["parameters"] and "Steps: 2" in meta["parameters"] and "Seed: 5" in meta["parameters"]
    assert meta["dif"]["frontend"] == "krea2" and meta["dif"]["width"] == 48
    from PIL import Image

    with Image.open(out) as im:
        assert im.size == (48, 32) and im.mode == "RGB"
    saved = open_safetensors(lat)
    assert saved["latents"].shape == (1, 6, 64) and saved["noise"].shape == (1, 6, 64)

    # the saved noise fed back reproduces the latents exactly (the parity hook for other tools)
    noise_file = tmp_path / "noise.safetensors"
    save_tensors(noise_file, {"noise": np.array(saved["noise"])}, dif_metadata=False)
    again = dif_cli(
        "krea2",
        "generate",
        "-p",
        "a red fox",
        "-W",
        "48",
        "-H",
        "32",
        "--steps",
        "2",
        "--dtype",
        "f32",
        "--backend",
        "cpu",
        "--init-noise",
        str(noise_file),
        "-o",
        str(tmp_path / "b.png"),
        "--save-latents",
        str(tmp_path / "b.safetensors"),
        "--json",
    )
    assert json.loads(again.stdout)["data"]["settings"]["init_noise"] is True
    np.testing.assert_array_equal(open_safetensors(tmp_path / "b.safetensors")["latents"], saved["latents"])


def test_generate_with_cfg_and_errors(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    res = dif_cli(
        "krea2",
        "generate",
        "-p",
        "a fox",
        "-n",
        "blurry",
        "-W",
        "32",
        "-H",
        "32",
        "--steps",
        "1",
        "--guidance",
        "2.5",
        "--dtype",
        "f32",
        "--backend",
        "interp",
        "-o",
        str(tmp_path / "c.png"),
    )
    assert "CFG 2.5" in res.stdout and "distilled for guidance 0" in res.output
    bad = dif_cli("krea2", "generate", "-p", "x", "-o", str(tmp_path / "no" / "x.png"), ok=False)
    assert bad.exit_code != 0 and "does not exist" in bad.output
    bad = dif_cli("krea2", "info", str(tmp_path), ok=False)
    assert bad.exit_code == 1 and "not a Krea 2 diffusers folder" in bad.output


def test_info(dif_cli: Callable[..., Any]) -> None:
    doc = json.loads(dif_cli("krea2", "info", "--json").stdout)
    validate_document(doc)
    d = doc["data"]
    assert d["variant"] == "turbo" and d["defaults"]["steps"] == 8 and d["defaults"]["guidance"] == 0.0
    assert d["text_encoder"]["taps"] == [2, 5, 8, 11, 14, 17, 20, 23, 26, 29, 32, 35]
    assert d["path"] == str(DEFAULT_CHECKPOINT)
    text = dif_cli("krea2", "info").stdout
    assert "Krea 2 Turbo" in text and "8 steps, no CFG, mu 1.15" in text


@pytest.mark.parametrize("variant", ["raw", "turbo"])
def test_info_variant_shows_the_published_architecture(dif_cli: Callable[..., Any], variant: str) -> None:
    from dif_frontend_krea2.configs import published

    transformer = json.loads((published(variant) / "transformer" / "config.json").read_text())
    d = json.loads(dif_cli("krea2", "info", "--variant", variant, "--json").stdout)["data"]
    t = d["transformer"]
    assert (t["blocks"], t["heads"], t["kv_heads"], t["head_dim"]) == (
        transformer["num_layers"],
        transformer["num_attention_heads"],
        transformer["num_key_value_heads"],
        transformer["attention_head_dim"],
    )
    assert d["variant"] == variant and d["defaults"]["steps"] == {"turbo": 8, "raw": 28}[variant]
    assert d["vae"]["pixels_per_token"] == 16 and "tensors" not in t
    text = dif_cli("krea2", "info", "--variant", variant).stdout
    assert ("Turbo" if variant == "turbo" else "Raw") in text and "published config, no weights" in text
