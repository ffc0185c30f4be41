"""Unmerged LoRA, Krea 2: the tiny transformer (text fusion, embedders, blocks) built ONCE with a
side-GEMM slot of rank 16 on every linear runs LoRA A, LoRA B, both and none by changing only its
adapter inputs (`checkpoint.unmerged.set`); each run equals diffusers' `load_lora_weights` on the
Krea 2 pipeline (diffusers, ComfyUI and ai-toolkit dialects) or the hand merge W + s * B @ A
(kohya, OneTrainer: dialects diffusers' Krea 2 loader does not convert), and the merged mode's run,
fp32, rel-L2 <= 1e-5. A LoKr adapter is refused by the unmerged mode and merged by "auto"."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from dif.dtypes import DType
from dif.errors import WeightError
from dif.interp import interpret
from dif.lora import LoraSpec
from dif.serialize.diftensor import save_tensors
from dif_frontend_krea2.lora import original_name
from dif_frontend_krea2.model import build_transformer, position_ids, rope_tables, timestep_proj_from_timesteps
from dif_frontend_krea2.weights import bind_transformer, open_checkpoint

pytestmark = pytest.mark.oracle
SLOT_RANK = 16
N_TXT, GH, GW = 7, 3, 4


def random_lora(model, rank: int, seed: int) -> dict[str, tuple[np.ndarray, np.ndarray]]:  # type: ignore[no-untyped-def]
    """(A [rank, in], B [out, rank]) for every 2-D weight of the diffusers model."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in model.named_parameters():
        if p.ndim == 2 and name.endswith(".weight"):
            o, i = p.shape
            out[name[: -len(".weight")]] = (
                (rng.standard_normal((rank, i)) / np.sqrt(i)).astype(np.float32),
                (0.3 * rng.standard_normal((o, rank)) / np.sqrt(rank)).astype(np.float32),
            )
    return out


def write(lora, dialect: str, path: Path) -> Path:  # type: ignore[no-untyped-def]
    """One set of factors in a dialect's layout (alpha = rank / 2 where the dialect stores alpha, B
    doubled to keep the same delta)."""
    t: dict[str, np.ndarray] = {}
    for module, (a, b) in lora.items():
        original = original_name(module)
        assert original is not None, module
        if dialect == "diffusers":
            t[f"transformer.{module}.lora_A.weight"], t[f"transformer.{module}.lora_B.weight"] = a, b
        elif dialect in ("comfyui", "ai-toolkit"):
            prefix = "diffusion_model." if dialect == "comfyui" else "base_model.model."
            t[f"{prefix}{original}.lora_A.weight"], t[f"{prefix}{original}.lora_B.weight"] = a, b
        else:
            key = "lora_unet_" + original.replace(".", "_") if dialect == "kohya" else f"transformer.{module}"
            t[f"{key}.lora_down.weight"], t[f"{key}.lora_up.weight"] = a, b * 2.0
            t[f"{key}.alpha"] = np.array(a.shape[0] / 2, np.float32)
    save_tensors(path, t, dif_metadata=False)
    return path


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def setup(torch, tiny_checkpoints):  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    root = tiny_checkpoints["turbo"]
    model = diffusers.Krea2Transformer2DModel.from_pretrained(root / "transformer").eval()
    cfg = open_checkpoint(root).configs.transformer
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((1, GH * GW, cfg.in_channels)).astype(np.float32)
    taps = rng.standard_normal((1, N_TXT, cfg.num_text_layers, cfg.text_hidden_dim)).astype(np.float32)
    t = np.array([600.0], np.float32)
    torch_in = dict(
        hidden_states=torch.from_numpy(latents),
        encoder_hidden_states=torch.from_numpy(taps),
        timestep=torch.from_numpy(t) / 1000,
        position_ids=torch.from_numpy(position_ids(N_TXT, GH, GW)).float(),
        return_dict=False,
    )
    cos, sin = rope_tables(cfg, N_TXT, GH, GW)
    dif_in = {
        "latents": latents,
        "text_hidden_states": taps,
        "timestep_proj": timestep_proj_from_timesteps(t, dim=cfg.timestep_embed_dim),
        "rope_cos": cos,
        "rope_sin": sin,
    }
    return model, root, cfg, dif_in, torch_in


def build(cfg):  # type: ignore[no-untyped-def]
    return build_transformer(cfg, image_len=GH * GW, text_len=N_TXT, batch=1, masked=False)


def merged_out(setup, specs) -> np.ndarray:  # type: ignore[no-untyped-def]
    _, root, cfg, dif_in, _ = setup
    ck = open_checkpoint(root, loras=specs, lora_mode="merged")
    prog = build(cfg)
    return interpret(prog, dif_in, bind_transformer(prog, ck.transformer))[prog.outputs[0]]


def diffusers_out(setup, path: Path, scale: float) -> np.ndarray:  # type: ignore[no-untyped-def]
    from diffusers import Krea2Pipeline

    model, _, _, _, torch_in = setup
    pipe = Krea2Pipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, transformer=copy.deepcopy(model))
    pipe.load_lora_weights(str(path), adapter_name="x")
    pipe.set_adapters(["x"], adapter_weights=[scale])
    return pipe.transformer(**torch_in)[0].numpy()


