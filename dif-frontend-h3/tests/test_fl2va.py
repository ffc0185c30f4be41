"""fl2va keyframes: the keyframe latent (ImageNet pixels, the tiled video VAE encoder, posterior sampled under
seed 42, fp16 rounding, normalization) against the modular pipeline's `encode_vae_condition` on the
embedded checkpoint's VAE read by diffusers (non-square 128x96 image; gate rel-L2 1e-5); keyframes of
another size refused before anything runs; a keyframe run through `dif h3 generate --latents-only`."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner
from PIL import Image

from dif.errors import UsageError
from dif.plugins import isolated_plugins, register_plugin
from dif.weights import open_safetensors
from dif_frontend_h3 import DEFAULT_CHECKPOINT, plugin
from dif_frontend_h3.pipeline import H3Pipeline, Keyframe, VideoRequest
from dif_frontend_h3.weights import open_checkpoint


def _picture(h: int = 96, w: int = 128) -> np.ndarray:
    y, x = np.mgrid[0:h, 0:w]
    return np.stack([(x * 2) % 256, (y * 3) % 256, (x + y) % 256], -1).astype(np.uint8)


@pytest.mark.oracle
def test_keyframe_latent_matches_reference(torch, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    from diffusers.modular_pipelines.minimax_h3.encoders import encode_vae_condition

    vae = diffusers.AutoencoderKLMiniMaxH3.from_pretrained(DEFAULT_CHECKPOINT / "vae").eval()
    img = _picture()
    pixels = torch.from_numpy(img).permute(2, 0, 1)[None, :, None].float()
    want = encode_vae_condition(vae, pixels, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)).numpy()
    got = H3Pipeline(open_checkpoint(DEFAULT_CHECKPOINT), backend="interp").encode_keyframe(img)
    err = rel_l2_fn(got, want)
    print(f"keyframe latent rel-L2 {err:.2e}")
    assert err <= 1e-5


def test_keyframe_of_another_size_refused() -> None:
    pipe = H3Pipeline(open_checkpoint(DEFAULT_CHECKPOINT), backend="interp")
    req = VideoRequest("a kite", 22, 128, 96, 3, keyframes=(Keyframe("first", _picture(64, 64), "k.png"),))
    with pytest.raises(UsageError, match="k.png is 64x64: the first frame must be the video's size, 128x96"):
        pipe.check(req)
    twice = VideoRequest("a kite", 22, 128, 96, 3, keyframes=(Keyframe("last", _picture()),) * 2)
    with pytest.raises(UsageError, match="one keyframe per end"):
        pipe.check(twice)


@pytest.fixture
def dif_cli() -> Iterator[Callable[..., Any]]:
    cpu = pytest.importorskip("dif_backend_cpu.plugin", reason="needs dif-backend-cpu")
    dif_tools = pytest.importorskip("dif_tools.cli", reason="needs dif-tools")
    with isolated_plugins(""):
        register_plugin(cpu, "cpu")
        register_plugin(plugin, "h3")
        runner = CliRunner()
        yield lambda *args: runner.invoke(dif_tools.build_cli(), list(args))


def test_fl2va_cli(dif_cli: Callable[..., Any], tmp_path: Path) -> None:
    first, small = tmp_path / "first.png", tmp_path / "small.png"
    Image.fromarray(_picture()).save(first)
    Image.fromarray(_picture(64, 64)).save(small)
    base = ["h3", "generate", "-p", "a kite over dunes", "--steps", "3", "--seed", "5", "--backend", "cpu",
            "--latents-only"]  # fmt: skip
    refused = dif_cli(*base, "--first-frame", str(small), "--save-latents", str(tmp_path / "x.safetensors"))
    assert refused.exit_code != 0 and "is 64x64" in refused.output and "Traceback" not in refused.output
    assert not (tmp_path / "x.safetensors").exists()
    fl2va, t2va = tmp_path / "fl2va.safetensors", tmp_path / "t2va.safetensors"
    ok = dif_cli(*base, "--first-frame", str(first), "--save-latents", str(fl2va))
    assert ok.exit_code == 0, ok.output
    assert "no picture blocks" not in ok.output  # the embedded default has the vision tower: picture blocks
    assert dif_cli(*base, "--save-latents", str(t2va)).exit_code == 0
    a, b = open_safetensors(fl2va)["video_latents"], open_safetensors(t2va)["video_latents"]
    assert a.shape == b.shape and np.linalg.norm(a - b) / np.linalg.norm(b) > 1e-3  # the keyframe conditions
