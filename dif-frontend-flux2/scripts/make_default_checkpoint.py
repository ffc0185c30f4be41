"""Write the embedded default checkpoint: a tiny FLUX.2 [klein] in diffusers layout, random weights.

Usage:  python dif-frontend-flux2/scripts/make_default_checkpoint.py [OUT_DIR] [--tokenizer DIR]
Default OUT_DIR is the package's `default/` folder; --tokenizer defaults to ../shared/tokenizers/qwen3-vl.

Reproducible with numpy and dif only (no torch): tensor names and shapes come from dif's own
program builders (plus the tensors a diffusers/transformers save also holds: VAE encoder, all
text-encoder layers, final norm, BatchNorm counter), each tensor drawn from PCG64 seeded by a
CRC of its name, stored f32. The architecture is FLUX.2 [klein] at toy widths, so every code
path of the real model runs (27 Qwen3 layers for the 9/18/27 taps, double and single blocks,
the VAE with BatchNorm latents). The tokenizer files are the real Qwen ones (copied).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from dif.testing.random_checkpoint import name_rng, param_shapes, random_weight, script_main, write_diffusers_folder
from dif_frontend_flux2.config import Flux2TransformerConfig, Flux2VaeConfig, Qwen3Config
from dif_frontend_flux2.model import build_transformer
from dif_frontend_flux2.text_encoder import build_text_encoder
from dif_frontend_flux2.vae import build_vae_decoder, build_vae_encoder

HERE = Path(__file__).resolve().parent
DEFAULT_OUT = HERE.parent / "src" / "dif_frontend_flux2" / "default"
DEFAULT_TOKENIZER = HERE.parents[2] / "shared" / "tokenizers" / "qwen3-vl"
STORE = np.dtype(np.float32)  # f32: the demo runs in f32 by default, so every backend draws the same picture
VERSION = "0.42.1"

MODEL_INDEX = {
    "_class_name": "Flux2KleinPipeline",
    "_diffusers_version": VERSION,
    "is_distilled": True,
    "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
    "text_encoder": ["transformers", "Qwen3ForCausalLM"],
    "tokenizer": ["transformers", "Qwen2TokenizerFast"],
    "transformer": ["diffusers", "Flux2Transformer2DModel"],
    "vae": ["diffusers", "AutoencoderKLFlux2"],
}
TRANSFORMER = {
    "_class_name": "Flux2Transformer2DModel",
    "_diffusers_version": VERSION,
    "attention_head_dim": 32,
    "axes_dims_rope": [8, 8, 8, 8],
    "eps": 1e-06,
    "guidance_embeds": False,
    "in_channels": 128,
    "joint_attention_dim": 24,
    "mlp_ratio": 3.0,
    "num_attention_heads": 2,
    "num_layers": 1,
    "num_single_layers": 1,
    "out_channels": None,
    "patch_size": 1,
    "rope_theta": 2000,
    "timestep_guidance_channels": 32,
}
TEXT_ENCODER = {
    "architectures": ["Qwen3ForCausalLM"],
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 151643,
    "eos_token_id": 151645,
    "head_dim": 8,
    "hidden_act": "silu",
    "hidden_size": 8,
    "initializer_range": 0.02,
    "intermediate_size": 16,
    "max_position_embeddings": 40960,
    "max_window_layers": 28,
    "model_type": "qwen3",
    "num_attention_heads": 2,
    "num_hidden_layers": 28,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-06,
    "rope_scaling": None,
    "rope_theta": 1000000,
    "sliding_window": None,
    "tie_word_embeddings": True,
    "use_cache": True,
    "use_sliding_window": False,
    "vocab_size": 151936,
}
VAE = {
    "_class_name": "AutoencoderKLFlux2",
    "_diffusers_version": VERSION,
    "act_fn": "silu",
    "batch_norm_eps": 0.0001,
    "batch_norm_momentum": 0.1,
    "block_out_channels": [8, 8, 8, 8],
    "down_block_types": ["DownEncoderBlock2D"] * 4,
    "in_channels": 3,
    "latent_channels": 32,
    "layers_per_block": 1,
    "mid_block_add_attention": False,  # one-head attention over (H/8)(W/8) tokens: too big for a CPU demo
    "norm_num_groups": 4,
    "out_channels": 3,
    "patch_size": [2, 2],
    "sample_size": 512,  # dif's default size for this checkpoint (`dif flux2 generate` without -W/-H)
    "up_block_types": ["UpDecoderBlock2D"] * 4,
    "use_post_quant_conv": True,
    "use_quant_conv": True,
}
SCHEDULER = {
    "_class_name": "FlowMatchEulerDiscreteScheduler",
    "_diffusers_version": VERSION,
    "base_image_seq_len": 256,
    "base_shift": 0.5,
    "invert_sigmas": False,
    "max_image_seq_len": 4096,
    "max_shift": 1.15,
    "num_train_timesteps": 1000,
    "shift": 3.0,
    "shift_terminal": None,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
    "use_beta_sigmas": False,
    "use_dynamic_shifting": True,
    "use_exponential_sigmas": False,
    "use_karras_sigmas": False,
}
# Qwen3's published chat template (the tokenizer_config.json "chat_template" of Qwen3-4B/8B, whose
# tokenizer FLUX.2 [klein] ships); dif renders it as transformers does (dif.text.chat).
CHAT_TEMPLATE = (HERE / "qwen3_chat_template.jinja").read_text(encoding="utf-8")


def tensor_for(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A reproducible random tensor whose scale suits its role (norm gains near 1, BN variance > 0)."""
    if name.endswith("num_batches_tracked"):
        return np.array(0, dtype=np.int64)
    rng = name_rng(name)
    if "norm" in name and name.endswith(".weight"):
        arr = 1.0 + 0.1 * rng.standard_normal(shape)
    elif name.endswith("running_var"):
        arr = rng.uniform(0.5, 1.5, shape)
    elif name.endswith("running_mean") or name.endswith(".bias"):
        arr = 0.1 * rng.standard_normal(shape)
    else:
        arr = random_weight(rng, name, shape)
    return arr.astype(np.float32).astype(STORE)


