"""LoRA merged at prepare, FLUX.2 [klein]: one set of random adapters written in every dialect
gives the transformer output of diffusers' own loader (`load_lora_weights`), fp32, tiny config.

Dialects diffusers 0.42.1 loads for Flux2 (read from `Flux2LoraLoaderMixin.lora_state_dict`):
diffusers/PEFT `transformer.*.lora_A/B`, PEFT `base_model.model.*` (read as BFL names), kohya
`lora_unet_*` (BFL names, alpha), ai-toolkit `diffusion_model.*` (BFL names, fused qkv), LyCORIS
LoKr `lycoris_*`. OneTrainer (`lora_transformer_*`), LoHa and adapters on the modulation / final
adaLN layers are not loaded by it (the kohya converter drops them with a warning; its ai-toolkit
converter maps `final_layer.adaLN_modulation.1` without the (shift, scale) swap the base weight
gets), so those are checked against the weights merged by hand, W + scale * B @ A, run by torch.
"""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import numpy as np
import pytest

from dif.errors import UsageError, WeightError
from dif.interp import interpret
from dif.lora import LoraSpec, read_lora
from dif.serialize.diftensor import save_tensors
from dif.weights import bind_weights, open_component
from dif_frontend_flux2.config import Flux2TransformerConfig
from dif_frontend_flux2.model import build_transformer, flux2_rope_tables
from dif_frontend_flux2.weights import lora_table, merge_transformer_loras

pytestmark = pytest.mark.oracle

RANK = 4
# diffusers module -> (BFL module, chunk of a fused qkv or None)
DOUBLE_QKV = {"to_q": ("img_attn.qkv", 0), "to_k": ("img_attn.qkv", 1), "to_v": ("img_attn.qkv", 2)}
DOUBLE_QKV.update({"add_q_proj": ("txt_attn.qkv", 0), "add_k_proj": ("txt_attn.qkv", 1)})
DOUBLE_QKV["add_v_proj"] = ("txt_attn.qkv", 2)
DOUBLE_OTHER = {
    "attn.to_out.0": "img_attn.proj",
    "attn.to_add_out": "txt_attn.proj",
    "ff.linear_in": "img_mlp.0",
    "ff.linear_out": "img_mlp.2",
    "ff_context.linear_in": "txt_mlp.0",
    "ff_context.linear_out": "txt_mlp.2",
}
SINGLE = {"attn.to_qkv_mlp_proj": "linear1", "attn.to_out": "linear2"}
TOP = {
    "x_embedder": "img_in",
    "context_embedder": "txt_in",
    "proj_out": "final_layer.linear",
    "time_guidance_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_guidance_embed.timestep_embedder.linear_2": "time_in.out_layer",
}
TOP_EXTRA = {  # adapted only in the hand-merged checks (diffusers' kohya converter drops them)
    "single_stream_modulation.linear": "single_stream_modulation.lin",
    "double_stream_modulation_img.linear": "double_stream_modulation_img.lin",
    "double_stream_modulation_txt.linear": "double_stream_modulation_txt.lin",
    "norm_out.linear": "final_layer.adaLN_modulation.1",
}


def bfl_name(module: str) -> tuple[str, int | None]:
    """diffusers module -> (BFL module, qkv chunk)."""
    if module in TOP or module in TOP_EXTRA:
        return {**TOP, **TOP_EXTRA}[module], None
    m = re.fullmatch(r"transformer_blocks\.(\d+)\.(.+)", module)
    if m:
        i, inner = m[1], m[2]
        if inner.startswith("attn.") and inner[5:] in DOUBLE_QKV:
            bfl, chunk = DOUBLE_QKV[inner[5:]]
            return f"double_blocks.{i}.{bfl}", chunk
        return f"double_blocks.{i}.{DOUBLE_OTHER[inner]}", None
    m = re.fullmatch(r"single_transformer_blocks\.(\d+)\.(.+)", module)
    assert m, module
    return f"single_blocks.{m[1]}.{SINGLE[m[2]]}", None


