"""bf16 programs vs the bf16 oracles (diffusers / transformers run in bfloat16 on CPU).

Not bit parity: the reference interpreter rounds once per op (fused-op semantics) where torch
rounds after every elementwise step. The checks: dif's bf16 program is closer to the bf16 oracle
than the fp32 oracle (same bf16-valued weights) is, i.e. it follows the reference's bf16 rounding
points (timestep grid, Qwen's norm rounding, bf16 RoPE tables); and an absolute bound ~2x the
measured value."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from dif.interp import interpret
from dif_frontend_flux2.config import Flux2TransformerConfig, Qwen3Config
from dif_frontend_flux2.model import build_transformer, flux2_rope_tables, flux2_timestep_proj
from dif_frontend_flux2.text_encoder import build_text_encoder, qwen3_rope_tables

pytestmark = pytest.mark.oracle
BF16 = np.dtype(ml_dtypes.bfloat16)
TAPS = (1, 3, 4)


def _bf16_weights(weights: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: v.astype(BF16) for k, v in weights.items()}


def test_transformer_bf16(torch, tmp_path, load_weights, tiny_transformer, rel_l2_fn):  # type: ignore[no-untyped-def]
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

    ref = tiny_transformer(False).to(torch.bfloat16)
    ref.save_pretrained(tmp_path)
    cfg = Flux2TransformerConfig.from_json(tmp_path / "config.json")
    batch, gh, gw, n_txt = 1, 4, 4, 6
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((batch, gh * gw, cfg.in_channels)).astype(BF16)
    text = rng.standard_normal((batch, n_txt, cfg.joint_attention_dim)).astype(BF16)
    t_sched = np.array([941.3], np.float32)
    timestep = torch.from_numpy(t_sched).to(torch.bfloat16)  # the pipeline's rounding of t

    def run(model, dtype):  # type: ignore[no-untyped-def]
        return (
            model(
                hidden_states=torch.from_numpy(latents.astype(np.float32)).to(dtype),
                encoder_hidden_states=torch.from_numpy(text.astype(np.float32)).to(dtype),
                timestep=timestep.to(dtype) / 1000,
                img_ids=Flux2KleinPipeline._prepare_latent_ids(torch.zeros(batch, 1, gh, gw)),
                txt_ids=Flux2KleinPipeline._prepare_text_ids(torch.zeros(batch, n_txt, 1)),
                return_dict=False,
            )[0]
            .float()
            .numpy()
        )

    expected = run(ref, torch.bfloat16)
    fp32_err = rel_l2_fn(run(ref.float(), torch.float32), expected)

    prog = build_transformer(cfg, batch=batch, n_img=gh * gw, n_txt=n_txt, dtype="bf16")
    cos, sin = flux2_rope_tables(n_txt, gh, gw, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
    inputs = {
        "latents": latents,
        "text_features": text,
        "timestep_proj": flux2_timestep_proj(t_sched, dtype="bf16", channels=cfg.timestep_guidance_channels),
        "rope_cos": cos,
        "rope_sin": sin,
    }
    got = interpret(prog, inputs, _bf16_weights(load_weights(tmp_path)))[prog.outputs[0]]
    assert got.dtype == BF16
    err = rel_l2_fn(got.astype(np.float32), expected)
    # measured: 4.8e-03 (the fp32 oracle is 5.8e-03 away from the bf16 one)
    assert err < fp32_err, f"rel-L2 {err:.3e} vs fp32 oracle {fp32_err:.3e}"
    assert err <= 1e-2, f"rel-L2 {err:.3e}"


def test_text_encoder_bf16(torch, tmp_path, load_weights, tiny_qwen3, rel_l2_fn):  # type: ignore[no-untyped-def]
    model = tiny_qwen3.to(torch.bfloat16)
    model.save_pretrained(tmp_path)
    cfg = Qwen3Config.from_json(tmp_path / "config.json")
    batch, seq = 2, 9
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.int64)
    mask = np.arange(seq)[None, :] < np.array([seq, 4])[:, None]
    ids[~mask] = 5

    def run(m):  # type: ignore[no-untyped-def]
        out = m(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask.astype(np.int64)),
            output_hidden_states=True,
            use_cache=False,
        )
        return torch.cat([out.hidden_states[k] for k in TAPS], dim=-1).float().numpy()

    expected = run(model)
    fp32_err = rel_l2_fn(run(model.float()), expected)

    prog = build_text_encoder(cfg, batch=batch, seq_len=seq, taps=TAPS, dtype="bf16")
    cos, sin = qwen3_rope_tables(cfg, seq, dtype="bf16")
    inputs = {"input_ids": ids, "attention_mask": mask, "rope_cos": cos, "rope_sin": sin}
    got = interpret(prog, inputs, _bf16_weights(load_weights(tmp_path)))[prog.outputs[0]]
    err = rel_l2_fn(got.astype(np.float32), expected)
    # measured: 8.8e-03 (the fp32 oracle is 1.1e-02 away from the bf16 one)
    assert err < fp32_err, f"rel-L2 {err:.3e} vs fp32 oracle {fp32_err:.3e}"
    assert err <= 2e-2, f"rel-L2 {err:.3e}"
