"""Gradient parity (fp32, CPU): dif's autodiff of the whole Krea 2 DiT (text fusion included, with
and without the attention mask) against torch autograd on the tiny random diffusers model, every
parameter's gradient and the latents' gradient."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dif.autodiff import grad_program
from dif.interp import interpret
from dif_frontend_krea2.model import (
    attention_mask,
    build_transformer,
    position_ids,
    rope_tables,
    timestep_proj_from_timesteps,
)
from dif_frontend_krea2.weights import bind_transformer, open_checkpoint

pytestmark = pytest.mark.oracle
GATE = 1e-5


@pytest.mark.parametrize("masked", [False, True])
def test_krea2_transformer_gradients_match_torch(
    torch, tiny_checkpoints: dict[str, Path], rel_l2_fn, masked: bool
) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    root = tiny_checkpoints["turbo"]
    ref = diffusers.Krea2Transformer2DModel.from_pretrained(root / "transformer").eval()
    ck = open_checkpoint(root)
    cfg = ck.configs.transformer
    batch, n_txt, gh, gw = 2, 5, 2, 3
    n_img = gh * gw
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((batch, n_img, cfg.in_channels)).astype(np.float32)
    taps = rng.standard_normal((batch, n_txt, cfg.num_text_layers, cfg.text_hidden_dim)).astype(np.float32)
    t_sched = np.array([967.4, 250.0], np.float32)
    text_mask = np.ones((batch, n_txt), bool)
    text_mask[0, 3:] = False
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
    names = [p.name for p in prog.params]
    grad = grad_program(prog, [*names, "latents"])
    cot = np.random.default_rng(1).standard_normal(prog.output_values[0].type.shape).astype(np.float32)
    out = interpret(grad.program, {**inputs, "cotangent.0": cot}, bind_transformer(prog, ck.transformer))

    with torch.enable_grad():
        lat = torch.from_numpy(latents).requires_grad_(True)
        y = ref(
            hidden_states=lat,
            encoder_hidden_states=torch.from_numpy(taps),
            timestep=torch.from_numpy(t_sched) / 1000,
            position_ids=torch.from_numpy(position_ids(n_txt, gh, gw)).float(),
            encoder_attention_mask=torch.from_numpy(text_mask) if masked else None,
            return_dict=False,
        )[0]
        (y * torch.from_numpy(cot)).sum().backward()
    assert rel_l2_fn(out[grad.outputs[0]], y.detach().numpy()) <= GATE
    params = dict(ref.named_parameters())
    worst = 0.0
    for name in names:
        got, want = out[grad.gradients[name]], params[name].grad
        assert want is not None, f"torch has no gradient for {name}"
        want = want.numpy()
        if name.endswith(("to_k.bias", "k_proj.bias")):  # softmax-invariant: true gradient 0, compare to weight's
            scale = float(np.linalg.norm(params[name.replace(".bias", ".weight")].grad.numpy()))
            assert float(np.linalg.norm(got)) <= GATE * scale and float(np.linalg.norm(want)) <= GATE * scale
            continue
        err = rel_l2_fn(got, want)
        worst = max(worst, err)
        assert err <= GATE, f"{name}: rel-L2 {err:.3e}"
    assert rel_l2_fn(out[grad.gradients["latents"]], lat.grad.numpy()) <= GATE
    assert sorted(names) == sorted(n for n, p in params.items() if p.grad is not None)
    print(f"krea2 DiT (masked={masked}): {len(names)} parameter gradients, worst rel-L2 {worst:.2e}")


def test_krea2_lora_gradients_match_peft(torch, tiny_checkpoints: dict[str, Path], rel_l2_fn) -> None:  # type: ignore[no-untyped-def]
    """LoRA A/B on the denoiser blocks' attention projections as differentiable inputs vs peft's."""
    diffusers = pytest.importorskip("diffusers")
    peft = pytest.importorskip("peft", reason="LoRA oracle needs peft")
    from dif.lora.slots import lora_slots, slot_inputs

    root = tiny_checkpoints["turbo"]
    ref = diffusers.Krea2Transformer2DModel.from_pretrained(root / "transformer").eval()
    ck = open_checkpoint(root)
    cfg = ck.configs.transformer
    rank, alpha = 3, 6.0
    targets = ["to_q", "to_k", "to_v", "to_out.0"]
    pattern = r"transformer_blocks\.\d+\.attn\.(to_q|to_k|to_v|to_out\.0)"
    ref = peft.get_peft_model(
        ref, peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=pattern, init_lora_weights=False)
    )
    gen = torch.Generator().manual_seed(7)
    prefix = "base_model.model."
    mods = {n[len(prefix) :]: m for n, m in ref.named_modules() if hasattr(m, "lora_A") and "default" in m.lora_A}
    assert mods and all(n.rsplit(".attn.", 1)[1] in targets for n in mods)
    for m in mods.values():
        for lin in (m.lora_A["default"], m.lora_B["default"]):
            lin.weight.data.copy_(0.3 * torch.randn(lin.weight.shape, generator=gen))
    batch, n_txt, gh, gw = 1, 4, 2, 2
    rng = np.random.default_rng(3)
    latents = rng.standard_normal((batch, gh * gw, cfg.in_channels)).astype(np.float32)
    taps = rng.standard_normal((batch, n_txt, cfg.num_text_layers, cfg.text_hidden_dim)).astype(np.float32)
    t_sched = np.array([500.0], np.float32)
    with lora_slots({f"{n}.weight": rank for n in mods}):
        prog = build_transformer(cfg, image_len=gh * gw, text_len=n_txt, batch=batch, masked=False)
    lora_in = {}
    for n, m in mods.items():
        down, up = slot_inputs(n)
        lora_in[down] = m.lora_A["default"].weight.detach().numpy()
        lora_in[up] = (m.lora_B["default"].weight.detach() * (alpha / rank)).numpy()
    grad = grad_program(prog, sorted(lora_in))
    cos, sin = rope_tables(cfg, n_txt, gh, gw)
    cot = rng.standard_normal(prog.output_values[0].type.shape).astype(np.float32)
    inputs = {
        "latents": latents, "text_hidden_states": taps, "rope_cos": cos, "rope_sin": sin, "cotangent.0": cot,
        "timestep_proj": timestep_proj_from_timesteps(t_sched, dim=cfg.timestep_embed_dim), **lora_in,
    }  # fmt: skip
    out = interpret(grad.program, inputs, bind_transformer(prog, ck.transformer))
    with torch.enable_grad():
        y = ref(
            hidden_states=torch.from_numpy(latents), encoder_hidden_states=torch.from_numpy(taps),
            timestep=torch.from_numpy(t_sched) / 1000,
            position_ids=torch.from_numpy(position_ids(n_txt, gh, gw)).float(), return_dict=False,
        )[0]  # fmt: skip
        (y * torch.from_numpy(cot)).sum().backward()
    assert rel_l2_fn(out[grad.outputs[0]], y.detach().numpy()) <= GATE
    for n, m in mods.items():
        down, up = slot_inputs(n)
        assert rel_l2_fn(out[grad.gradients[down]], m.lora_A["default"].weight.grad.numpy()) <= GATE, down
        assert rel_l2_fn(out[grad.gradients[up]] * (alpha / rank), m.lora_B["default"].weight.grad.numpy()) <= GATE, up
