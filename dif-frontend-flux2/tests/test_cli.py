"""`dif flux2 generate` / `dif flux2 info` on the embedded default checkpoint, through the real `dif` command."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.media import read_png_metadata
from dif.serialize.diftensor import save_tensors
from dif.telemetry import validate_document
from dif.weights import open_safetensors

cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli


def run(*args: str) -> object:
    result = CliRunner().invoke(cli, ["flux2", *args])
    return result


def test_generate_defaults_writes_png_with_metadata(tmp_path: Path) -> None:
    from PIL import Image

    out = tmp_path / "out.png"
    result = run("generate", "-p", "a red fox, watercolor", "--seed", "3", "-o", str(out))
    assert result.exit_code == 0, result.output
    assert f"wrote {out}" in result.stdout and "denoise" in result.stdout and "peak memory" in result.stdout
    with Image.open(out) as im:
        im.verify()
    meta = read_png_metadata(out)
    assert meta["size"] == (256, 256) and meta["mode"] == "RGB"  # the embedded model's native size
    params = meta["parameters"].split("\n")
    assert params[0] == "a red fox, watercolor"
    assert params[1].startswith("Steps: 4, Sampler: Euler, ") and "Seed: 3, Size: 256x256" in params[1]
    dif_meta = meta["dif"]
    assert dif_meta["prompt"] == "a red fox, watercolor" and dif_meta["seed"] == 3
    assert dif_meta["steps"] == 4 and dif_meta["cfg"] is False and dif_meta["frontend"] == "flux2"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.png"]  # no temp files left


def test_generate_json_and_reproducibility(tmp_path: Path) -> None:
    a, b = tmp_path / "a.png", tmp_path / "b.png"
    lat = tmp_path / "lat.safetensors"
    common = ["-p", "x", "-W", "48", "-H", "32", "--seed", "11", "--steps", "2"]
    result = run("generate", *common, "-o", str(a), "--save-latents", str(lat), "--json")
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)  # stdout is exactly one JSON document
    validate_document(doc)
    assert doc["kind"] == "flux2.generate"
    data = doc["data"]
    assert data["output"] == str(a) and data["settings"]["width"] == 48 and data["settings"]["height"] == 32
    assert set(data["timings_s"]) == {"load", "encode", "denoise", "decode", "save"}
    assert data["steps_per_s"] > 0 and data["peak_rss_bytes"] > 0
    assert [e["name"] for e in doc["events"]] == [f"stage.{k}" for k in ("load", "encode", "denoise", "decode", "save")]
    saved = open_safetensors(lat)
    assert saved.info("latents").shape == (1, 6, 128) and saved.info("noise").shape == (1, 6, 128)

    # the same seed reproduces the image; the saved noise reproduces it too (exact parity input)
    assert run("generate", *common, "-o", str(b)).exit_code == 0
    from PIL import Image

    with Image.open(a) as ia, Image.open(b) as ib:
        np.testing.assert_array_equal(np.asarray(ia), np.asarray(ib))
    noise_file = tmp_path / "noise.safetensors"
    save_tensors(noise_file, {"noise": np.array(saved["noise"]).astype(np.float32)}, dif_metadata=False)
    c = tmp_path / "c.png"
    result = run(
        "generate", "-p", "x", "-W", "48", "-H", "32", "--steps", "2", "--init-noise", str(noise_file), "-o", str(c)
    )
    assert result.exit_code == 0, result.output
    with Image.open(a) as ia, Image.open(c) as ic:
        np.testing.assert_array_equal(np.asarray(ia), np.asarray(ic))
    assert read_png_metadata(c)["dif"]["seed"] is None


@pytest.mark.parametrize(
    "flag, value, says", [("-W", "1000", "multiple of 16"), ("-H", "0", "x>=1"), ("-W", "-16", "x>=1")]
)
def test_bad_size_is_a_usage_error(tmp_path: Path, flag: str, value: str, says: str) -> None:
    """Positive sizes are the option's rule; the multiple is the checkpoint's token size (16 here)."""
    out = tmp_path / "never.png"
    result = run("generate", "-p", "x", flag, value, "-o", str(out))
    assert result.exit_code == 2
    assert says in result.output and flag in result.output
    assert list(tmp_path.iterdir()) == []


def test_missing_output_folder_fails_before_work(tmp_path: Path) -> None:
    result = run("generate", "-p", "x", "-o", str(tmp_path / "no" / "such" / "x.png"))
    assert result.exit_code == 2 and "does not exist" in result.output


def test_distilled_guidance_warns(tmp_path: Path) -> None:
    result = run("generate", "-p", "x", "-W", "32", "-H", "32", "--guidance", "3.5", "-o", str(tmp_path / "w.png"))
    assert result.exit_code == 0, result.output
    assert "warning: guidance 3.5 is ignored" in result.stderr
    assert read_png_metadata(tmp_path / "w.png")["dif"]["cfg"] is False


def test_bad_init_noise_shape(tmp_path: Path) -> None:
    noise = tmp_path / "n.safetensors"
    save_tensors(noise, {"noise": np.zeros((1, 128, 3, 3), np.float32)}, dif_metadata=False)
    result = run(
        "generate", "-p", "x", "-W", "32", "-H", "32", "--init-noise", str(noise), "-o", str(tmp_path / "o.png")
    )
    assert result.exit_code == 1
    assert "initial noise has shape [1, 128, 3, 3]" in result.output and "[1, 128, 2, 2]" in result.output
    assert not (tmp_path / "o.png").exists()


def test_info_human_and_json() -> None:
    result = run("info")
    assert result.exit_code == 0, result.output
    assert "FLUX.2 [klein] distilled, diffusers layout" in result.stdout
    assert "defaults: 4 steps, no CFG, 256x256, f32" in result.stdout
    result = run("info", "--json")
    doc = json.loads(result.stdout)
    validate_document(doc)
    data = doc["data"]
    assert data["distilled"] is True and data["layout"] == "diffusers"
    assert data["text_encoder"]["layers"] == 28 and data["transformer"]["tensors"] > 0
    assert data["tokenizer"] is not None


def test_dif_help_lists_flux2() -> None:
    result = CliRunner().invoke(cli, ["--help"])
    assert result.exit_code == 0 and "flux2" in result.output
    result = run("generate", "--help")
    assert "--init-noise" in result.output and "--save-latents" in result.output


def test_backends_agree_and_unknown_backend_is_named(tmp_path: Path) -> None:
    from PIL import Image

    common = ["-p", "x", "-W", "32", "-H", "32", "--seed", "5", "--steps", "1", "--dtype", "bf16"]
    a, b = tmp_path / "cpu.png", tmp_path / "interp.png"
    assert run("generate", *common, "--backend", "cpu", "-o", str(a)).exit_code == 0
    result = run("generate", *common, "--backend", "interp", "-o", str(b))
    assert result.exit_code == 0, result.output
    with Image.open(a) as ia, Image.open(b) as ib:
        np.testing.assert_array_equal(np.asarray(ia), np.asarray(ib))
    result = run("generate", *common, "--backend", "nosuch", "-o", str(tmp_path / "n.png"))
    assert result.exit_code == 1 and "unknown backend 'nosuch'" in result.output
    assert not (tmp_path / "n.png").exists()


@pytest.mark.parametrize("variant", ["klein-4b", "klein-9b", "klein-base-4b", "klein-base-9b"])
def test_info_variant_shows_the_published_architecture(variant: str) -> None:
    from dif_frontend_flux2.configs import published

    folder = published(variant)
    transformer = json.loads((folder / "transformer" / "config.json").read_text())
    text = json.loads((folder / "text_encoder" / "config.json").read_text())
    distilled = json.loads((folder / "model_index.json").read_text()).get("is_distilled", False)
    result = run("info", "--variant", variant, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)["data"]
    t = data["transformer"]
    assert (t["double_blocks"], t["single_blocks"], t["heads"], t["head_dim"], t["text_dim"]) == (
        transformer["num_layers"],
        transformer["num_single_layers"],
        transformer["num_attention_heads"],
        transformer["attention_head_dim"],
        transformer["joint_attention_dim"],
    )
    assert data["text_encoder"]["layers"] == text["num_hidden_layers"] and data["distilled"] is distilled
    assert data["defaults"]["steps"] == (4 if distilled else 50) and data["vae"]["pixels_per_token"] == 16
    human = run("info", "--variant", variant).stdout
    assert f"width {transformer['num_attention_heads'] * transformer['attention_head_dim']}" in human
    assert "published config, no weights" in human
    assert run("info", "--variant", "klein-99b").exit_code == 2
