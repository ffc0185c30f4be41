"""Oracle parity: the Flux2 VAE programs (decode prep, decoder, encoder) vs diffusers'
AutoencoderKLFlux2 and the Flux2KleinPipeline latent (un)packing, tiny random config, fp32."""

from __future__ import annotations

import numpy as np
import pytest

from dif.interp import interpret
from dif_frontend_flux2.config import Flux2VaeConfig
from dif_frontend_flux2.vae import build_latent_decode_prep, build_vae_decoder, build_vae_encoder

pytestmark = pytest.mark.oracle

TINY = dict(
    block_out_channels=(16, 32),
    down_block_types=("DownEncoderBlock2D",) * 2,
    up_block_types=("UpDecoderBlock2D",) * 2,
    layers_per_block=1,
    norm_num_groups=8,
    latent_channels=4,
)


@pytest.fixture
def tiny_vae(torch, tmp_path, randomize):  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers", reason="oracle tests need diffusers")
    torch.manual_seed(0)
    vae = diffusers.AutoencoderKLFlux2(**TINY).eval()
    randomize(vae, torch, seed=3)
    vae.save_pretrained(tmp_path)
    return vae, Flux2VaeConfig.from_json(tmp_path / "config.json")


def _pipeline_unpack(torch, vae, packed: np.ndarray, gh: int, gw: int) -> np.ndarray:  # type: ignore[no-untyped-def]
    """The reference decode-side latent handling: unpack by ids, BN de-normalize, unpatchify."""
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline as P

    x = torch.from_numpy(packed)
    ids = P._prepare_latent_ids(torch.zeros(x.shape[0], x.shape[2], gh, gw))
    lat = P._unpack_latents_with_ids(x, ids, gh, gw)
    mean = vae.bn.running_mean.view(1, -1, 1, 1)
    std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    return P._unpatchify_latents(lat * std + mean)


def test_decoder_matches_diffusers(torch, tmp_path, tiny_vae, load_weights, rel_l2_fn):  # type: ignore[no-untyped-def]
    vae, cfg = tiny_vae
    batch, gh, gw = 2, 3, 4
    packed = np.random.default_rng(0).standard_normal((batch, gh * gw, cfg.patched_channels)).astype(np.float32)
    latent = _pipeline_unpack(torch, vae, packed, gh, gw)
    expected = vae.decode(latent, return_dict=False)[0].numpy()
    weights = load_weights(tmp_path)

    prep = build_latent_decode_prep(cfg, batch=batch, latent_h=2 * gh, latent_w=2 * gw)
    got_latent = interpret(prep, {"latents": packed}, weights)[prep.outputs[0]]
    # measured: 4.2e-08
    assert rel_l2_fn(got_latent, latent.numpy()) <= 1e-6

    dec = build_vae_decoder(cfg, batch=batch, latent_h=2 * gh, latent_w=2 * gw)
    got = interpret(dec, {"latent": latent.numpy()}, weights)[dec.outputs[0]]
    assert got.shape == (batch, 3, 2 * gh * cfg.scale_factor, 2 * gw * cfg.scale_factor)
    err = rel_l2_fn(got, expected)
    # measured: 9.0e-07
    assert err <= 1e-5, f"rel-L2 {err:.3e}"

    fused = build_vae_decoder(cfg, batch=batch, latent_h=2 * gh, latent_w=2 * gw, from_packed=True)
    got = interpret(fused, {"latents": packed}, weights)[fused.outputs[0]]
    err = rel_l2_fn(got, expected)
    # measured: 8.9e-07
    assert err <= 1e-5, f"rel-L2 {err:.3e} (from packed latents)"


def test_encoder_matches_diffusers(torch, tmp_path, tiny_vae, load_weights, rel_l2_fn):  # type: ignore[no-untyped-def]
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline as P

    vae, cfg = tiny_vae
    batch, h, w = 2, 12, 16
    image = np.random.default_rng(1).uniform(-1, 1, (batch, 3, h, w)).astype(np.float32)
    mean = vae.encode(torch.from_numpy(image)).latent_dist.mode()
    weights = load_weights(tmp_path)

    enc = build_vae_encoder(cfg, batch=batch, height=h, width=w)
    got = interpret(enc, {"image": image}, weights)[enc.outputs[0]]
    err = rel_l2_fn(got, mean.numpy())
    # measured: 7.4e-07
    assert err <= 1e-5, f"rel-L2 {err:.3e}"

    # reference-image path of the pipeline: patchify, BN-normalize, pack
    bn_mean = vae.bn.running_mean.view(1, -1, 1, 1)
    bn_std = torch.sqrt(vae.bn.running_var.view(1, -1, 1, 1) + vae.config.batch_norm_eps)
    expected = P._pack_latents((P._patchify_latents(mean) - bn_mean) / bn_std).numpy()
    enc = build_vae_encoder(cfg, batch=batch, height=h, width=w, to_packed=True)
    got = interpret(enc, {"image": image}, weights)[enc.outputs[0]]
    err = rel_l2_fn(got, expected)
    # measured: 6.7e-07
    assert err <= 1e-5, f"rel-L2 {err:.3e} (packed)"
