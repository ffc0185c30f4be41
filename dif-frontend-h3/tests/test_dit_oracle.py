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


def test_bf16_forward_close_to_diffusers_bf16(torch, tiny, transformer_dir) -> None:  # type: ignore[no-untyped-def]
    """bf16 with the fp32 islands (diffusers' `_keep_in_fp32_modules`) on both sides: the roundings differ
    in order only, so the outputs agree to bf16 accuracy (cosine), and the fp32 islands are fp32 in dif."""
    import diffusers

    from dif.dtypes import DType

    ref = diffusers.MiniMaxH3Transformer3DModel.from_pretrained(transformer_dir, torch_dtype=torch.bfloat16).eval()
    assert (
        ref.proj_in.weight.dtype == torch.float32 and ref.transformer_blocks[0].attn.to_q.weight.dtype == torch.bfloat16
    )
    cfg = H3TransformerConfig.from_dict(dict(ref.config))
    layout = build_layout(np.ones(6, np.int64), 2, 4, 6, 8)
    rng = np.random.default_rng(2)
    video = rng.standard_normal((1, layout.video_rows, cfg.video_patch_dim)).astype(np.float32)
    audio = rng.standard_normal((1, layout.audio_rows, cfg.audio_in_channels)).astype(np.float32)
    text = rng.standard_normal((1, 6, cfg.text_dim)).astype(np.float32).astype(DType.BF16.np)
    slot_t = layout.row_timesteps(0.25, 0.5)
    uniq, inverse = np.unique(slot_t[layout.slots], return_inverse=True)
    want = ref(
        hidden_states=torch.from_numpy(video), audio_hidden_states=torch.from_numpy(audio),
        encoder_hidden_states=torch.from_numpy(text.astype(np.float32)).to(torch.bfloat16),
        timestep=torch.from_numpy(uniq), timestep_indices=torch.from_numpy(inverse),
        token_tags=torch.from_numpy(layout.tags), position_ids=torch.from_numpy(layout.position_ids),
        video_indices=torch.from_numpy(layout.video_indices), audio_indices=torch.from_numpy(layout.audio_indices),
        text_indices=torch.from_numpy(layout.text_indices), return_dict=False,
    )  # fmt: skip
    prog = build_denoiser(cfg, layout, dtype="bf16")
    islands = {p.name for p in prog.params if p.type.dtype == DType.F32}
    assert {"proj_in.weight", "audio_proj_in.weight", "time_embedder.linear_1.weight", "proj_out.weight",
            "audio_proj_out.bias"} <= islands  # fmt: skip
    assert not any(n.startswith("transformer_blocks.") for n in islands)
    cos, sin = rope_tables(cfg, layout.position_ids, dtype="bf16")
    inputs = {"video_latents": video, "audio_latents": audio, "text_embeds": text,
              "time_proj": time_proj(slot_t, cfg.freq_dim), "rope_cos": cos, "rope_sin": sin}  # fmt: skip
    out = interpret(prog, inputs, bind_denoiser(prog, open_component(transformer_dir)))
    for got, exp in zip((out[o] for o in prog.outputs), want, strict=True):
        g, e = np.asarray(got, np.float64).ravel(), exp.float().numpy().astype(np.float64).ravel()
        assert float(g @ e / (np.linalg.norm(g) * np.linalg.norm(e))) >= 0.999
