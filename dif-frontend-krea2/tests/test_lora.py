"""LoRA merged at prepare, Krea 2: random adapters on every linear of the tiny transformer (blocks,
text fusion, embedders), in the diffusers dialect and in the original-name dialects
(`diffusion_model.` ComfyUI / Krea trainer, `base_model.model.` ai-toolkit), give diffusers'
`load_lora_weights` output (fp32, rel-L2 <= 1e-5). kohya (`lora_unet_` + original names, alpha),
which diffusers' Krea 2 loader does not convert, is checked against the hand merge W + s * B @ A."""

from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pytest

from dif.errors import WeightError
from dif.interp import interpret
from dif.lora import LoraSpec
from dif.serialize.diftensor import save_tensors
from dif_frontend_krea2.lora import original_name
from dif_frontend_krea2.model import build_transformer, position_ids, rope_tables, timestep_proj_from_timesteps
from dif_frontend_krea2.weights import bind_transformer, open_checkpoint

pytestmark = pytest.mark.oracle
RANK = 3


def random_lora(model, seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in model.named_parameters():
        if p.ndim == 2 and name.endswith(".weight"):
            o, i = p.shape
            out[name[: -len(".weight")]] = (
                (rng.standard_normal((RANK, i)) / np.sqrt(i)).astype(np.float32),
                (0.3 * rng.standard_normal((o, RANK)) / np.sqrt(RANK)).astype(np.float32),
            )
    return out


def write(lora, dialect: str, path: Path) -> Path:  # type: ignore[no-untyped-def]
    t: dict[str, np.ndarray] = {}
    for module, (a, b) in lora.items():
        original = original_name(module)
        assert original is not None, module
        if dialect == "diffusers":
            t[f"transformer.{module}.lora_A.weight"], t[f"transformer.{module}.lora_B.weight"] = a, b
        elif dialect in ("comfyui", "ai-toolkit"):
            prefix = "diffusion_model." if dialect == "comfyui" else "base_model.model."
            t[f"{prefix}{original}.lora_A.weight"], t[f"{prefix}{original}.lora_B.weight"] = a, b
        else:  # kohya
            key = "lora_unet_" + original.replace(".", "_")
            t[f"{key}.lora_down.weight"], t[f"{key}.lora_up.weight"] = a, b * 3.0
            t[f"{key}.alpha"] = np.array(1.0, np.float32)  # alpha / rank = 1/3
    save_tensors(path, t, dif_metadata=False)
    return path


def forward_inputs(cfg, torch):  # type: ignore[no-untyped-def]
    n_txt, gh, gw = 7, 3, 4
    rng = np.random.default_rng(0)
    latents = rng.standard_normal((1, gh * gw, cfg.in_channels)).astype(np.float32)
    taps = rng.standard_normal((1, n_txt, cfg.num_text_layers, cfg.text_hidden_dim)).astype(np.float32)
    t = np.array([600.0], np.float32)
    ref_in = dict(
        hidden_states=torch.from_numpy(latents),
        encoder_hidden_states=torch.from_numpy(taps),
        timestep=torch.from_numpy(t) / 1000,
        position_ids=torch.from_numpy(position_ids(n_txt, gh, gw)).float(),
        return_dict=False,
    )
    cos, sin = rope_tables(cfg, n_txt, gh, gw)
    dif_in = {
        "latents": latents,
        "text_hidden_states": taps,
        "timestep_proj": timestep_proj_from_timesteps(t, dim=cfg.timestep_embed_dim),
        "rope_cos": cos,
        "rope_sin": sin,
    }
    return n_txt, gh * gw, ref_in, dif_in


def dif_out(root: Path, loras, torch) -> np.ndarray:  # type: ignore[no-untyped-def]
    ck = open_checkpoint(root, loras=loras)
    cfg = ck.configs.transformer
    n_txt, n_img, _, dif_in = forward_inputs(cfg, torch)
    prog = build_transformer(cfg, image_len=n_img, text_len=n_txt, batch=1, masked=False)
    return interpret(prog, dif_in, bind_transformer(prog, ck.transformer))[prog.outputs[0]]


def ref_out(model, root: Path, torch) -> np.ndarray:  # type: ignore[no-untyped-def]
    cfg = open_checkpoint(root).configs.transformer
    _, _, ref_in, _ = forward_inputs(cfg, torch)
    return model(**ref_in)[0].numpy()


def rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.linalg.norm(a.astype(np.float64) - b) / np.linalg.norm(b))


@pytest.fixture(scope="module")
def base(torch, tiny_checkpoints):  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    root = tiny_checkpoints["turbo"]
    return diffusers.Krea2Transformer2DModel.from_pretrained(root / "transformer").eval(), root


@pytest.mark.parametrize("dialect", ["diffusers", "comfyui", "ai-toolkit"])
def test_dialect_matches_diffusers_loader(torch, base, tmp_path, dialect):  # type: ignore[no-untyped-def]
    pytest.importorskip("peft", reason="diffusers' LoRA loader needs peft")
    from diffusers import Krea2Pipeline

    model, root = base
    lora = random_lora(model)
    path = write(lora, dialect, tmp_path / "l.safetensors")
    pipe = Krea2Pipeline(scheduler=None, vae=None, text_encoder=None, tokenizer=None, transformer=copy.deepcopy(model))
    pipe.load_lora_weights(str(path), adapter_name="x")
    pipe.set_adapters(["x"], adapter_weights=[0.6])
    expected = ref_out(pipe.transformer, root, torch)
    assert rel(ref_out(model, root, torch), expected) > 1e-2  # the adapter matters
    err = rel(dif_out(root, [LoraSpec(path, 0.6)], torch), expected)
    assert err <= 1e-5, f"{dialect}: rel-L2 {err:.3e}"  # measured 2-3e-7


def test_kohya_matches_hand_merge(torch, base, tmp_path):  # type: ignore[no-untyped-def]
    model, root = base
    lora = random_lora(model, seed=4)
    path = write(lora, "kohya", tmp_path / "k.safetensors")
    merged = copy.deepcopy(model)
    params = dict(merged.named_parameters())
    for module, (a, b) in lora.items():
        params[f"{module}.weight"].data += 1.2 * torch.from_numpy(b @ a)
    assert rel(dif_out(root, [f"{path}:1.2"], torch), ref_out(merged, root, torch)) <= 1e-5


def test_flux2_lora_is_refused(base, tmp_path):  # type: ignore[no-untyped-def]
    _, root = base
    path = tmp_path / "flux2.safetensors"
    save_tensors(
        path,
        {
            "transformer.transformer_blocks.0.ff.linear_in.lora_A.weight": np.zeros((2, 32), np.float32),
            "transformer.transformer_blocks.0.ff.linear_in.lora_B.weight": np.zeros((64, 2), np.float32),
        },
        dif_metadata=False,
    )
    with pytest.raises(WeightError, match=r"this LoRA is for FLUX\.2 .*not Krea 2"):
        open_checkpoint(root, loras=[path])
