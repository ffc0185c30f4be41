"""The models `perf/bench_denoiser.py` measures: each builds the diffusers denoiser with seeded random
weights, its forward keywords, and the matching dif program with its inputs (same weights, by name).

Benchmark support only (not a pipeline stage). Full-size configs are the transformer/config.json of
each model (copied from shared/model-configs, which does not travel to the GPU machine); `tiny=True`
gives structurally complete miniatures for checking the script on a CPU.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from dif.dtypes import DType
from dif.ir.program import Program

FLUX2_COMMON: dict[str, Any] = {
    "_class_name": "Flux2Transformer2DModel",
    "attention_head_dim": 128,
    "axes_dims_rope": [32, 32, 32, 32],
    "eps": 1e-06,
    "guidance_embeds": False,
    "in_channels": 128,
    "mlp_ratio": 3.0,
    "out_channels": None,
    "patch_size": 1,
    "rope_theta": 2000,
    "timestep_guidance_channels": 256,
}
CONFIGS: dict[str, dict[str, Any]] = {
    "klein-4b": {**FLUX2_COMMON, "num_attention_heads": 24, "num_layers": 5, "num_single_layers": 20,
                 "joint_attention_dim": 7680},
    "klein-9b": {**FLUX2_COMMON, "num_attention_heads": 32, "num_layers": 8, "num_single_layers": 24,
                 "joint_attention_dim": 12288},
    "krea2": {  # krea2-turbo and krea2-raw share this transformer config
        "_class_name": "Krea2Transformer2DModel", "attention_head_dim": 128, "axes_dims_rope": [32, 48, 48],
        "in_channels": 64, "intermediate_size": 16384, "norm_eps": 1e-05, "num_attention_heads": 48,
        "num_key_value_heads": 12, "num_layers": 28, "num_layerwise_text_blocks": 2, "num_refiner_text_blocks": 2,
        "num_text_layers": 12, "rope_theta": 1000.0, "text_hidden_dim": 2560, "text_intermediate_size": 6912,
        "text_num_attention_heads": 20, "text_num_key_value_heads": 20, "timestep_embed_dim": 256,
    },
}  # fmt: skip
TINY: dict[str, dict[str, Any]] = {
    "klein-4b": {**FLUX2_COMMON, "num_attention_heads": 2, "attention_head_dim": 32, "axes_dims_rope": [8, 8, 8, 8],
                 "num_layers": 1, "num_single_layers": 2, "joint_attention_dim": 24, "in_channels": 16},
    "krea2": {
        "_class_name": "Krea2Transformer2DModel", "in_channels": 16, "num_layers": 2, "attention_head_dim": 16,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 96, "timestep_embed_dim": 32,
        "text_hidden_dim": 32, "num_text_layers": 3, "text_num_attention_heads": 2, "text_num_key_value_heads": 1,
        "text_intermediate_size": 48, "num_layerwise_text_blocks": 2, "num_refiner_text_blocks": 1,
        "axes_dims_rope": [4, 6, 6], "rope_theta": 1000.0, "norm_eps": 1e-5,
    },
}  # fmt: skip
# more blocks than the 4B miniature, so a --vram-budget plan can stream some of them (streaming one block
# costs two staging slots of its size: it pays off only once several blocks go)
TINY["klein-9b"] = {**TINY["klein-4b"], "num_layers": 2, "num_single_layers": 6}
ALIASES = {"4b": "klein-4b", "9b": "klein-9b"}
FLOW_TIME = 0.9  # t in [0, 1]; FLUX.2 takes it as t, its scheduler timestep is 1000 t
KREA2_VALID_TEXT = 333  # of 512 text tokens; the rest are padding, masked as keys everywhere


@dataclass
class Variant:
    """Another dif program of the same model (other inputs), with the diffusers call it answers to."""

    name: str
    note: str
    program: Program
    inputs: dict[str, np.ndarray]
    kwargs: dict[str, Any]


@dataclass
class Case:
    name: str
    config: dict[str, Any]
    tokens: dict[str, int]
    model: Any
    kwargs: dict[str, Any]
    program: Program
    inputs: dict[str, np.ndarray]
    variants: list[Variant] = field(default_factory=list)


def canonical(name: str) -> str:
    name = ALIASES.get(name, name)
    if name not in CONFIGS:
        raise SystemExit(f"unknown model '{name}' (known: {', '.join(CONFIGS)})")
    return name


def to_torch(arr: np.ndarray, device: Any) -> Any:
    import ml_dtypes
    import torch

    if arr.dtype == ml_dtypes.bfloat16:
        return torch.from_numpy(np.ascontiguousarray(arr).view(np.int16)).view(torch.bfloat16).to(device)
    return torch.from_numpy(np.ascontiguousarray(arr)).to(device)


def to_numpy(t: Any) -> np.ndarray:
    import ml_dtypes
    import torch

    t = t.detach().contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).cpu().numpy().view(ml_dtypes.bfloat16)
    return t.cpu().numpy()


def _bf16(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32).astype(DType.BF16.np)


def make_model(cls: Any, config: dict[str, Any], device: Any, seed: int) -> Any:
    """`cls.from_config(config)` with seeded init on `device`, cast to bf16 with the class's fp32 modules kept
    fp32 (as from_pretrained keeps them), and every constant-initialised tensor (norm weights of ones or
    zeros, zero modulation tables) perturbed by seeded N(0, 0.1^2) noise, so no weight is a constant."""
    import torch

    torch.manual_seed(seed)
    with torch.device(device):
        model = cls.from_config(config)
    model = model.to(torch.bfloat16).eval()
    keep = list(getattr(model, "_keep_in_fp32_modules", None) or [])
    with torch.no_grad():
        for name, p in model.named_parameters():
            if any(k in name.split(".") for k in keep):
                p.data = p.data.float()
    perturb_constants(model, device, seed + 1)
    if str(device).startswith("cuda"):
        torch.cuda.empty_cache()
    return model


def perturb_constants(model: Any, device: Any, seed: int, *, buffers: bool = False) -> None:
    """Add seeded N(0, 0.1^2) noise to every floating tensor of `model` whose elements are all equal (norm
    weights of ones, zero biases and tables): a constant weight would hide a wrongly bound or ignored
    tensor. `buffers`: persistent floating buffers too (a VAE's BatchNorm running mean / variance; a
    variance of ones stays positive); non-persistent buffers (RoPE frequencies) are never touched."""
    import torch

    gen = torch.Generator(device=device).manual_seed(seed)
    tensors = [p.data for _, p in model.named_parameters()]
    if buffers:
        persistent = set(model.state_dict())
        tensors += [b for n, b in model.named_buffers() if n in persistent and b.is_floating_point()]
    with torch.no_grad():
        for t in tensors:
            flat = t.reshape(-1)
            if flat.numel() > 1 and bool((flat == flat[0]).all()):
                noise = torch.randn(t.shape, generator=gen, device=device, dtype=torch.float32) * 0.1
                t.add_(noise.to(t.dtype))


def flux2_case(name: str, device: Any, tiny: bool, seed: int = 0) -> Case:
    import torch
    from diffusers import Flux2Transformer2DModel
    from diffusers.pipelines.flux2.pipeline_flux2_klein import Flux2KleinPipeline

    from dif_frontend_flux2.config import Flux2TransformerConfig
    from dif_frontend_flux2.model import build_transformer, flux2_rope_tables, flux2_timestep_proj

    config = dict((TINY if tiny else CONFIGS)[name])
    grid, n_txt = (4, 8) if tiny else (64, 512)
    model = make_model(Flux2Transformer2DModel, config, device, seed)
    cfg = Flux2TransformerConfig.from_dict(config)
    rng = np.random.default_rng(seed)
    latents = _bf16(rng, (1, grid * grid, cfg.in_channels))
    text = _bf16(rng, (1, n_txt, cfg.joint_attention_dim))
    kwargs = {
        "hidden_states": to_torch(latents, device),
        "encoder_hidden_states": to_torch(text, device),
        "timestep": torch.tensor([FLOW_TIME], device=device),
        "img_ids": Flux2KleinPipeline._prepare_latent_ids(torch.zeros(1, 1, grid, grid)).to(device),
        "txt_ids": Flux2KleinPipeline._prepare_text_ids(torch.zeros(1, n_txt, 1)).to(device),
        "return_dict": False,
    }
    program = build_transformer(cfg, batch=1, n_img=grid * grid, n_txt=n_txt, dtype=DType.BF16)
    cos, sin = flux2_rope_tables(n_txt, grid, grid, axes_dims=cfg.axes_dims_rope, theta=cfg.rope_theta)
    inputs = {
        "latents": latents,
        "text_features": text,
        "timestep_proj": flux2_timestep_proj([FLOW_TIME * 1000.0], dtype=DType.BF16),
        "rope_cos": cos,
        "rope_sin": sin,
    }
    tokens = {"image": grid * grid, "text": n_txt}
    return Case(f"flux2-{name}", config, tokens, model, kwargs, program, inputs)


def krea2_case(device: Any, tiny: bool, seed: int = 0) -> Case:
    """Krea 2 at 1024x1024: 4096 image tokens, 512 text tokens of which the last 179 are padding (masked).
    Variant `trimmed`: the same prompt with its padding dropped (333 text tokens, no mask), which is
    exact for this model (padded tokens are masked as keys everywhere and their rows are discarded)."""
    import torch
    from diffusers import Krea2Transformer2DModel

    from dif_frontend_krea2.config import Krea2TransformerConfig
    from dif_frontend_krea2.model import attention_mask, build_transformer, position_ids, rope_tables, timestep_proj

    config = dict((TINY if tiny else CONFIGS)["krea2"])
    grid, n_txt, n_valid = (4, 8, 5) if tiny else (64, 512, KREA2_VALID_TEXT)
    n_img = grid * grid
    model = make_model(Krea2Transformer2DModel, config, device, seed)
    cfg = Krea2TransformerConfig.from_dict(config)
    rng = np.random.default_rng(seed)
    latents = _bf16(rng, (1, n_img, cfg.in_channels))
    taps = _bf16(rng, (1, n_txt, cfg.num_text_layers, cfg.text_hidden_dim))
    text_mask = np.zeros((1, n_txt), bool)
    text_mask[:, :n_valid] = True
    t_proj = timestep_proj([FLOW_TIME], dtype=DType.BF16, dim=cfg.timestep_embed_dim)

    def torch_kwargs(n: int, mask: np.ndarray | None) -> dict[str, Any]:
        return {
            "hidden_states": to_torch(latents, device),
            "encoder_hidden_states": to_torch(np.ascontiguousarray(taps[:, :n]), device),
            "timestep": torch.tensor([FLOW_TIME], dtype=torch.bfloat16, device=device),
            "position_ids": torch.from_numpy(position_ids(n, grid, grid)).float().to(device),
            "encoder_attention_mask": None if mask is None else torch.from_numpy(mask).to(device),
            "return_dict": False,
        }

    program = build_transformer(cfg, image_len=n_img, text_len=n_txt, dtype=DType.BF16, masked=True)
    cos, sin = rope_tables(cfg, n_txt, grid, grid)
    inputs = {
        "latents": latents,
        "text_hidden_states": taps,
        "timestep_proj": t_proj,
        "rope_cos": cos,
        "rope_sin": sin,
        "attention_mask": attention_mask(text_mask, n_img),
    }
    trimmed = build_transformer(cfg, image_len=n_img, text_len=n_valid, dtype=DType.BF16, masked=False)
    t_cos, t_sin = rope_tables(cfg, n_valid, grid, grid)
    t_inputs = {
        "latents": latents,
        "text_hidden_states": np.ascontiguousarray(taps[:, :n_valid]),
        "timestep_proj": t_proj,
        "rope_cos": t_cos,
        "rope_sin": t_sin,
    }
    note = f"padding dropped: {n_valid} text tokens, no mask (exact for this model; cuDNN attention path)"
    variants = [Variant("trimmed", note, trimmed, t_inputs, torch_kwargs(n_valid, None))]
    tokens = {"image": n_img, "text": n_txt, "text_valid": n_valid}
    return Case("krea2", config, tokens, model, torch_kwargs(n_txt, text_mask), program, inputs, variants)


def make_case(name: str, device: Any, tiny: bool, seed: int = 0) -> Case:
    name = canonical(name)
    return krea2_case(device, tiny, seed) if name == "krea2" else flux2_case(name, device, tiny, seed)
