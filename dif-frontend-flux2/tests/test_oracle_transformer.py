"""Oracle parity: the Flux2 transformer program vs diffusers' Flux2Transformer2DModel (tiny, fp32),
and the host inputs (timestep sinusoid, RoPE tables) vs the diffusers code that makes them."""

from __future__ import annotations

import numpy as np
import pytest

from dif.interp import interpret
from dif_frontend_flux2.config import Flux2TransformerConfig
from dif_frontend_flux2.model import (
    build_transformer,
    flux2_model_timestep,
    flux2_rope_tables,
    flux2_timestep_proj,
)

pytestmark = pytest.mark.oracle


@pytest.mark.parametrize("guidance_embeds", [False, True])
def test_transformer_forward_matches_diffusers(
    torch, tmp_path, load_weights, tiny_transformer, rel_l2_fn, guidance_embeds
):  # type: ignore[no-untyped-def]
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

    ref = tiny_transformer(guidance_embeds)
    ref.save_pretrained(tmp_path)

    cfg = Flux2TransformerConfig.from_json(tmp_path / "config.json")
    batch, gh, gw, n_txt = 2, 3, 4, 5
    n_img = gh * gw
    prog = build_transformer(cfg, batch=batch, n_img=n_img, n_txt=n_txt)

    rng = np.random.default_rng(0)
    latents = rng.standard_normal((batch, n_img, cfg.in_channels)).astype(np.float32)
    text = rng.standard_normal((batch, n_txt, cfg.joint_attention_dim)).astype(np.float32)
    t_sched = np.array([967.4, 250.0], np.float32)  # scheduler timesteps (sigma * 1000)
    guidance = np.array([4.0, 2.5], np.float32)

    # ids exactly as the pipeline builds them, to cross-check flux2_rope_tables
    img_ids = Flux2KleinPipeline._prepare_latent_ids(torch.zeros(batch, cfg.in_channels, gh, gw))
    txt_ids = Flux2KleinPipeline._prepare_text_ids(torch.zeros(batch, n_txt, 1))
    t_ref = torch.from_numpy(t_sched) / 1000
    expected = ref(
        hidden_states=torch.from_numpy(latents),
        encoder_hidden_states=torch.from_numpy(text),
        timestep=t_ref,
        img_ids=img_ids,
        txt_ids=txt_ids,
        guidance=torch.from_numpy(guidance) if guidance_embeds else None,
        return_dict=False,
    )[0].numpy()

    cos, sin = flux2_rope_tables(n_txt, gh, gw, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
    weights = load_weights(tmp_path)
    time_proj = ref.time_guidance_embed.time_proj
    inputs = {
        "latents": latents,
        "text_features": text,
        "timestep_proj": time_proj(t_ref * 1000).numpy(),  # the oracle's own sinusoid: program parity
        "rope_cos": cos,
        "rope_sin": sin,
    }
    if guidance_embeds:
        inputs["guidance_proj"] = time_proj(torch.from_numpy(guidance) * 1000).numpy()
    out = interpret(prog, inputs, weights)[prog.outputs[0]]
    err = rel_l2_fn(out, expected)
    # measured: 2.2e-07 (guidance off), 2.6e-07 (guidance on)
    assert err <= 1e-5, f"rel-L2 {err:.3e}"

    if not guidance_embeds:  # the Klein configuration, end to end with dif's host sinusoid
        inputs["timestep_proj"] = flux2_timestep_proj(t_sched, channels=cfg.timestep_guidance_channels)
        out = interpret(prog, inputs, weights)[prog.outputs[0]]
        err = rel_l2_fn(out, expected)
        # measured: 1.4e-06; larger than above only because torch's fp32 exp is one ulp off the
        # correctly rounded value for one frequency (see test_timestep_proj_matches_diffusers)
        assert err <= 1e-5, f"rel-L2 {err:.3e} with the host sinusoid"


@pytest.mark.parametrize("channels", [64, 256])
def test_timestep_proj_matches_diffusers(torch, channels):  # type: ignore[no-untyped-def]
    pytest.importorskip("diffusers", reason="oracle tests need diffusers")
    from diffusers.models.embeddings import Timesteps

    t_sched = np.array([0.0, 1.0, 250.0, 967.4, 1000.0, 4000.0], np.float32)
    ref = Timesteps(channels, flip_sin_to_cos=True, downscale_freq_shift=0)(torch.from_numpy(t_sched) / 1000 * 1000)
    ours = flux2_timestep_proj(t_sched, channels=channels)
    # torch's fp32 exp differs from the correctly rounded one by an ulp for a few frequencies, which
    # moves the angle t*f by up to t * 2^-23 rad: bound the difference by that, per row.
    bound = np.maximum(t_sched, 1.0)[:, None] * 2.0**-22 + 1e-6
    assert np.all(np.abs(ours - ref.numpy()) <= bound)


def test_model_timestep_follows_bf16_rounding(torch):  # type: ignore[no-untyped-def]
    t_sched = np.array([967.4, 941.3, 500.1, 3.7], np.float32)
    t = torch.from_numpy(t_sched).to(torch.bfloat16)  # pipeline: t.to(latents.dtype)
    expected = ((t / 1000).to(torch.bfloat16) * 1000).float().numpy()  # model: timestep.to(dtype) * 1000
    got = flux2_model_timestep(t_sched, dtype="bf16")
    np.testing.assert_array_equal(got, expected)
    assert got[0] == 968.0


def test_rope_tables_match_diffusers_pos_embed(torch):  # type: ignore[no-untyped-def]
    pytest.importorskip("diffusers", reason="oracle tests need diffusers")
    from diffusers.models.transformers.transformer_flux2 import Flux2PosEmbed

    cos, sin = flux2_rope_tables(7, 3, 5, ref_shapes=[(2, 2)])
    ids = np.concatenate(
        [
            np.stack([np.zeros(7), np.zeros(7), np.zeros(7), np.arange(7)], 1),
            np.stack([np.zeros(15), np.repeat(np.arange(3), 5), np.tile(np.arange(5), 3), np.zeros(15)], 1),
            np.stack([np.full(4, 10), np.repeat(np.arange(2), 2), np.tile(np.arange(2), 2), np.zeros(4)], 1),
        ]
    )
    ref_cos, ref_sin = Flux2PosEmbed(theta=2000, axes_dim=[32, 32, 32, 32])(torch.from_numpy(ids).long())
    np.testing.assert_array_equal(cos, ref_cos.numpy())
    np.testing.assert_array_equal(sin, ref_sin.numpy())
