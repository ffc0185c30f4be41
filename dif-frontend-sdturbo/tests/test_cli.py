"""`dif sdturbo generate` / `dif sdturbo info` through the real `dif` command, with this frontend and the
CPU backend registered in-process, on the embedded tiny checkpoint (no torch needed), and the bad inputs
the frontend must refuse or warn about: guidance on SD-Turbo, SDXL / v-prediction checkpoints, a TAESD
for SDXL or with 16 latent channels, an original (LDM) single file."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from dif.plugins import isolated_plugins, register_plugin
from dif.serialize.diftensor import save_tensors
from dif.telemetry import validate_document
from dif_frontend_sdturbo import DEFAULT_CHECKPOINT, plugin


@pytest.fixture
def dif_cli() -> Iterator[Callable[..., Any]]:
    cpu = pytest.importorskip("dif_backend_cpu.plugin", reason="needs dif-backend-cpu")
    dif_tools = pytest.importorskip("dif_tools.cli", reason="needs dif-tools")
    with isolated_plugins(""):
        register_plugin(cpu, "cpu")
        register_plugin(plugin, "sdturbo")
        runner = CliRunner()

        def invoke(*args: str, ok: bool = True) -> Any:
            result = runner.invoke(dif_tools.build_cli(), list(args))
            if ok:
                assert result.exit_code == 0, result.output
            else:
                assert result.exit_code != 0, result.output
                assert "Traceback" not in result.output
            return result

        yield invoke


GEN = ("sdturbo", "generate", "-p", "a red fox", "--seed", "3", "--backend", "cpu", "-W", "128", "-H", "64")


def test_generate_kl_and_fast_vae(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    out = dif_cli(*GEN, "-o", str(tmp_path / "kl.png"))
    assert "1 steps, no CFG" in out.output and "warning" not in out.output
    fast = dif_cli(*GEN, "--fast-vae", "-o", str(tmp_path / "fast.png"), "--json")
    doc = json.loads(fast.output)
    validate_document(doc)
    kl, tiny = (np.asarray(Image.open(tmp_path / n)) for n in ("kl.png", "fast.png"))
    assert kl.shape == tiny.shape == (64, 128, 3)
    assert not np.array_equal(kl, tiny)  # two decoders
    assert kl.std() > 0 and tiny.std() > 0


def test_default_size_is_native(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    dif_cli("sdturbo", "generate", "-p", "x", "--seed", "1", "--backend", "cpu", "-o", str(tmp_path / "a.png"))
    assert Image.open(tmp_path / "a.png").size == (256, 256)  # unet sample_size 32 x VAE 8


def test_size_rounded_up_with_warning(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    out = dif_cli("sdturbo", "generate", "-p", "x", "--seed", "1", "--backend", "cpu", "-W", "100", "-H", "64",
                  "-o", str(tmp_path / "r.png"))  # fmt: skip
    assert "width 100 rounded up to 128" in out.output
    assert Image.open(tmp_path / "r.png").size == (128, 64)


def test_guidance_on_turbo_warns(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    out = dif_cli(*GEN, "--guidance", "3", "-o", str(tmp_path / "g.png"))
    assert "warning: guidance 3.0 on SD-Turbo runs CFG" in out.output
    low = dif_cli(*GEN, "--guidance", "0.5", "-o", str(tmp_path / "h.png"))
    assert "has no effect" in low.output


def test_info(dif_cli: Callable[..., Any]) -> None:
    text = dif_cli("sdturbo", "info").output
    assert "SD-Turbo (1 step, no CFG)" in text and "unet: channels [32, 64, 64]" in text
    doc = json.loads(dif_cli("sdturbo", "info", "--variant", "sd-turbo", "--json").output)
    validate_document(doc)
    unet = doc["data"]["unet"]
    assert unet["channels"] == [320, 640, 1280, 1280] and unet["heads"] == [5, 10, 20, 20]
    assert doc["data"]["defaults"]["size"] == 512 and doc["data"]["text_encoder"]["layers"] == 23


def _copy_default(tmp_path: Path, name: str = "model") -> Path:
    root = tmp_path / name
    shutil.copytree(DEFAULT_CHECKPOINT, root)
    return root


def _edit(path: Path, **changes: Any) -> None:
    data = json.loads(path.read_text())
    data.update(changes)
    path.write_text(json.dumps(data))


def test_sdxl_checkpoint_refused_by_name(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    root = _copy_default(tmp_path)
    _edit(root / "model_index.json", _class_name="StableDiffusionXLPipeline")
    out = dif_cli("sdturbo", "generate", "-p", "x", "-m", str(root), "-o", str(tmp_path / "x.png"), ok=False)
    assert "StableDiffusionXLPipeline" in out.output and "SDXL" in out.output
    _edit(root / "model_index.json", _class_name="StableDiffusionPipeline")
    _edit(root / "unet" / "config.json", addition_embed_type="text_time")
    out = dif_cli("sdturbo", "generate", "-p", "x", "-m", str(root), "-o", str(tmp_path / "x.png"), ok=False)
    assert "addition_embed_type='text_time'" in out.output and "SDXL" in out.output


def test_v_prediction_refused_by_name(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    root = _copy_default(tmp_path)
    _edit(root / "scheduler" / "scheduler_config.json", prediction_type="v_prediction")
    out = dif_cli("sdturbo", "info", str(root), ok=False)
    assert "prediction_type='v_prediction'" in out.output


def test_base_checkpoint_is_supported(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    root = _copy_default(tmp_path, "sd-base")
    _edit(root / "model_index.json", _name_or_path="sd-2-base")
    _edit(root / "scheduler" / "scheduler_config.json", _class_name="PNDMScheduler", timestep_spacing="leading")
    text = dif_cli("sdturbo", "info", str(root)).output
    assert "Stable Diffusion (epsilon, Euler + CFG)" in text and "25 steps, guidance 7.5" in text
    out = dif_cli("sdturbo", "generate", "-p", "x", "-m", str(root), "--steps", "2", "--seed", "1", "--backend", "cpu",
                  "-W", "64", "-H", "64", "-o", str(tmp_path / "b.png"))  # fmt: skip
    assert "CFG 7.5" in out.output


def test_sdxl_taesd_refused(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    xl = tmp_path / "taesdxl"
    shutil.copytree(DEFAULT_CHECKPOINT / "taesd", xl)
    out = dif_cli(*GEN, "--fast-vae", "--taesd", str(xl), "-o", str(tmp_path / "x.png"), ok=False)
    assert "TAESD for SDXL" in out.output and not (tmp_path / "x.png").exists()
    renamed = tmp_path / "tiny"  # the name inside the config says so too
    shutil.copytree(DEFAULT_CHECKPOINT / "taesd", renamed)
    _edit(renamed / "config.json", _name_or_path="madebyollin/taesdxl")
    out = dif_cli(*GEN, "--fast-vae", "--taesd", str(renamed), "-o", str(tmp_path / "x.png"), ok=False)
    assert "taesdxl" in out.output


def test_16_channel_taesd_refused(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    folder = tmp_path / "taef1"
    shutil.copytree(DEFAULT_CHECKPOINT / "taesd", folder)
    _edit(folder / "config.json", latent_channels=16)
    out = dif_cli(*GEN, "--fast-vae", "--taesd", str(folder), "-o", str(tmp_path / "x.png"), ok=False)
    assert "16-channel TAESD" in out.output


def test_fast_vae_without_taesd_refused(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    root = _copy_default(tmp_path)
    shutil.rmtree(root / "taesd")
    out = dif_cli("sdturbo", "generate", "-p", "x", "-m", str(root), "--fast-vae", "-o", str(tmp_path / "x.png"),
                  ok=False)  # fmt: skip
    assert "--fast-vae needs a TAESD" in out.output


def test_original_taesd_decoder_file(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    """madebyollin's taesd_decoder.safetensors numbers layers from 1 (a Clamp module first): same image."""
    from dif.weights import open_safetensors

    src = open_safetensors(DEFAULT_CHECKPOINT / "taesd" / "diffusion_pytorch_model.safetensors")
    tensors = {}
    for name in src.names():
        if name.startswith("decoder.layers."):
            k, rest = name.removeprefix("decoder.layers.").split(".", 1)
            tensors[f"{int(k) + 1}.{rest}"] = np.asarray(src[name])
    save_tensors(tmp_path / "taesd_decoder.safetensors", tensors, {"format": "pt"}, dif_metadata=False)
    dif_cli(*GEN, "--fast-vae", "-o", str(tmp_path / "a.png"))
    dif_cli(*GEN, "--fast-vae", "--taesd", str(tmp_path / "taesd_decoder.safetensors"), "-o", str(tmp_path / "b.png"))
    assert np.array_equal(np.asarray(Image.open(tmp_path / "a.png")), np.asarray(Image.open(tmp_path / "b.png")))


