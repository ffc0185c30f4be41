"""Write the embedded default checkpoint: a tiny Krea 2 (Turbo) in diffusers layout, random weights.

Usage:  python dif-frontend-krea2/scripts/make_default_checkpoint.py [OUT_DIR] [--tokenizer DIR]
Default OUT_DIR is the package's `default/` folder; --tokenizer defaults to ../shared/tokenizers/qwen3-vl.

Reproducible with numpy and dif only (no torch): tensor names and shapes come from dif's own
program builders, stored as a diffusers / transformers save holds them (the VAE's causal convs as
5D kernels, its temporal upsampling convs, the text encoder's unused last layer and final norm),
each tensor drawn from PCG64 seeded by a CRC of its name, stored bf16 (norm weights fp32, as the
reference keeps them). Krea 2 at toy widths: 36 text layers for the 12 real taps, 2 + 2 text
fusion blocks, GQA, the real latent statistics, so every code path of the real model runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import ml_dtypes
import numpy as np

from dif.testing.random_checkpoint import name_rng, param_shapes, random_weight, script_main, write_diffusers_folder
from dif_frontend_krea2.config import (
    DEFAULT_TAPS,
    Krea2TransformerConfig,
    QwenImageVaeConfig,
    QwenVLTextConfig,
)
from dif_frontend_krea2.model import build_transformer
from dif_frontend_krea2.text_encoder import build_text_encoder
from dif_frontend_krea2.vae import build_vae_decoder

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "src" / "dif_frontend_krea2" / "default"
DEFAULT_TOKENIZER = HERE.parents[2] / "shared" / "tokenizers" / "qwen3-vl"
STORE = np.dtype(ml_dtypes.bfloat16)
VERSION = "0.42.1"
SHARED_CONFIGS = HERE.parents[2] / "shared" / "model-configs" / "krea2-turbo"

MODEL_INDEX = {
    "_class_name": "Krea2Pipeline",
    "_diffusers_version": VERSION,
    "is_distilled": True,
    "patch_size": 2,
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "Qwen3VLModel"],
    "text_encoder_select_layers": list(DEFAULT_TAPS),
    "tokenizer": ["transformers", "Qwen2Tokenizer"],
    "transformer": ["diffusers", "Krea2Transformer2DModel"],
    "vae": ["diffusers", "AutoencoderKLQwenImage"],
}
TRANSFORMER = {
    "_class_name": "Krea2Transformer2DModel",
    "_diffusers_version": VERSION,
    "attention_head_dim": 16,
    "axes_dims_rope": [4, 6, 6],
    "in_channels": 64,
    "intermediate_size": 64,
    "norm_eps": 1e-05,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "num_layers": 2,
    "num_layerwise_text_blocks": 2,
    "num_refiner_text_blocks": 2,
    "num_text_layers": 12,
    "rope_theta": 1000.0,
    "text_hidden_dim": 8,
    "text_intermediate_size": 16,
    "text_num_attention_heads": 2,
    "text_num_key_value_heads": 2,
    "timestep_embed_dim": 32,
}
TEXT_TEXT_CONFIG = {
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "dtype": "bfloat16",
    "eos_token_id": 151645,
    "head_dim": 8,
    "hidden_act": "silu",
    "hidden_size": 8,
    "initializer_range": 0.02,
    "intermediate_size": 16,
    "max_position_embeddings": 262144,
    "model_type": "qwen3_vl_text",
    "num_attention_heads": 2,
    "num_hidden_layers": 36,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-06,
    "rope_parameters": {"mrope_interleaved": True, "mrope_section": [2, 1, 1], "rope_theta": 5000000,
                        "rope_type": "default"},
    "tie_word_embeddings": True,
    "use_cache": True,
    "vocab_size": 151936,
}
VAE_EXTRA = {"base_dim": 8, "num_res_blocks": 1, "sample_size": 256}  # sample_size: dif's default size here


def tensor_for(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A reproducible random tensor whose scale suits its role; stored bf16, norm weights fp32."""
    rng = name_rng(name)
    leaf = name.rsplit(".", 1)[-1]
    if leaf == "gamma" or (name.startswith("language_model.") and "norm" in name):
        return (1.0 + 0.1 * rng.standard_normal(shape)).astype(np.float32).astype(STORE)
    if "norm" in name:  # Krea 2's zero-centred norms: kept in fp32
        return (0.1 * rng.standard_normal(shape)).astype(np.float32)
    if leaf == "bias" or "scale_shift_table" in name:
        arr = 0.1 * rng.standard_normal(shape)
    else:
        arr = random_weight(rng, name, shape)
    return arr.astype(np.float32).astype(STORE)


def vae_on_disk(shapes: dict[str, tuple[int, ...]], cfg: QwenImageVaeConfig) -> dict[str, tuple[int, ...]]:
    """The decoder as diffusers stores it: causal convs 5D (3 taps; 1 for 1x1), plus the temporal
    upsampling convs a single-image decode skips."""
    out = {}
    for name, shape in shapes.items():
        conv2d = ".resample.1." in name or ".attentions." in name
        if name.endswith(".weight") and len(shape) == 4 and not conv2d:
            taps = 1 if shape[2] == 1 else 3
            out[name] = (shape[0], shape[1], taps, shape[2], shape[3])
        else:
            out[name] = shape
    dims = [cfg.base_dim * m for m in (cfg.dim_mult[-1], *cfg.dim_mult[::-1])]
    for i, temporal in enumerate(cfg.temperal_downsample[::-1]):
        if temporal:
            out[f"decoder.up_blocks.{i}.upsamplers.0.time_conv.weight"] = (2 * dims[i + 1], dims[i + 1], 3, 1, 1)
            out[f"decoder.up_blocks.{i}.upsamplers.0.time_conv.bias"] = (2 * dims[i + 1],)
    return out


def make(out: Path, tokenizer: Path) -> None:
    text_config = json.loads((SHARED_CONFIGS / "text_encoder" / "config.json").read_text())
    text_config["text_config"] = TEXT_TEXT_CONFIG
    vae_config = json.loads((SHARED_CONFIGS / "vae" / "config.json").read_text())
    vae_config.pop("_name_or_path", None)
    vae_config.update(VAE_EXTRA, _diffusers_version=VERSION)
    scheduler = json.loads((SHARED_CONFIGS / "scheduler" / "scheduler_config.json").read_text())
    scheduler["_diffusers_version"] = VERSION
    t_cfg = Krea2TransformerConfig.from_dict(TRANSFORMER)
    q_cfg = QwenVLTextConfig.from_dict(text_config)
    v_cfg = QwenImageVaeConfig.from_dict(vae_config)
    transformer = param_shapes(build_transformer(t_cfg, image_len=4, text_len=4))
    text = param_shapes(build_text_encoder(q_cfg, seq_len=4, taps=(q_cfg.num_hidden_layers,)))
    vae = vae_on_disk(param_shapes(build_vae_decoder(v_cfg, latent_h=2, latent_w=2)), v_cfg)
    components = {"transformer": (TRANSFORMER, transformer), "text_encoder": (text_config, text),
                  "vae": (vae_config, vae)}
    print(write_diffusers_folder(out, MODEL_INDEX, components, tensor_for, scheduler=scheduler, tokenizer=tokenizer))


def main(argv: list[str] | None = None) -> int:
    return script_main(argv, description=(__doc__ or "").splitlines()[0], default_out=DEFAULT_OUT,
                       default_tokenizer=DEFAULT_TOKENIZER, make=make)


if __name__ == "__main__":
    raise SystemExit(main())