def random_lora(model, torch, *, extra: bool, seed: int = 3) -> dict[str, tuple[np.ndarray, np.ndarray]]:  # type: ignore[no-untyped-def]
    """diffusers module -> (A [r, in], B [out, r]) for every linear the dialects share (+ modulation
    and final adaLN when `extra`). B is not zero (unlike a fresh PEFT init) so every delta counts."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in model.named_parameters():
        if p.ndim != 2 or not name.endswith(".weight"):
            continue
        module = name[: -len(".weight")]
        if module in TOP_EXTRA and not extra:
            continue
        o, i = p.shape
        a = (rng.standard_normal((RANK, i)) / np.sqrt(i)).astype(np.float32)
        b = (0.3 * rng.standard_normal((o, RANK)) / np.sqrt(RANK)).astype(np.float32)
        out[module] = (a, b)
    return out


def fuse(lora: dict[str, tuple[np.ndarray, np.ndarray]]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """BFL module -> (A, B): separate q/k/v adapters become one fused-qkv adapter of rank 3r
    (A stacked, B block-diagonal), so its delta is exactly the three deltas stacked by rows."""
    groups: dict[str, list[tuple[int | None, np.ndarray, np.ndarray]]] = {}
    for module, (a, b) in lora.items():
        bfl, chunk = bfl_name(module)
        groups.setdefault(bfl, []).append((chunk, a, b))
    out = {}
    for bfl, items in groups.items():
        if items[0][0] is None:
            a, b = items[0][1:]
            if bfl == "final_layer.adaLN_modulation.1":  # BFL rows are (shift, scale), diffusers' (scale, shift)
                b = np.concatenate(np.split(b, 2, axis=0)[::-1], axis=0)
            out[bfl] = (a, b)
            continue
        items.sort(key=lambda t: t[0])
        a = np.concatenate([i[1] for i in items], axis=0)
        rows = sum(i[2].shape[0] for i in items)
        b = np.zeros((rows, a.shape[0]), np.float32)
        r0 = 0
        for k, (_, _, bk) in enumerate(items):
            b[r0 : r0 + bk.shape[0], k * RANK : (k + 1) * RANK] = bk
            r0 += bk.shape[0]
        out[bfl] = (a, b)
    return out


def write_dialect(lora, dialect: str, path: Path) -> Path:  # type: ignore[no-untyped-def]
    """The adapters of `random_lora` in one dialect's layout (same deltas; alpha folded back in)."""
    t: dict[str, np.ndarray] = {}
    if dialect == "diffusers":
        for m, (a, b) in lora.items():
            t[f"transformer.{m}.lora_A.weight"], t[f"transformer.{m}.lora_B.weight"] = a, b
    elif dialect in ("peft", "ai-toolkit"):
        prefix = "base_model.model." if dialect == "peft" else "diffusion_model."
        for m, (a, b) in fuse(lora).items():
            t[f"{prefix}{m}.lora_A.weight"], t[f"{prefix}{m}.lora_B.weight"] = a, b
    elif dialect == "kohya":
        for m, (a, b) in fuse(lora).items():
            key, rank = "lora_unet_" + m.replace(".", "_"), a.shape[0]
            alpha = rank / 2  # scale alpha / rank = 0.5, compensated in lora_up
            t[f"{key}.lora_down.weight"], t[f"{key}.lora_up.weight"] = a, b * 2.0
            t[f"{key}.alpha"] = np.array(alpha, np.float32)
    elif dialect == "onetrainer":
        for m, (a, b) in lora.items():
            key = "lora_transformer_" + m.replace(".", "_")
            t[f"{key}.lora_down.weight"], t[f"{key}.lora_up.weight"] = a, b * 4.0
            t[f"{key}.alpha"] = np.array(RANK / 4, np.float32)
    elif dialect == "onetrainer-dotted":
        for m, (a, b) in lora.items():
            t[f"transformer.{m}.lora_down.weight"], t[f"transformer.{m}.lora_up.weight"] = a, b
            t[f"transformer.{m}.alpha"] = np.array(float(RANK), np.float32)
    else:
        raise AssertionError(dialect)
    save_tensors(path, t, dif_metadata=False)
    return path


# -- the oracles ---------------------------------------------------------------------------------