def test_ldm_single_file_refused_by_name(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    root = _copy_default(tmp_path)
    bad = root / "sd_turbo.safetensors"
    w = np.zeros((4, 4), np.float16)
    save_tensors(bad, {"model.diffusion_model.input_blocks.0.0.weight": w}, {"format": "pt"}, dif_metadata=False)
    out = dif_cli("sdturbo", "generate", "-p", "x", "-m", str(root), "--unet", str(bad), "-o", str(tmp_path / "x.png"),
                  ok=False)  # fmt: skip
    assert "original (LDM / A1111)" in out.output


def test_preview_and_latents_round_trip(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    """--preview writes a latent preview (a projection fitted at load); --save-latents' noise fed back as
    --init-noise gives the same image."""
    from dif.weights import open_safetensors

    a, lat = tmp_path / "a.png", tmp_path / "lat.safetensors"
    dif_cli(*GEN, "--preview", str(tmp_path / "prev.png"), "--save-latents", str(lat), "-o", str(a))
    assert Image.open(tmp_path / "prev.png").size[0] > 0
    saved = open_safetensors(lat)
    assert tuple(saved.info("latents").shape) == (1, 8 * 16, 4)  # packed: one token per latent pixel
    b = tmp_path / "b.png"
    again = ("sdturbo", "generate", "-p", "a red fox", "--backend", "cpu", "-W", "128", "-H", "64", "--seed", "99")
    dif_cli(*again, "--init-noise", str(lat), "-o", str(b))
    assert np.array_equal(np.asarray(Image.open(a)), np.asarray(Image.open(b)))