def hand_merged_out(setup, lora, scale: float) -> np.ndarray:  # type: ignore[no-untyped-def]
    import torch

    model, _, _, _, torch_in = setup
    merged = copy.deepcopy(model)
    params = dict(merged.named_parameters())
    with torch.no_grad():
        for module, (a, b) in lora.items():
            params[f"{module}.weight"] += scale * torch.from_numpy(b @ a)
        return merged(**torch_in)[0].numpy()


def test_one_program_swaps_adapters_in_every_dialect(setup, tmp_path):  # type: ignore[no-untyped-def]
    pytest.importorskip("peft", reason="diffusers' LoRA loader needs peft")
    model, root, cfg, dif_in, torch_in = setup
    lora_a, lora_b = random_lora(model, 8, 1), random_lora(model, 4, 2)
    ck = open_checkpoint(root, lora_mode="unmerged", lora_rank=SLOT_RANK)
    assert ck.unmerged is not None and ck.loras is not None and ck.loras.mode.mode == "unmerged"
    prog = ck.loras.build("forward", lambda: build(cfg))
    slots = [v.name for v in prog.inputs if v.name.startswith("lora.")]
    assert len(slots) == 2 * len(lora_a)  # every linear: text fusion, embedders, blocks
    weights = bind_transformer(prog, ck.transformer)
    run = ck.loras.feed("forward", lambda inputs: interpret(prog, inputs, weights), DType.F32)
    builds = []

    def unmerged(specs: list[LoraSpec]) -> np.ndarray:
        ck.unmerged.set(specs)
        builds.append(prog)
        return run(dif_in)[prog.outputs[0]]

    plain = model(**torch_in)[0].numpy()
    none = unmerged([])
    assert rel(none, plain) <= 1e-5  # zero slots add nothing
    for dialect in ("diffusers", "comfyui", "ai-toolkit"):
        path = write(lora_a, dialect, tmp_path / f"a-{dialect}.safetensors")
        out = unmerged([LoraSpec(path, 0.6)])
        expected = diffusers_out(setup, path, 0.6)
        assert rel(plain, expected) > 1e-2  # the adapter matters
        assert rel(out, expected) <= 1e-5, dialect  # measured ~3e-7
        assert rel(out, merged_out(setup, [LoraSpec(path, 0.6)])) <= 1e-5, dialect
    for dialect in ("kohya", "onetrainer"):
        path = write(lora_b, dialect, tmp_path / f"b-{dialect}.safetensors")
        out = unmerged([LoraSpec(path, -0.5)])
        assert rel(out, hand_merged_out(setup, lora_b, -0.5)) <= 1e-5, dialect
        assert rel(out, merged_out(setup, [LoraSpec(path, -0.5)])) <= 1e-5, dialect
    both = [LoraSpec(tmp_path / "a-diffusers.safetensors", 0.3), LoraSpec(tmp_path / "b-kohya.safetensors", 0.7)]
    assert rel(unmerged(both), merged_out(setup, both)) <= 1e-5  # 8 + 4 rows share each slot of 16
    assert all(p is prog for p in builds)  # one program for every swap


def test_lokr_is_merged_by_auto_and_refused_unmerged(setup, tmp_path):  # type: ignore[no-untyped-def]
    model, root, cfg, dif_in, _ = setup
    rng = np.random.default_rng(7)
    w = dict(model.named_parameters())["transformer_blocks.0.ff.up.weight"]
    o, i = w.shape
    path = tmp_path / "lokr.safetensors"
    w1, w2 = rng.standard_normal((2, 2)).astype(np.float32), rng.standard_normal((o // 2, i // 2)).astype(np.float32)
    save_tensors(
        path,
        {"lycoris_transformer_blocks_0_ff_up.lokr_w1": w1, "lycoris_transformer_blocks_0_ff_up.lokr_w2": 0.1 * w2},
        dif_metadata=False,
    )
    with pytest.raises(WeightError, match="lokr adapter, not low-rank factors"):
        open_checkpoint(root, loras=[path], lora_mode="unmerged")
    ck = open_checkpoint(root, loras=[path])  # auto
    assert ck.unmerged is None and ck.loras.mode.mode == "merged" and "lokr" in ck.loras.mode.why
    prog = build(cfg)
    out = interpret(prog, dif_in, bind_transformer(prog, ck.transformer))[prog.outputs[0]]
    base = open_checkpoint(root)
    plain = interpret(prog, dif_in, bind_transformer(prog, base.transformer))[prog.outputs[0]]
    assert rel(out, plain) > 1e-3  # merged in


def test_an_adapter_larger_than_its_slot(setup, tmp_path):  # type: ignore[no-untyped-def]
    model, root, _, _, _ = setup
    big = write(random_lora(model, 24, 3), "diffusers", tmp_path / "big.safetensors")
    with pytest.raises(WeightError, match="slot rank 16"):
        open_checkpoint(root, loras=[big], lora_mode="unmerged", lora_rank=SLOT_RANK)
    auto = open_checkpoint(root, loras=[big], lora_rank=SLOT_RANK, lora_mode="auto")
    assert auto.loras.mode.mode == "merged" and "rank 24, more than a slot's 16" in auto.loras.mode.why
    ck = open_checkpoint(root, lora_swappable=True, lora_rank=SLOT_RANK)
    with pytest.raises(WeightError, match="slot rank 16"):
        ck.unmerged.set([big])
    assert ck.unmerged.applied == []  # refused: the old (empty) set is kept
