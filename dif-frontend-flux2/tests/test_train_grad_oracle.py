"""Gradient parity (fp32, CPU): dif's autodiff of the klein transformer and the FLUX.2 VAE decoder
against torch autograd on the same tiny random diffusers models, every parameter's gradient, and the
gradients of unmerged LoRA adapters (A/B as separate differentiable inputs)."""

from __future__ import annotations

import numpy as np
import pytest

from dif.autodiff import grad_program
from dif.interp import interpret
from dif.lora.slots import lora_slots, slot_inputs
from dif_frontend_flux2.config import Flux2TransformerConfig, Flux2VaeConfig
from dif_frontend_flux2.model import build_transformer, flux2_rope_tables
from dif_frontend_flux2.vae import build_vae_decoder

pytestmark = pytest.mark.oracle
GATE = 1e-5


def _klein_case(torch, tmp_path, tiny_transformer, load_weights):  # type: ignore[no-untyped-def]
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

    ref = tiny_transformer(False)
    ref.save_pretrained(tmp_path)
    cfg = Flux2TransformerConfig.from_json(tmp_path / "config.json")
    batch, gh, gw, n_txt = 2, 2, 3, 4
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((batch, gh * gw, cfg.in_channels)).astype(np.float32)
    text = rng.standard_normal((batch, n_txt, cfg.joint_attention_dim)).astype(np.float32)
    t = torch.tensor([0.9, 0.3])
    cos, sin = flux2_rope_tables(n_txt, gh, gw, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
    inputs = {
        "latents": latents,
        "text_features": text,
        "timestep_proj": ref.time_guidance_embed.time_proj(t * 1000).numpy(),
        "rope_cos": cos,
        "rope_sin": sin,
    }
    torch_call = dict(
        hidden_states=torch.from_numpy(latents),
        encoder_hidden_states=torch.from_numpy(text),
        timestep=t,
        img_ids=Flux2KleinPipeline._prepare_latent_ids(torch.zeros(batch, cfg.in_channels, gh, gw)),
        txt_ids=Flux2KleinPipeline._prepare_text_ids(torch.zeros(batch, n_txt, 1)),
        return_dict=False,
    )
    return ref, cfg, inputs, torch_call, load_weights(tmp_path), (batch, gh * gw, n_txt)


def test_klein_transformer_gradients_match_torch(torch, tmp_path, tiny_transformer, load_weights, rel_l2_fn):  # type: ignore[no-untyped-def]
    ref, cfg, inputs, call, weights, (batch, n_img, n_txt) = _klein_case(
        torch, tmp_path, tiny_transformer, load_weights
    )
    prog = build_transformer(cfg, batch=batch, n_img=n_img, n_txt=n_txt)
    names = [p.name for p in prog.params]
    grad = grad_program(prog, names + ["latents"])
    cot = np.random.default_rng(1).standard_normal(prog.output_values[0].type.shape).astype(np.float32)
    out = interpret(grad.program, {**inputs, "cotangent.0": cot}, weights)

    with torch.enable_grad():
        lat = call["hidden_states"].clone().requires_grad_(True)
        y = ref(**{**call, "hidden_states": lat})[0]
        (y * torch.from_numpy(cot)).sum().backward()
    assert rel_l2_fn(out[grad.outputs[0]], y.detach().numpy()) <= GATE
    params = dict(ref.named_parameters())
    worst = 0.0
    for name in names:
        want = params[name].grad
        assert want is not None, f"torch has no gradient for {name}"
        err = rel_l2_fn(out[grad.gradients[name]], want.numpy())
        worst = max(worst, err)
        assert err <= GATE, f"{name}: rel-L2 {err:.3e}"
    assert rel_l2_fn(out[grad.gradients["latents"]], lat.grad.numpy()) <= GATE
    assert len(names) == len([p for p in params.values() if p.grad is not None])  # every torch gradient compared
    print(f"klein transformer: {len(names)} parameter gradients, worst rel-L2 {worst:.2e}")


def test_klein_lora_gradients_match_peft(torch, tmp_path, tiny_transformer, load_weights, rel_l2_fn):  # type: ignore[no-untyped-def]
    peft = pytest.importorskip("peft", reason="LoRA oracle needs peft")
    ref, cfg, inputs, call, weights, (batch, n_img, n_txt) = _klein_case(
        torch, tmp_path, tiny_transformer, load_weights
    )
    rank, alpha = 4, 8.0
    targets = ["to_q", "to_k", "to_v", "to_out.0", "to_qkv_mlp_proj"]
    ref = peft.get_peft_model(
        ref, peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=False)
    )
    gen = torch.Generator().manual_seed(5)
    lora_modules = {n: m for n, m in ref.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
    for m in lora_modules.values():
        for lin in (m.lora_A["default"], m.lora_B["default"]):
            lin.weight.data.copy_(0.3 * torch.randn(lin.weight.shape, generator=gen))
    prefix = "base_model.model."
    slots = {n[len(prefix) :] + ".weight": rank for n in lora_modules}
    with lora_slots(slots):
        prog = build_transformer(cfg, batch=batch, n_img=n_img, n_txt=n_txt)
    scale = alpha / rank
    lora_in = {}
    for n, m in lora_modules.items():
        down, up = slot_inputs(n[len(prefix) :])
        lora_in[down] = m.lora_A["default"].weight.detach().numpy()
        lora_in[up] = (m.lora_B["default"].weight.detach() * scale).numpy()  # the slot holds the scaled up
    wrt = sorted(lora_in)
    grad = grad_program(prog, wrt)
    cot = np.random.default_rng(2).standard_normal(prog.output_values[0].type.shape).astype(np.float32)
    out = interpret(grad.program, {**inputs, **lora_in, "cotangent.0": cot}, weights)
    with torch.enable_grad():
        y = ref(**call)[0]
        (y * torch.from_numpy(cot)).sum().backward()
    assert rel_l2_fn(out[grad.outputs[0]], y.detach().numpy()) <= GATE
    for n, m in lora_modules.items():
        down, up = slot_inputs(n[len(prefix) :])
        ga = m.lora_A["default"].weight.grad.numpy()
        gb = m.lora_B["default"].weight.grad.numpy()
        assert rel_l2_fn(out[grad.gradients[down]], ga) <= GATE, down
        # d/dB of (scale * B) A x: the slot's gradient is torch's divided by scale
        assert rel_l2_fn(out[grad.gradients[up]] * scale, gb) <= GATE, up
    assert len(lora_modules) == 5  # double block: to_q, to_k, to_v, to_out.0; single block: to_qkv_mlp_proj
    assert set(lora_in) <= {v.name for v in prog.inputs}


def test_vae_decoder_gradients_match_torch(torch, tmp_path, randomize, load_weights, rel_l2_fn):  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    torch.manual_seed(0)
    tiny = dict(
        block_out_channels=(16, 32), down_block_types=("DownEncoderBlock2D",) * 2,
        up_block_types=("UpDecoderBlock2D",) * 2, layers_per_block=1, norm_num_groups=8, latent_channels=4,
    )  # fmt: skip
    vae = diffusers.AutoencoderKLFlux2(**tiny).eval()
    randomize(vae, torch, seed=3)
    vae.save_pretrained(tmp_path)
    cfg = Flux2VaeConfig.from_json(tmp_path / "config.json")
    weights = load_weights(tmp_path)
    batch, lh, lw = 1, 4, 6
    prog = build_vae_decoder(cfg, batch=batch, latent_h=lh, latent_w=lw)
    names = [p.name for p in prog.params]
    grad = grad_program(prog, names + ["latent"])
    latent = np.random.default_rng(0).standard_normal((batch, cfg.latent_channels, lh, lw)).astype(np.float32)
    cot = np.random.default_rng(1).standard_normal(prog.output_values[0].type.shape).astype(np.float32)
    out = interpret(grad.program, {"latent": latent, "cotangent.0": cot}, weights)
    with torch.enable_grad():
        z = torch.from_numpy(latent).requires_grad_(True)
        y = vae.decode(z, return_dict=False)[0]
        (y * torch.from_numpy(cot)).sum().backward()
    params = dict(vae.named_parameters())
    worst = 0.0
    for name in names:
        got, want = out[grad.gradients[name]], params[name].grad.numpy()
        if name.endswith("to_k.bias"):
            # a key bias shifts every logit of a query by the same q.b: softmax ignores it, the true
            # gradient is 0 and both sides hold rounding noise. Judge it against the key weight's.
            scale = float(np.linalg.norm(params[name.replace(".bias", ".weight")].grad.numpy()))
            assert float(np.linalg.norm(got)) <= GATE * scale and float(np.linalg.norm(want)) <= GATE * scale
            continue
        err = rel_l2_fn(got, want)
        worst = max(worst, err)
        assert err <= GATE, f"{name}: rel-L2 {err:.3e}"
    assert rel_l2_fn(out[grad.gradients["latent"]], z.grad.numpy()) <= GATE
    decoder_grads = [n for n, p in params.items() if p.grad is not None]
    assert sorted(decoder_grads) == sorted(names)
    print(f"VAE decoder: {len(names)} parameter gradients, worst rel-L2 {worst:.2e}")


def test_qwen3_text_encoder_gradients_match_torch(torch, tmp_path, load_weights, tiny_qwen3, rel_l2_fn):  # type: ignore[no-untyped-def]
    """The text stack too (causal + key-padding sdpa with GQA, Qwen's rms norms, the embedding table's
    gradient as a one-hot matmul): every parameter of the built layers, through three taps."""
    from dif_frontend_flux2.config import Qwen3Config
    from dif_frontend_flux2.text_encoder import build_text_encoder, qwen3_rope_tables

    taps = (1, 3, 4)
    model = tiny_qwen3
    model.save_pretrained(tmp_path)
    cfg = Qwen3Config.from_json(tmp_path / "config.json")
    batch, seq = 2, 7
    rng = np.random.default_rng(0)
    ids = rng.integers(0, cfg.vocab_size, (batch, seq)).astype(np.int64)
    mask = np.arange(seq)[None, :] < np.array([seq, 4])[:, None]
    prog = build_text_encoder(cfg, batch=batch, seq_len=seq, taps=taps)
    names = [p.name for p in prog.params]
    grad = grad_program(prog, names)
    cot = rng.standard_normal(prog.output_values[0].type.shape).astype(np.float32)
    cos, sin = qwen3_rope_tables(cfg, seq)
    inputs = {"input_ids": ids, "attention_mask": mask, "rope_cos": cos, "rope_sin": sin, "cotangent.0": cot}
    out = interpret(grad.program, inputs, load_weights(tmp_path))
    with torch.enable_grad():
        hs = model(input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask.astype(np.int64)),
                   output_hidden_states=True, use_cache=False).hidden_states  # fmt: skip
        feats = torch.cat([hs[k] for k in taps], dim=-1)
        (feats * torch.from_numpy(cot)).sum().backward()
    params = dict(model.named_parameters())
    worst = 0.0
    for name in names:
        got, want = out[grad.gradients[name]], params[name].grad
        assert want is not None, name
        err = rel_l2_fn(got, want.numpy())
        worst = max(worst, err)
        assert err <= GATE, f"{name}: rel-L2 {err:.3e}"
    assert "model.embed_tokens.weight" in names
    print(f"Qwen3 text encoder: {len(names)} parameter gradients, worst rel-L2 {worst:.2e}")
