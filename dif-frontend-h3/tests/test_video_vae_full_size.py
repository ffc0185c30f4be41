"""Full-size video VAE: the decoder and encoder programs built from the published config declare exactly
the tensors of the published checkpoint index, with diffusers' shapes (AutoencoderKLMiniMaxH3 built on
torch's meta device: nothing allocated)."""

from __future__ import annotations

import json
import math

import pytest

from dif_frontend_h3.configs import published
from dif_frontend_h3.vae_config import VideoVaeConfig
from dif_frontend_h3.video_vae import build_video_decoder
from dif_frontend_h3.video_vae_encoder import build_video_encoder


@pytest.fixture(scope="module")
def programs():  # type: ignore[no-untyped-def]
    cfg = VideoVaeConfig.from_json(published() / "vae" / "config.json")
    decoder = build_video_decoder(cfg, frames=7, height=16, width=16, dtype="bf16")
    encoder = build_video_encoder(cfg, height=256, width=256)
    return cfg, decoder, encoder


def _shapes(*programs) -> dict[str, tuple[int, ...]]:  # type: ignore[no-untyped-def]
    return {p.name: tuple(p.type.shape) for program in programs for p in program.params}


def test_programs_declare_the_published_index(programs) -> None:  # type: ignore[no-untyped-def]
    _, decoder, encoder = programs
    index = json.loads((published() / "vae" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    ours = _shapes(decoder, encoder)
    assert set(_shapes(decoder)).isdisjoint(_shapes(encoder))
    assert set(ours) == set(index["weight_map"])  # 703 tensors
    # the published checkpoint is float32: 4 bytes per parameter
    assert 4 * sum(math.prod(s) for s in ours.values()) == index["metadata"]["total_size"]


@pytest.mark.oracle
def test_shapes_equal_diffusers_on_meta(torch, programs) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers", reason="oracle tests need diffusers")
    _, decoder, encoder = programs
    config = json.loads((published() / "vae" / "config.json").read_text())
    with torch.device("meta"):
        vae = diffusers.AutoencoderKLMiniMaxH3.from_config(config)
    theirs = {k: tuple(v.shape) for k, v in vae.state_dict().items()}
    assert _shapes(decoder, encoder) == theirs
    decoder_params = sum(math.prod(s) for s in _shapes(decoder).values())
    encoder_params = sum(math.prod(s) for s in _shapes(encoder).values())
    assert decoder_params + encoder_params == sum(p.numel() for p in vae.parameters())
    # the ViT decoder holds almost all of it (36 blocks of 2048 wide, FF 8192)
    assert decoder_params > 10 * encoder_params
