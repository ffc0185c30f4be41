"""Unmerged LoRA: the FLUX.2 transformer built with a side-GEMM slot on every linear (rank padded to
16) runs LoRA A, then LoRA B, then none, by changing only its adapter inputs, and each run equals the
merged weights' run and diffusers' `load_lora_weights` (fp32, rel-L2 <= 1e-5). One program object
for all three: nothing is rebuilt. The CUDA version (one prepare, one captured graph, adapters
swapped) is tests/test_lora_swap_cuda.py."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from dif.errors import WeightError
from dif.interp import interpret
from dif.lora import LoraSpec, adapter_inputs, lora_slots, match_loras, slot_ranks
from dif.serialize.diftensor import save_tensors
from dif.weights import bind_weights, open_component
from dif_frontend_flux2.config import Flux2TransformerConfig
from dif_frontend_flux2.model import build_transformer, flux2_rope_tables
from dif_frontend_flux2.weights import lora_table, merge_transformer_loras

pytestmark = pytest.mark.oracle
SLOT_RANK = 16


def random_lora(model, rank: int, seed: int, path: Path, kohya: bool) -> Path:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    t: dict[str, np.ndarray] = {}
    for name, p in model.named_parameters():
        if p.ndim != 2:
            continue
        module = name[: -len(".weight")]
        o, i = p.shape
        a = (rng.standard_normal((rank, i)) / np.sqrt(i)).astype(np.float32)
        b = (0.3 * rng.standard_normal((o, rank)) / np.sqrt(rank)).astype(np.float32)
        if kohya:
            key = "lora_unet_" + module.replace(".", "_")
            t[f"{key}.lora_down.weight"], t[f"{key}.lora_up.weight"] = a, b * 2
            t[f"{key}.alpha"] = np.array(rank / 2, np.float32)
        else:
            t[f"transformer.{module}.lora_A.weight"], t[f"transformer.{module}.lora_B.weight"] = a, b
    save_tensors(path, t, dif_metadata=False)
    return path


@pytest.fixture
def setup(torch, tmp_path, tiny_transformer):  # type: ignore[no-untyped-def]
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

    model = tiny_transformer(False)
    folder = tmp_path / "transformer"
    model.save_pretrained(folder)
    cfg = Flux2TransformerConfig.from_json(folder / "config.json")
    gh, gw, n_txt = 2, 3, 5
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((1, gh * gw, cfg.in_channels)).astype(np.float32)
    text = rng.standard_normal((1, n_txt, cfg.joint_attention_dim)).astype(np.float32)
    t = np.array([0.6], np.float32)
    cos, sin = flux2_rope_tables(n_txt, gh, gw, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
    inputs = {
        "latents": latents,
        "text_features": text,
        "rope_cos": cos,
        "rope_sin": sin,
        "timestep_proj": model.time_guidance_embed.time_proj(torch.from_numpy(t) * 1000).numpy(),
    }
    torch_in = dict(
        hidden_states=torch.from_numpy(latents),
        encoder_hidden_states=torch.from_numpy(text),
        timestep=torch.from_numpy(t),
        img_ids=Flux2KleinPipeline._prepare_latent_ids(torch.zeros(1, cfg.in_channels, gh, gw)),
        txt_ids=Flux2KleinPipeline._prepare_text_ids(torch.zeros(1, n_txt, 1)),
        guidance=None,
        return_dict=False,
    )
    return model, folder, cfg, inputs, torch_in, (gh * gw, n_txt)


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


def test_adapters_swap_as_inputs(torch, setup, tmp_path):  # type: ignore[no-untyped-def]
    pytest.importorskip("peft", reason="diffusers' LoRA loader needs peft")
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

    model, folder, cfg, inputs, torch_in, (n_img, n_txt) = setup
    base = open_component(folder)
    table = lora_table(base)
    lora_a = random_lora(model, 8, 1, tmp_path / "a.safetensors", kohya=False)
    lora_b = random_lora(model, 4, 2, tmp_path / "b.safetensors", kohya=True)
    every = {n: SLOT_RANK for n in table.values() for n in [t.param for t in n]}
    with lora_slots(every):
        prog = build_transformer(cfg, batch=1, n_img=n_img, n_txt=n_txt)
    assert sum(1 for v in prog.inputs if v.name.startswith("lora.")) == 2 * len(every)
    weights = bind_weights(prog, base)

    def unmerged(specs: list[LoraSpec]) -> np.ndarray:
        patches, _ = match_loras(base, specs, table, family="flux2", model="FLUX.2 [klein]")
        assert all(r <= SLOT_RANK for r in slot_ranks(patches).values())
        return interpret(prog, {**inputs, **adapter_inputs(prog, patches)}, weights)[prog.outputs[0]]

    def merged(specs: list[LoraSpec]) -> np.ndarray:
        plain = build_transformer(cfg, batch=1, n_img=n_img, n_txt=n_txt)
        source = merge_transformer_loras(open_component(folder), specs)
        return interpret(plain, inputs, bind_weights(plain, source))[plain.outputs[0]]

    def diffusers_out(path: Path, scale: float) -> np.ndarray:
        pipe = Flux2KleinPipeline(
            scheduler=None, vae=None, text_encoder=None, tokenizer=None, transformer=copy.deepcopy(model)
        )
        pipe.load_lora_weights(str(path), adapter_name="x")
        pipe.set_adapters(["x"], adapter_weights=[scale])
        return pipe.transformer(**torch_in)[0].numpy()

    out = unmerged([LoraSpec(lora_a, 0.8)])
    assert rel(out, merged([LoraSpec(lora_a, 0.8)])) <= 1e-5  # measured ~2e-7
    assert rel(out, diffusers_out(lora_a, 0.8)) <= 1e-5
    # kohya over flattened diffusers names: diffusers' kohya converter expects BFL names and loads
    # nothing (a warning); dif's merge is the reference here (itself checked in test_lora.py)
    swapped = [LoraSpec(lora_b, -0.5)]
    assert rel(unmerged(swapped), merged(swapped)) <= 1e-5
    both = [LoraSpec(lora_a, 0.3), LoraSpec(lora_b, 0.6)]  # two adapters share each slot (8 + 4 <= 16)
    assert rel(unmerged(both), merged(both)) <= 1e-5
    none = interpret(prog, {**inputs, **adapter_inputs(prog, {})}, weights)[prog.outputs[0]]
    assert np.array_equal(none, merged([]))  # zero adapters add exactly nothing
    assert rel(none, model(**torch_in)[0].numpy()) <= 1e-5


def test_an_adapter_larger_than_its_slot_is_refused(torch, setup, tmp_path):  # type: ignore[no-untyped-def]
    model, folder, cfg, _, _, (n_img, n_txt) = setup
    base = open_component(folder)
    table = lora_table(base)
    big = random_lora(model, 24, 3, tmp_path / "big.safetensors", kohya=False)
    with lora_slots({"proj_out.weight": SLOT_RANK}):
        prog = build_transformer(cfg, batch=1, n_img=n_img, n_txt=n_txt)
    patches, _ = match_loras(base, [big], table, family="flux2", model="FLUX.2 [klein]")
    with pytest.raises(WeightError, match="slot rank 16"):
        slot_ranks(patches, SLOT_RANK)
    with pytest.raises(WeightError, match=r"rank 24 does not fit the slot of 'proj_out'"):
        adapter_inputs(prog, {"proj_out.weight": patches["proj_out.weight"]})
    with pytest.raises(WeightError, match="has no LoRA slot for"):
        adapter_inputs(prog, {k: v for k, v in patches.items() if k != "proj_out.weight"})