def run_inputs(cfg, torch):  # type: ignore[no-untyped-def]
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

    gh, gw, n_txt = 2, 3, 5
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((1, gh * gw, cfg.in_channels)).astype(np.float32)
    text = rng.standard_normal((1, n_txt, cfg.joint_attention_dim)).astype(np.float32)
    t = np.array([0.7], np.float32)
    img_ids = Flux2KleinPipeline._prepare_latent_ids(torch.zeros(1, cfg.in_channels, gh, gw))
    txt_ids = Flux2KleinPipeline._prepare_text_ids(torch.zeros(1, n_txt, 1))
    torch_in = dict(
        hidden_states=torch.from_numpy(latents),
        encoder_hidden_states=torch.from_numpy(text),
        timestep=torch.from_numpy(t),
        img_ids=img_ids,
        txt_ids=txt_ids,
        guidance=None,
        return_dict=False,
    )
    cos, sin = flux2_rope_tables(n_txt, gh, gw, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
    return gh * gw, n_txt, torch_in, dict(latents=latents, text_features=text, rope_cos=cos, rope_sin=sin), t


def dif_forward(folder: Path, loras, torch, model) -> np.ndarray:  # type: ignore[no-untyped-def]
    cfg = Flux2TransformerConfig.from_json(folder / "config.json")
    n_img, n_txt, _, inputs, t = run_inputs(cfg, torch)
    prog = build_transformer(cfg, batch=1, n_img=n_img, n_txt=n_txt)
    source = merge_transformer_loras(open_component(folder), loras)
    inputs = dict(inputs, timestep_proj=model.time_guidance_embed.time_proj(torch.from_numpy(t) * 1000).numpy())
    return interpret(prog, inputs, bind_weights(prog, source))[prog.outputs[0]]


def torch_forward(model, torch) -> np.ndarray:  # type: ignore[no-untyped-def]
    _, _, torch_in, _, _ = run_inputs(model.config, torch)
    return model(**torch_in)[0].numpy()


def hand_merged(model, lora, torch, scale: float = 1.0):  # type: ignore[no-untyped-def]
    merged = copy.deepcopy(model)
    params = dict(merged.named_parameters())
    for m, (a, b) in lora.items():
        params[f"{m}.weight"].data += scale * torch.from_numpy(b @ a)
    return merged


def diffusers_loaded(model, path: Path, torch, scale: float = 1.0):  # type: ignore[no-untyped-def]
    """`pipe.load_lora_weights(file)` on a pipeline holding only this transformer."""
    pytest.importorskip("peft", reason="diffusers' LoRA loader needs peft")
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

    pipe = Flux2KleinPipeline(
        scheduler=None, vae=None, text_encoder=None, tokenizer=None, transformer=copy.deepcopy(model)
    )
    pipe.load_lora_weights(str(path), adapter_name="x")
    if scale != 1.0:
        pipe.set_adapters(["x"], adapter_weights=[scale])
    return pipe.transformer


@pytest.fixture
def base(torch, tmp_path, tiny_transformer):  # type: ignore[no-untyped-def]
    model = tiny_transformer(False)
    model.save_pretrained(tmp_path / "transformer")
    return model, tmp_path / "transformer"


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


@pytest.mark.parametrize("dialect", ["diffusers", "peft", "ai-toolkit", "kohya"])
def test_dialect_matches_diffusers_loader(torch, base, tmp_path, dialect):  # type: ignore[no-untyped-def]
    model, folder = base
    lora = random_lora(model, torch, extra=False)
    path = write_dialect(lora, dialect, tmp_path / f"{dialect}.safetensors")
    assert read_lora(path).dialect == dialect
    expected = torch_forward(diffusers_loaded(model, path, torch, scale=0.8), torch)
    plain = torch_forward(model, torch)
    assert rel(plain, expected) > 1e-2, "the LoRA must change the output for the test to mean anything"
    # the loader's result is the hand merge (a check of the oracle itself)
    assert rel(torch_forward(hand_merged(model, lora, torch, 0.8), torch), expected) <= 1e-5
    out = dif_forward(folder, [LoraSpec(path, 0.8)], torch, model)
    err = rel(out, expected)
    # measured: 2-3e-07 for each dialect
    assert err <= 1e-5, f"{dialect}: rel-L2 {err:.3e} vs diffusers load_lora_weights"


@pytest.mark.parametrize("dialect", ["onetrainer", "onetrainer-dotted", "diffusers", "ai-toolkit", "kohya"])
def test_dialect_matches_hand_merge_with_modulation(torch, base, tmp_path, dialect):  # type: ignore[no-untyped-def]
    """Every linear adapted, the shared modulation and the final adaLN too (dialects and layers
    diffusers does not load): reference W + scale * B @ A in torch."""
    model, folder = base
    lora = random_lora(model, torch, extra=True, seed=5)
    path = write_dialect(lora, dialect, tmp_path / f"{dialect}.safetensors")
    expected = torch_forward(hand_merged(model, lora, torch, 1.5), torch)
    out = dif_forward(folder, [f"{path}:1.5"], torch, model)
    err = rel(out, expected)
    assert err <= 1e-5, f"{dialect}: rel-L2 {err:.3e} vs the hand merge"


def test_two_loras_add(torch, base, tmp_path):  # type: ignore[no-untyped-def]
    model, folder = base
    first, second = random_lora(model, torch, extra=False, seed=7), random_lora(model, torch, extra=False, seed=8)
    p1 = write_dialect(first, "kohya", tmp_path / "a.safetensors")
    p2 = write_dialect(second, "diffusers", tmp_path / "b.safetensors")
    expected = torch_forward(hand_merged(hand_merged(model, first, torch, 0.5), second, torch, -0.7), torch)
    out = dif_forward(folder, [LoraSpec(p1, 0.5), LoraSpec(p2, -0.7)], torch, model)
    assert rel(out, expected) <= 1e-5


def lokr_factors(model, rng, modules):  # type: ignore[no-untyped-def]
    params = dict(model.named_parameters())
    out = {}
    for m in modules:
        o, i = params[f"{m}.weight"].shape
        w1 = rng.standard_normal((4, 4)).astype(np.float32) * 0.3
        w2a = rng.standard_normal((o // 4, 2)).astype(np.float32) * 0.3
        w2b = rng.standard_normal((2, i // 4)).astype(np.float32) / np.sqrt(i)
        out[m] = (w1, w2a, w2b)
    return out


def test_lokr_matches_diffusers_loader(torch, base, tmp_path):  # type: ignore[no-untyped-def]
    """LyCORIS LoKr (w1 full, w2 = w2_a @ w2_b, alpha): diffusers maps `lycoris_` block modules."""
    model, folder = base
    rng = np.random.default_rng(11)
    modules = [
        "transformer_blocks.0.attn.to_q",
        "transformer_blocks.0.ff.linear_in",
        "single_transformer_blocks.0.attn.to_out",
    ]
    factors = lokr_factors(model, rng, modules)
    t = {}
    for m, (w1, w2a, w2b) in factors.items():
        key = "lycoris_" + m.replace(".", "_")
        t[f"{key}.lokr_w1"], t[f"{key}.lokr_w2_a"], t[f"{key}.lokr_w2_b"] = w1, w2a, w2b
        t[f"{key}.alpha"] = np.array(1.0, np.float32)  # scale alpha / rank = 1 / 2
    path = tmp_path / "lokr.safetensors"
    save_tensors(path, t, dif_metadata=False)
    merged = copy.deepcopy(model)
    params = dict(merged.named_parameters())
    for m, (w1, w2a, w2b) in factors.items():
        params[f"{m}.weight"].data += torch.from_numpy(np.kron(w1, w2a @ w2b) * 0.5)
    by_hand = torch_forward(merged, torch)
    out = dif_forward(folder, [path], torch, model)
    assert rel(out, by_hand) <= 1e-5, "vs the hand merge"
    try:
        loaded = diffusers_loaded(model, path, torch)
    except (ValueError, ImportError, TypeError, KeyError) as exc:  # peft without LoKr injection for this model
        pytest.skip(f"diffusers could not load the LoKr file here: {exc}")
    expected = torch_forward(loaded, torch)
    assert rel(by_hand, expected) <= 1e-5, "diffusers' LoKr is the hand merge (oracle self-check)"
    assert rel(out, expected) <= 1e-5


def test_loha_matches_hand_merge(torch, base, tmp_path):  # type: ignore[no-untyped-def]
    model, folder = base
    rng = np.random.default_rng(12)
    params = dict(model.named_parameters())
    merged = copy.deepcopy(model)
    mparams = dict(merged.named_parameters())
    t = {}
    for m in ["transformer_blocks.0.attn.add_k_proj", "single_transformer_blocks.0.attn.to_qkv_mlp_proj"]:
        o, i = params[f"{m}.weight"].shape
        f = [rng.standard_normal(s).astype(np.float32) * 0.4 for s in ((o, 3), (3, i), (o, 3), (3, i))]
        key = "lycoris_" + m.replace(".", "_")
        for part, v in zip(("hada_w1_a", "hada_w1_b", "hada_w2_a", "hada_w2_b"), f, strict=True):
            t[f"{key}.{part}"] = v
        t[f"{key}.alpha"] = np.array(1.5, np.float32)
        mparams[f"{m}.weight"].data += torch.from_numpy(((f[0] @ f[1]) * (f[2] @ f[3])) * 0.5)
    path = tmp_path / "loha.safetensors"
    save_tensors(path, t, dif_metadata=False)
    assert rel(torch_forward(merged, torch), torch_forward(model, torch)) > 1e-3
    assert rel(dif_forward(folder, [path], torch, model), torch_forward(merged, torch)) <= 1e-5


# -- refusals (no oracle needed, but the tiny base comes from diffusers) ----------------------------


def test_unmatched_keys_are_listed(torch, base, tmp_path):  # type: ignore[no-untyped-def]
    model, folder = base
    lora = random_lora(model, torch, extra=False)
    path = write_dialect(lora, "diffusers", tmp_path / "x.safetensors")
    t = {k: np.array(v) for k, v in read_lora(path).source.items()}
    t["transformer.transformer_blocks.0.attn.to_zz.lora_A.weight"] = np.zeros((4, 64), np.float32)
    t["transformer.transformer_blocks.0.attn.to_zz.lora_B.weight"] = np.zeros((64, 4), np.float32)
    t["transformer.something_else"] = np.zeros(3, np.float32)
    save_tensors(path, t, dif_metadata=False)
    with pytest.raises(WeightError, match=r"(?s)3 of .* LoRA keys match no module.*to_zz.lora_A.*something_else"):
        merge_transformer_loras(open_component(folder), [path])
    with pytest.warns(match="match no module"):
        merged = merge_transformer_loras(open_component(folder), [path], allow_unmatched=True)
    assert "transformer_blocks.0.attn.to_q.weight" in merged.merged  # type: ignore[attr-defined]


def test_other_family_is_refused(torch, base, tmp_path):  # type: ignore[no-untyped-def]
    _, folder = base
    flux1 = {
        "lora_unet_double_blocks_0_img_mod_lin.lora_down.weight": np.zeros((4, 64), np.float32),
        "lora_unet_double_blocks_0_img_mod_lin.lora_up.weight": np.zeros((384, 4), np.float32),
        "lora_unet_double_blocks_0_img_attn_qkv.lora_down.weight": np.zeros((4, 64), np.float32),
        "lora_unet_double_blocks_0_img_attn_qkv.lora_up.weight": np.zeros((192, 4), np.float32),
    }
    sdxl = {
        "lora_unet_down_blocks_1_attentions_0_proj_in.lora_down.weight": np.zeros((4, 64), np.float32),
        "lora_unet_down_blocks_1_attentions_0_proj_in.lora_up.weight": np.zeros((64, 4), np.float32),
        "lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_down.weight": np.zeros((4, 8), np.float32),
        "lora_te1_text_model_encoder_layers_0_mlp_fc1.lora_up.weight": np.zeros((8, 4), np.float32),
    }
    krea = {
        "diffusion_model.blocks.0.attn.wq.lora_A.weight": np.zeros((4, 64), np.float32),
        "diffusion_model.blocks.0.attn.wq.lora_B.weight": np.zeros((64, 4), np.float32),
    }
    for family, tensors in (("FLUX.1", flux1), ("Stable Diffusion", sdxl), ("Krea 2", krea)):
        path = tmp_path / f"{family}.safetensors"
        save_tensors(path, tensors, dif_metadata=False)
        with pytest.raises(WeightError, match=f"this LoRA is for {re.escape(family)}"):
            merge_transformer_loras(open_component(folder), [path])


def test_rank_and_size_mismatch(torch, base, tmp_path):  # type: ignore[no-untyped-def]
    _, folder = base
    bad_rank = {
        "transformer.proj_out.lora_A.weight": np.zeros((4, 64), np.float32),
        "transformer.proj_out.lora_B.weight": np.zeros((16, 8), np.float32),
    }
    path = tmp_path / "rank.safetensors"
    save_tensors(path, bad_rank, dif_metadata=False)
    with pytest.raises(WeightError, match=r"rank mismatch: 'transformer.proj_out.lora_B.weight' is \[16, 8\]"):
        merge_transformer_loras(open_component(folder), [path])
    other_size = {  # a LoRA for a wider model (klein 9B on 4B, say)
        "transformer.proj_out.lora_A.weight": np.zeros((4, 128), np.float32),
        "transformer.proj_out.lora_B.weight": np.zeros((16, 4), np.float32),
    }
    save_tensors(path, other_size, dif_metadata=False)
    with pytest.raises(WeightError, match=r"delta of \[16, 128\] for 'proj_out.weight', which is \[16, 64\]"):
        merge_transformer_loras(open_component(folder), [path])
    dora = dict(other_size, **{"transformer.proj_out.dora_scale": np.ones((16, 1), np.float32)})
    save_tensors(path, dora, dif_metadata=False)
    with pytest.raises(WeightError, match="DoRA"):
        merge_transformer_loras(open_component(folder), [path])


def test_spec_parsing(tmp_path):
    assert LoraSpec.parse("a/b.safetensors:0.75") == LoraSpec(Path("a/b.safetensors"), 0.75)
    assert LoraSpec.parse("a/b.safetensors") == LoraSpec(Path("a/b.safetensors"), 1.0)
    assert LoraSpec.parse("C:/x.safetensors").path == Path("C:/x.safetensors")
    assert LoraSpec.parse("x.safetensors:-1e-1").scale == -0.1
    with pytest.raises(UsageError, match="not finite"):
        LoraSpec.parse(("x.safetensors", float("nan")))


def test_table_names_both_namings(torch, base):  # type: ignore[no-untyped-def]
    _, folder = base
    table = lora_table(open_component(folder))
    assert [t.param for t in table["double_blocks.0.img_attn.qkv"]] == [
        f"transformer_blocks.0.attn.{p}.weight" for p in ("to_q", "to_k", "to_v")
    ]
    assert table["single_blocks.0.linear1"][0].param == "single_transformer_blocks.0.attn.to_qkv_mlp_proj.weight"
    assert "transformer_blocks.0.attn.norm_q" not in table  # 1-D norm gains are not adapted
    json.dumps(sorted(table))


def test_peft_metadata_alpha_matches_diffusers(torch, base, tmp_path):  # type: ignore[no-untyped-def]
    """A diffusers-saved adapter keeps lora_alpha and r in its `lora_adapter_metadata`; the scale is
    alpha / r (here 2), as diffusers' loader applies it."""
    model, folder = base
    lora = {k: v for k, v in random_lora(model, torch, extra=False, seed=9).items() if k.startswith("transformer_")}
    t = {}
    for m, (a, b) in lora.items():
        t[f"transformer.{m}.lora_A.weight"], t[f"transformer.{m}.lora_B.weight"] = a, b
    meta = {"r": RANK, "lora_alpha": 2 * RANK, "target_modules": sorted(lora), "lora_dropout": 0.0}
    meta = {f"transformer.{k}": v for k, v in meta.items()}  # as a pipeline's save_lora_weights writes it
    path = tmp_path / "meta.safetensors"
    save_tensors(path, t, {"lora_adapter_metadata": json.dumps(meta), "format": "pt"}, dif_metadata=False)
    expected = torch_forward(diffusers_loaded(model, path, torch), torch)
    assert rel(torch_forward(hand_merged(model, lora, torch, 2.0), torch), expected) <= 1e-5
    assert rel(dif_forward(folder, [path], torch, model), expected) <= 1e-5
