"""`dif flux2 generate --lora FILE[:SCALE]` and `dif.load(..., lora=...)` on the embedded checkpoint:
the adapter changes the image, scale 0 does not, bad adapters are refused before anything is written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.media import read_png_metadata
from dif.serialize.diftensor import save_tensors
from dif.weights import open_component
from dif_frontend_flux2 import DEFAULT_CHECKPOINT

cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli

COMMON = ["-p", "a fox", "-W", "32", "-H", "32", "--seed", "5", "--steps", "2"]


def make_lora(path: Path, *, rank: int = 2, seed: int = 0) -> Path:
    """A kohya-style LoRA on every double-block qkv and single-block linear1 of the embedded model."""
    source = open_component(DEFAULT_CHECKPOINT / "transformer")
    rng = np.random.default_rng(seed)
    t: dict[str, np.ndarray] = {}
    for name in source.names():
        if name.endswith(("attn.to_qkv_mlp_proj.weight", "attn.to_out.0.weight")):
            out, inp = source.info(name).shape
            key = "lora_unet_" + name[: -len(".weight")].replace(".", "_")
            t[f"{key}.lora_down.weight"] = rng.standard_normal((rank, inp)).astype(np.float32)
            t[f"{key}.lora_up.weight"] = rng.standard_normal((out, rank)).astype(np.float32)
            t[f"{key}.alpha"] = np.array(float(rank), np.float32)
    assert t, "the embedded model has no adaptable modules?"
    save_tensors(path, t, dif_metadata=False)
    return path


def pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int16)


def test_lora_changes_the_image_and_scale_zero_does_not(tmp_path: Path) -> None:
    lora = make_lora(tmp_path / "style.safetensors")
    runner = CliRunner()
    outs = {}
    for tag, extra in (("plain", []), ("zero", ["--lora", f"{lora}:0"]), ("lora", ["--lora", f"{lora}:0.05"])):
        out = tmp_path / f"{tag}.png"
        result = runner.invoke(cli, ["flux2", "generate", *COMMON, *extra, "-o", str(out)])
        assert result.exit_code == 0, result.output
        outs[tag] = pixels(out)
    assert np.array_equal(outs["plain"], outs["zero"])
    assert np.abs(outs["plain"] - outs["lora"]).max() > 0
    assert read_png_metadata(tmp_path / "lora.png")["dif"]["model"].endswith("+ LoRA style.safetensors@0.05")


@pytest.mark.parametrize(
    "tensors, message",
    [
        (
            {"transformer.nothing_here.lora_A.weight": np.zeros((2, 4), np.float32)},
            "has parts",
        ),
        (
            {
                "transformer.nothing_here.lora_A.weight": np.zeros((2, 4), np.float32),
                "transformer.nothing_here.lora_B.weight": np.zeros((4, 2), np.float32),
            },
            "match no module",
        ),
        (
            {
                "lora_unet_double_blocks_0_img_mod_lin.lora_down.weight": np.zeros((2, 4), np.float32),
                "lora_unet_double_blocks_0_img_mod_lin.lora_up.weight": np.zeros((4, 2), np.float32),
            },
            "this LoRA is for FLUX.1",
        ),
    ],
)
def test_bad_lora_is_refused_and_nothing_written(tmp_path: Path, tensors, message) -> None:  # type: ignore[no-untyped-def]
    lora = tmp_path / "bad.safetensors"
    save_tensors(lora, tensors, dif_metadata=False)
    out = tmp_path / "out.png"
    result = CliRunner().invoke(cli, ["flux2", "generate", *COMMON, "--lora", str(lora), "-o", str(out)])
    assert result.exit_code != 0
    assert message in result.output and "bad.safetensors" in result.output
    assert "Traceback" not in result.output
    assert not out.exists()


def test_bad_scale_is_refused(tmp_path: Path) -> None:
    lora = make_lora(tmp_path / "x.safetensors")
    out = tmp_path / "out.png"
    result = CliRunner().invoke(cli, ["flux2", "generate", *COMMON, "--lora", f"{lora}:nan", "-o", str(out)])
    assert result.exit_code != 0 and not out.exists()
    assert "x.safetensors:nan" in result.output


def test_python_api_takes_loras(tmp_path: Path) -> None:
    import dif

    lora = make_lora(tmp_path / "x.safetensors")
    plain = dif.load(family="flux2")("a fox", width=32, height=32, seed=5, steps=2)
    merged = dif.load(family="flux2", lora=[(lora, 0.05)])("a fox", width=32, height=32, seed=5, steps=2)
    assert np.abs(plain.run.pixels.astype(int) - merged.run.pixels).max() > 0