def make(out: Path, tokenizer: Path) -> None:
    t_cfg = Flux2TransformerConfig.from_dict(TRANSFORMER)
    q_cfg = Qwen3Config.from_dict(TEXT_ENCODER)
    v_cfg = Flux2VaeConfig.from_dict(VAE)
    transformer = param_shapes(build_transformer(t_cfg, batch=1, n_img=4, n_txt=4))
    text = param_shapes(build_text_encoder(q_cfg, batch=1, seq_len=4, taps=(q_cfg.num_hidden_layers,)))
    vae = param_shapes(
        build_vae_decoder(v_cfg, batch=1, latent_h=16, latent_w=16, from_packed=True),
        build_vae_encoder(v_cfg, batch=1, height=128, width=128),
    )
    if "bn.running_mean" in vae:  # a torch save of the BatchNorm also holds its step counter
        vae["bn.num_batches_tracked"] = ()
    components = {"transformer": (TRANSFORMER, transformer), "text_encoder": (TEXT_ENCODER, text), "vae": (VAE, vae)}
    tokenizer_config = {"chat_template": CHAT_TEMPLATE, "model_max_length": 131072}
    print(
        write_diffusers_folder(
            out,
            MODEL_INDEX,
            components,
            tensor_for,
            scheduler=SCHEDULER,
            tokenizer=tokenizer,
            tokenizer_files=("vocab.json", "merges.txt"),
            tokenizer_config=tokenizer_config,
        )
    )


def main(argv: list[str] | None = None) -> int:
    description = (__doc__ or "").splitlines()[0]
    return script_main(
        argv, description=description, default_out=DEFAULT_OUT, default_tokenizer=DEFAULT_TOKENIZER, make=make
    )


if __name__ == "__main__":
    raise SystemExit(main())
