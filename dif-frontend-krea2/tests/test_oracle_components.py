"""Oracle parity of each program (fp32, CPU) against diffusers / transformers at tiny random configs.

The checkpoint is a Krea 2 diffusers folder written by save_pretrained (conftest) and opened by
dif from disk (`open_checkpoint`), so names and on-disk layouts are part of what is checked.
Measured rel-L2 (this machine, torch 2.13 CPU): text features 3.2e-7 (prompt) / 3.4e-7 (empty
prompt), transformer forward 2.9e-7 unmasked / 2.9e-7 masked, hoisted text fusion 3.6e-7 / 3.2e-7,
VAE decode 7.4e-7. Gate: 1e-5.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dif.interp import interpret
from dif.text import TextTokenizer
from dif_frontend_krea2.model import (
    attention_mask,
    build_text_fusion,
    build_transformer,
    position_ids,
    rope_tables,
    timestep_proj_from_timesteps,
)
from dif_frontend_krea2.text_encoder import build_text_encoder, text_rope_tables
from dif_frontend_krea2.tokenize import encode_prompt
from dif_frontend_krea2.vae import build_vae_decoder
from dif_frontend_krea2.weights import (
    bind_text_encoder,
    bind_text_fusion,
    bind_transformer,
    bind_vae,
    open_checkpoint,
)

pytestmark = pytest.mark.oracle
GATE = 1e-5
RelL2 = Callable[[np.ndarray, np.ndarray], float]


def test_text_features_match_pipeline(torch, tiny_checkpoints: dict[str, Path], rel_l2_fn: RelL2) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    root = tiny_checkpoints["turbo"]
    pipe = diffusers.Krea2Pipeline.from_pretrained(root)
    ck = open_checkpoint(root)
    tok = TextTokenizer.from_folder(ck.tokenizer_dir)
    for prompt in ("a red fox, sitting in snow", ""):
        expected, expected_mask = pipe.get_text_hidden_states(prompt, max_sequence_length=16, device="cpu")
        tokens = encode_prompt(tok, prompt, max_sequence_length=16)
        np.testing.assert_array_equal(tokens.text_mask, expected_mask.numpy())
        prog = build_text_encoder(ck.configs.text_encoder, seq_len=tokens.seq_len,
                                  taps=ck.configs.pipeline.text_encoder_select_layers, drop_prefix=tokens.drop_prefix)
        assert max(ck.configs.pipeline.text_encoder_select_layers) == ck.configs.text_encoder.num_hidden_layers
        cos, sin = text_rope_tables(ck.configs.text_encoder, tokens.positions)
        inputs = {"input_ids": tokens.ids, "attention_mask": tokens.mask, "rope_cos": cos, "rope_sin": sin}
        out = interpret(prog, inputs, bind_text_encoder(prog, ck.text_encoder))[prog.outputs[0]]
        assert rel_l2_fn(out, expected.numpy()) <= GATE  # measured 3.2e-7 / 3.4e-7


@pytest.mark.parametrize("masked", [False, True])
def test_transformer_forward(torch, tiny_checkpoints: dict[str, Path], rel_l2_fn: RelL2, masked: bool) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    root = tiny_checkpoints["turbo"]
    ref = diffusers.Krea2Transformer2DModel.from_pretrained(root / "transformer").eval()
    ck = open_checkpoint(root)
    cfg = ck.configs.transformer
    batch, n_txt, gh, gw = 2, 7, 3, 4
    n_img = gh * gw
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((batch, n_img, cfg.in_channels)).astype(np.float32)
    taps = rng.standard_normal((batch, n_txt, cfg.num_text_layers, cfg.text_hidden_dim)).astype(np.float32)
    t_sched = np.array([967.4, 250.0], np.float32)
    text_mask = np.ones((batch, n_txt), bool)
    text_mask[0, 5:] = False
    text_mask[1, 2:4] = False
    ids = torch.from_numpy(position_ids(n_txt, gh, gw)).float()
    expected = ref(
        hidden_states=torch.from_numpy(latents),
        encoder_hidden_states=torch.from_numpy(taps),
        timestep=torch.from_numpy(t_sched) / 1000,
        position_ids=ids,
        encoder_attention_mask=torch.from_numpy(text_mask) if masked else None,
        return_dict=False,
    )[0].numpy()
    prog = build_transformer(cfg, image_len=n_img, text_len=n_txt, batch=batch, masked=masked)
    cos, sin = rope_tables(cfg, n_txt, gh, gw)
    inputs = {
        "latents": latents,
        "text_hidden_states": taps,
        "timestep_proj": timestep_proj_from_timesteps(t_sched, dim=cfg.timestep_embed_dim),
        "rope_cos": cos,
        "rope_sin": sin,
    }
    if masked:
        inputs["attention_mask"] = attention_mask(text_mask, n_img)
    out = interpret(prog, inputs, bind_transformer(prog, ck.transformer))[prog.outputs[0]]
    assert rel_l2_fn(out, expected) <= GATE  # measured 2.9e-7 (no mask), 2.9e-7 (mask)
    if masked:  # the mask matters: the unmasked program gives another answer
        plain = build_transformer(cfg, image_len=n_img, text_len=n_txt, batch=batch, masked=False)
        inputs.pop("attention_mask")
        other = interpret(plain, inputs, bind_transformer(plain, ck.transformer))[plain.outputs[0]]
        assert rel_l2_fn(other, expected) > 1e-3  # measured 5.0e-2

    # the hoisted text fusion alone reproduces the model's own text_fusion + txt_in
    fusion = build_text_fusion(cfg, text_len=n_txt, batch=batch, masked=masked)
    f_in = {"text_hidden_states": taps} | ({"text_mask": text_mask} if masked else {})
    got = interpret(fusion, f_in, bind_text_fusion(fusion, ck.transformer))[fusion.outputs[0]]
    tm = torch.from_numpy(text_mask)[:, None, None, :] if masked else None
    want = ref.txt_in(ref.text_fusion(torch.from_numpy(taps), attention_mask=tm)).numpy()
    assert rel_l2_fn(got, want) <= GATE  # measured 3.6e-7 (no mask), 3.2e-7 (mask)


def test_vae_decode(torch, tiny_checkpoints: dict[str, Path], rel_l2_fn: RelL2) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    root = tiny_checkpoints["turbo"]
    ref = diffusers.AutoencoderKLQwenImage.from_pretrained(root / "vae").eval()
    ck = open_checkpoint(root)
    z = np.random.default_rng(1).standard_normal((1, ck.configs.vae.z_dim, 3, 5)).astype(np.float32)
    expected = ref.decode(torch.from_numpy(z)[:, :, None]).sample[:, :, 0].numpy()
    assert np.std(expected) > 0.01
    prog = build_vae_decoder(ck.configs.vae, latent_h=3, latent_w=5)
    out = interpret(prog, {"latents": z}, bind_vae(prog, ck.vae))[prog.outputs[0]]
    assert out.shape == (1, 3, 24, 40)
    assert rel_l2_fn(out, expected) <= GATE  # measured 7.4e-7


def test_transformer_bf16_tracks_torch_bf16(torch, tiny_checkpoints: dict[str, Path], rel_l2_fn: RelL2) -> None:  # type: ignore[no-untyped-def]
    """bf16 program (norm weights kept fp32, as the reference keeps them) vs diffusers loaded in bf16.

    Measured: dif bf16 vs torch bf16 6.6e-3, while either bf16 run is ~0.21 away from fp32 (this tiny
    random model amplifies rounding), so dif rounds where torch rounds, not merely 'close to fp32'."""
    import ml_dtypes

    diffusers = pytest.importorskip("diffusers")
    root = tiny_checkpoints["turbo"]
    ref = diffusers.Krea2Transformer2DModel.from_pretrained(root / "transformer", torch_dtype=torch.bfloat16).eval()
    ck = open_checkpoint(root)
    cfg = ck.configs.transformer
    n_txt, gh, gw = 7, 3, 4
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((1, gh * gw, cfg.in_channels)).astype(np.float32)
    taps = rng.standard_normal((1, n_txt, cfg.num_text_layers, cfg.text_hidden_dim)).astype(np.float32)
    t_sched = np.array([967.4], np.float32)
    mask = np.ones((1, n_txt), bool)
    mask[0, 5:] = False
    expected = ref(
        torch.from_numpy(latents).bfloat16(), torch.from_numpy(taps).bfloat16(),
        (torch.from_numpy(t_sched) / 1000).bfloat16(), torch.from_numpy(position_ids(n_txt, gh, gw)).float(),
        encoder_attention_mask=torch.from_numpy(mask), return_dict=False,
    )[0].float().numpy()
    prog = build_transformer(cfg, image_len=gh * gw, text_len=n_txt, dtype="bf16")
    assert {p.type.dtype.value for p in prog.params if p.name.endswith("norm1.weight")} == {"f32"}
    bf16 = ml_dtypes.bfloat16
    cos, sin = rope_tables(cfg, n_txt, gh, gw)
    inputs = {
        "latents": latents.astype(bf16),
        "text_hidden_states": taps.astype(bf16),
        "timestep_proj": timestep_proj_from_timesteps(t_sched, dtype="bf16", dim=cfg.timestep_embed_dim),
        "rope_cos": cos,
        "rope_sin": sin,
        "attention_mask": attention_mask(mask, gh * gw),
    }
    out = interpret(prog, inputs, bind_transformer(prog, ck.transformer).materialize())[prog.outputs[0]]
    assert rel_l2_fn(out.astype(np.float32), expected) <= 3e-2  # measured 6.6e-3
