"""One DiT forward (fp32, CPU) against diffusers' MiniMaxH3Transformer3DModel at a tiny random config, for
the t2va packing and the fl2va packing (first + last keyframe conditioning rows), with the layouts, rotary
grids, tags and row timesteps compared to the modular pipeline's own builders. The weights are written by
`save_pretrained` and read from disk by dif. Gate: rel-L2 <= 1e-5 on both velocities.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dif.interp import interpret
from dif.weights import open_component
from dif_frontend_h3.config import H3TransformerConfig
from dif_frontend_h3.layout import build_layout
from dif_frontend_h3.model import build_denoiser, rope_tables, time_proj
from dif_frontend_h3.weights import bind_denoiser

pytestmark = pytest.mark.oracle
GATE = 1e-5


@pytest.fixture(scope="module")
def transformer_dir(torch, tiny, randomize, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")

    model = diffusers.MiniMaxH3Transformer3DModel(**tiny.transformer).eval()
    randomize(model, torch, 0)
    out = tmp_path_factory.mktemp("h3") / "transformer"
    model.save_pretrained(out)
    return out


@pytest.mark.parametrize("anchors", [(), ("first", "last")], ids=["t2va", "fl2va"])
def test_forward_matches_diffusers(torch, tiny, transformer_dir, rel_l2_fn, anchors) -> None:  # type: ignore[no-untyped-def]
    import diffusers
    from diffusers.modular_pipelines.minimax_h3.before_denoise import (
        MiniMaxH3PrepareLayoutStep,
        MiniMaxH3SetTimestepsStep,
    )

    ref = diffusers.MiniMaxH3Transformer3DModel.from_pretrained(transformer_dir).eval()
    cfg = H3TransformerConfig.from_dict(dict(ref.config))
    text_len, frames_lat, lat_h, lat_w, n_audio = 5, 2, 4, 6, 8
    tags = np.ones(text_len, np.int64)
    layout = build_layout(tags, frames_lat, lat_h, lat_w, n_audio, anchors=anchors)
    pos, ttags, vidx, aidx, tidx, n_cond, _ = MiniMaxH3PrepareLayoutStep.build_packed_sequence(
        torch.from_numpy(tags), frames_lat, lat_h, lat_w, n_audio, (1, 2, 2), 2, 2, 0, tuple(anchors)
    )
    np.testing.assert_array_equal(layout.position_ids, pos.numpy())  # float64, exactly
    np.testing.assert_array_equal(layout.tags, ttags.numpy())
    np.testing.assert_array_equal(layout.video_indices, vidx.numpy())
    np.testing.assert_array_equal(layout.audio_indices, aidx.numpy())
    assert n_cond == layout.condition_rows

    t_v, t_a = 0.3125, 0.71875
    uniq, ts_idx = MiniMaxH3SetTimestepsStep.build_row_timesteps(
        vidx, aidx, n_cond, 0, text_len, t_v, t_a, max(t_v, 0.999), 1.0
    )
    slot_t = layout.row_timesteps(t_v, t_a)
    np.testing.assert_array_equal(slot_t[layout.slots], uniq.numpy()[ts_idx.numpy()])  # same t on every row

    rng = np.random.default_rng(1)
    nv = layout.condition_rows + layout.video_rows
    video = rng.standard_normal((1, nv, cfg.video_patch_dim)).astype(np.float32)
    audio = rng.standard_normal((1, layout.audio_rows, cfg.audio_in_channels)).astype(np.float32)
    text = rng.standard_normal((1, text_len, cfg.text_dim)).astype(np.float32)
    want_v, want_a = ref(
        hidden_states=torch.from_numpy(video), audio_hidden_states=torch.from_numpy(audio),
        encoder_hidden_states=torch.from_numpy(text), timestep=uniq, timestep_indices=ts_idx, token_tags=ttags,
        position_ids=pos, video_indices=vidx, audio_indices=aidx, text_indices=tidx, return_dict=False,
    )  # fmt: skip

    prog = build_denoiser(cfg, layout)
    cos, sin = rope_tables(cfg, layout.position_ids)
    inputs = {"video_latents": video, "audio_latents": audio, "text_embeds": text,
              "time_proj": time_proj(slot_t, cfg.freq_dim), "rope_cos": cos, "rope_sin": sin}  # fmt: skip
    out = interpret(prog, inputs, bind_denoiser(prog, open_component(transformer_dir)))
    got_v, got_a = (out[o] for o in prog.outputs)
    errors = rel_l2_fn(got_v, want_v.numpy()), rel_l2_fn(got_a, want_a.numpy())
    print(f"rel-L2 video {errors[0]:.2e} audio {errors[1]:.2e}")
    assert max(errors) <= GATE
    # the per-segment AdaLN rows matter: swapping the audio and video timesteps changes the output
    swapped = interpret(prog, {**inputs, "time_proj": time_proj(slot_t[[1, 0, *range(2, len(slot_t))]], cfg.freq_dim)},
                        bind_denoiser(prog, open_component(transformer_dir)))  # fmt: skip
    assert rel_l2_fn(swapped[prog.outputs[0]], want_v.numpy()) > 1e-3
