"""Oracle parity of each program (fp32, CPU reference interpreter) against diffusers / transformers at
tiny random configs: CLIP text encoder, UNet forward, AutoencoderKL decode, TAESD decode.

The checkpoint is a diffusers folder written by save_pretrained (conftest) and opened by dif from
disk (`open_checkpoint`), so names and on-disk layouts are part of what is checked. Gate: rel-L2 1e-5.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dif.interp import interpret
from dif_frontend_sdturbo.taesd import build_taesd_decoder
from dif_frontend_sdturbo.text_encoder import build_text_encoder
from dif_frontend_sdturbo.unet import build_unet, timestep_features
from dif_frontend_sdturbo.vae import build_vae_decoder, vae_latents
from dif_frontend_sdturbo.weights import bind_taesd, bind_text_encoder, bind_unet, bind_vae, open_checkpoint

pytestmark = pytest.mark.oracle
GATE = 1e-5


def _run(prog, inputs, weights):  # type: ignore[no-untyped-def]
    return interpret(prog, inputs, weights)[prog.outputs[0]]


def test_text_encoder(torch, tiny_checkpoint: Path, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    ref = transformers.CLIPTextModel.from_pretrained(tiny_checkpoint / "text_encoder").eval()
    ck = open_checkpoint(tiny_checkpoint)
    rng = np.random.default_rng(0)
    ids = rng.integers(0, ck.configs.text_encoder.vocab_size, (2, 77)).astype(np.int64)
    prog = build_text_encoder(ck.configs.text_encoder, seq_len=77, batch=2)
    out = _run(prog, {"input_ids": ids}, bind_text_encoder(prog, ck.text_encoder))
    expected = ref(torch.from_numpy(ids)).last_hidden_state.numpy()
    assert rel_l2_fn(out, expected) <= GATE


def test_unet_forward(torch, tiny_checkpoint: Path, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    ref = diffusers.UNet2DConditionModel.from_pretrained(tiny_checkpoint / "unet").eval()
    ck = open_checkpoint(tiny_checkpoint)
    cfg = ck.configs.unet
    rng = np.random.default_rng(1)
    sample = rng.standard_normal((2, 4, 16, 24)).astype(np.float32)
    text = rng.standard_normal((2, 77, cfg.cross_attention_dim)).astype(np.float32)
    t = np.array([999.0, 250.0], np.float32)
    prog = build_unet(cfg, latent_h=16, latent_w=24, batch=2)
    inputs = {"sample": sample, "timestep_proj": timestep_features(cfg, t), "text": text}
    out = _run(prog, inputs, bind_unet(prog, ck.unet))
    expected = ref(torch.from_numpy(sample), torch.from_numpy(t), encoder_hidden_states=torch.from_numpy(text)).sample
    assert rel_l2_fn(out, expected.numpy()) <= GATE


def test_vae_decode(torch, tiny_checkpoint: Path, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    ref = diffusers.AutoencoderKL.from_pretrained(tiny_checkpoint / "vae").eval()
    ck = open_checkpoint(tiny_checkpoint)
    latents = np.random.default_rng(2).standard_normal((1, 4, 6, 8)).astype(np.float32)
    prog = build_vae_decoder(ck.configs.vae, latent_h=6, latent_w=8)
    out = _run(prog, {"latent": vae_latents(ck.configs.vae, latents)}, bind_vae(prog, ck.vae))
    expected = ref.decode(torch.from_numpy(latents) / ref.config.scaling_factor).sample.numpy()
    assert out.shape == (1, 3, 48, 64)
    assert rel_l2_fn(out, expected) <= GATE


def test_taesd_decode(torch, tiny_checkpoint: Path, rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    folder = tiny_checkpoint.parent / f"{tiny_checkpoint.name}-taesd"
    ref = diffusers.AutoencoderTiny.from_pretrained(folder).eval()
    ck = open_checkpoint(tiny_checkpoint, taesd=folder)
    assert ck.taesd is not None
    latents = (3.0 * np.random.default_rng(3).standard_normal((1, 4, 6, 8))).astype(np.float32)  # tanh clamp bites
    prog = build_taesd_decoder(ck.taesd.config, latent_h=6, latent_w=8)
    out = _run(prog, {"latent": latents}, bind_taesd(prog, ck.taesd.source))
    expected = ref.decode(torch.from_numpy(latents)).sample.numpy()  # [-1, 1]; dif keeps TAESD's [0, 1]
    assert rel_l2_fn(out, (expected + 1.0) / 2.0) <= GATE
