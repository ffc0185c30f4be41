"""`--lora-mode unmerged` through the product path: the embedded klein with LoRAs as side-GEMM inputs
draws the image the merged LoRA draws, and `ImagePipeline.set_loras` swaps adapters and scales with no
program built again (the same prepared denoiser), each swap matching a fresh merged load; "auto"
(the default) merges a fixed set and keeps a swappable one unmerged, saying why in `--json`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from dif.errors import UsageError
from dif.serialize.diftensor import save_tensors
from dif.weights import open_component
from dif_frontend_flux2 import DEFAULT_CHECKPOINT

cli = pytest.importorskip("dif_tools.cli", reason="the `dif` command lives in dif-tools").cli
COMMON = ["-p", "a fox", "-W", "32", "-H", "32", "--seed", "5", "--steps", "2"]
SETTINGS = dict(width=32, height=32, seed=5, steps=2)


def make_lora(path: Path, seed: int, rank: int = 4) -> Path:
    source = open_component(DEFAULT_CHECKPOINT / "transformer")
    rng = np.random.default_rng(seed)
    t = {}
    for name in source.names():
        if len(source.info(name).shape) == 2:
            out, inp = source.info(name).shape
            key = "lora_unet_" + name[: -len(".weight")].replace(".", "_")
            t[f"{key}.lora_down.weight"] = rng.standard_normal((rank, inp)).astype(np.float32)
            t[f"{key}.lora_up.weight"] = rng.standard_normal((out, rank)).astype(np.float32)
            t[f"{key}.alpha"] = np.array(float(rank), np.float32)
    save_tensors(path, t, dif_metadata=False)
    return path


def pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB"), dtype=np.int16)


def test_cli_unmerged_equals_merged(tmp_path: Path) -> None:
    lora = make_lora(tmp_path / "a.safetensors", 1)
    images = {}
    for mode in ("merged", "unmerged"):
        out = tmp_path / f"{mode}.png"
        args = ["flux2", "generate", *COMMON, "--lora", f"{lora}:0.05", "--lora-mode", mode, "-o", str(out)]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        images[mode] = pixels(out)
    plain = tmp_path / "plain.png"
    assert CliRunner().invoke(cli, ["flux2", "generate", *COMMON, "-o", str(plain)]).exit_code == 0
    assert np.abs(images["merged"] - pixels(plain)).max() > 2  # the LoRA matters
    assert np.abs(images["merged"] - images["unmerged"]).max() <= 1  # same image up to the last rounding


def test_set_loras_swaps_without_rebuilding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import dif
    import dif_frontend_flux2.pipeline as pipeline_module

    a, b = make_lora(tmp_path / "a.safetensors", 1), make_lora(tmp_path / "b.safetensors", 2, rank=8)
    builds = []
    real = pipeline_module.build_transformer
    monkeypatch.setattr(pipeline_module, "build_transformer", lambda *a_, **k: builds.append(1) or real(*a_, **k))
    pipe = dif.load(family="flux2", lora=[(a, 0.05)], lora_mode="unmerged")
    first = pipe("a fox", **SETTINGS).run.pixels.astype(np.int16)
    assert len(builds) == 1
    for swap, reference in (([(b, -0.04)], [(b, -0.04)]), ([], None), ([(a, 0.05), (b, 0.02)], None)):
        pipe.set_loras(swap)
        before = len(builds)
        got = pipe("a fox", **SETTINGS).run.pixels.astype(np.int16)
        assert len(builds) == before, "a swap built the denoiser again"
        merged = dif.load(family="flux2", lora=swap)("a fox", **SETTINGS).run.pixels.astype(np.int16)
        assert np.abs(got - merged).max() <= 1, swap
        if reference is not None:
            assert np.abs(got - first).max() > 2
    with pytest.raises(UsageError, match="lora_mode='unmerged'"):
        dif.load(family="flux2").set_loras([(a, 1.0)])


def test_auto_decides_and_records_why(tmp_path: Path) -> None:
    import json

    lora = make_lora(tmp_path / "a.safetensors", 1)
    images, decided = {}, {}
    for tag, extra in (("auto", []), ("swappable", ["--lora-swappable"])):
        out = tmp_path / f"{tag}.png"
        args = ["flux2", "generate", *COMMON, "--lora", f"{lora}:0.05", *extra, "-o", str(out), "--json"]
        result = CliRunner().invoke(cli, args)
        assert result.exit_code == 0, result.output
        images[tag], decided[tag] = pixels(out), json.loads(result.output)["data"]["settings"]["lora"]
    assert (decided["auto"]["mode"], decided["swappable"]["mode"]) == ("merged", "unmerged")
    assert decided["auto"]["requested"] == decided["swappable"]["requested"] == "auto"
    assert "fixed for the pipeline's life" in decided["auto"]["why"]
    assert "swapping asked for" in decided["swappable"]["why"]
    assert np.abs(images["auto"] - images["swappable"]).max() <= 1
