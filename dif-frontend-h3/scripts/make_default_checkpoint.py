"""Write the embedded default checkpoint: a tiny MiniMax-H3 in diffusers (modular) layout, random weights.

Usage:  python dif-frontend-h3/scripts/make_default_checkpoint.py [OUT_DIR] [--tokenizer DIR]
Default OUT_DIR is the package's `default/` folder; --tokenizer defaults to ../shared/tokenizers/qwen3-vl.

Reproducible with numpy and dif only (no torch): tensor names and shapes come from dif's own program
builders, each tensor drawn from PCG64 seeded by a CRC of its name. The DiT is MiniMax-H3 at toy widths
(attention wider than the residual stream, partial RoPE, a refiner block) stored fp32; the Qwen3-VL text
stack has 4 layers tapped at hidden_states[3] (`text_encoder_layer` in model_index.json, a dif key; the
real model taps 50 of 64), stored bf16 with the real vocabulary, beside a one-block vision tower
(`model.visual.*`, deepstack after it; the published image processor settings in processor/) so that fl2va
builds its picture blocks. The video and audio VAEs are written with the shapes of the package's VAE
builders (`video_vae.build_video_decoder`, `audio_vae.build_audio_decoder`) when those modules are present.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

from dif.testing.random_checkpoint import name_rng, param_shapes, random_weight, script_main, write_diffusers_folder
from dif_frontend_h3.config import H3TextConfig, H3TransformerConfig
from dif_frontend_h3.layout import build_layout
from dif_frontend_h3.model import build_denoiser
from dif_frontend_h3.text_encoder import build_text_encoder
from dif_frontend_h3.vision_config import H3VisionConfig
from dif_frontend_h3.vision_tower import build_vision_tower

HERE = Path(__file__).resolve().parent
PACKAGE = HERE.parent / "src" / "dif_frontend_h3"
DEFAULT_OUT = PACKAGE / "default"
DEFAULT_TOKENIZER = HERE.parents[2] / "shared" / "tokenizers" / "qwen3-vl"
PUBLISHED = PACKAGE / "configs" / "h3"
BF16 = np.dtype(ml_dtypes.bfloat16)
VERSION = "0.42.1"
TAP = 3
PROCESSOR = PUBLISHED / "processor" / "preprocessor_config.json"  # the published image processor settings


def _component(library: str, cls: str) -> list[Any]:
    return [library, cls, {"pretrained_model_name_or_path": "dif/h3-tiny", "revision": None, "variant": None}]


MODEL_INDEX: dict[str, Any] = {
    "_class_name": "MiniMaxH3ModularPipeline",
    "_diffusers_version": VERSION,
    "_blocks_class_name": "MiniMaxH3Blocks",
    "text_encoder_layer": TAP,
    "dif_defaults": {"frames": 22, "width": 128, "height": 96, "steps": 6},  # a CPU-sized canvas for the toy
    "text_encoder": _component("transformers", "Qwen3VLForConditionalGeneration"),
    "tokenizer": _component("transformers", "Qwen2TokenizerFast"),
    "transformer": _component("diffusers", "MiniMaxH3Transformer3DModel"),
    "vae": _component("diffusers", "AutoencoderKLMiniMaxH3"),
    "audio_vae": _component("diffusers", "AutoencoderKLMiniMaxH3Audio"),
    "scheduler": _component("diffusers", "MiniMaxH3Scheduler"),
    "audio_scheduler": _component("diffusers", "MiniMaxH3Scheduler"),
}
TRANSFORMER: dict[str, Any] = {
    "_class_name": "MiniMaxH3Transformer3DModel",
    "_diffusers_version": VERSION,
    "num_attention_heads": 2,
    "attention_head_dim": 32,
    "hidden_size": 48,
    "num_layers": 2,
    "num_refiner_layers": 1,
    "ffn_dim": 64,
    "in_channels": 24,
    "audio_in_channels": 32,
    "patch_size": [1, 2, 2],
    "text_dim": 8,
    "freq_dim": 32,
    "time_embed_hidden_dim": 40,
    "time_embed_dim": 24,
    "rope_freq_dim": 4,
    "rope_theta": 10000.0,
    "norm_eps": 1e-05,
    "qk_norm_eps": 1e-05,
    "final_norm_eps": 1e-05,
}
TEXT_CONFIG: dict[str, Any] = {
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
    "num_hidden_layers": TAP + 1,
    "num_key_value_heads": 1,
    "rms_norm_eps": 1e-06,
    "rope_scaling": {"mrope_interleaved": True, "mrope_section": [2, 1, 1], "rope_type": "default"},
    "rope_theta": 5000000,
    "use_cache": True,
    "vocab_size": 151936,
}


def tensor_for(name: str, shape: tuple[int, ...]) -> np.ndarray:
    """A reproducible random tensor whose scale suits its role: the DiT (and VAEs) fp32, the text encoder bf16."""
    rng = name_rng(name)
    text = name.startswith("model.")
    # norm weights and weight-norm magnitudes near 1 (rows of norm ~1 keep the signal's scale)
    norm_weight = name.endswith(".weight") and "norm" in name and len(shape) == 1
    if name.endswith(".weight_g") or norm_weight:
        arr = 1.0 + 0.1 * rng.standard_normal(shape)
    elif name.endswith(".bias") or len(shape) == 1:
        arr = 0.1 * rng.standard_normal(shape)
    else:
        arr = random_weight(rng, name, shape)
    return arr.astype(np.float32).astype(BF16 if text else np.float32)


TINY_VIDEO_VAE: dict[str, Any] = {  # the published geometry (16x, 4x, 17-frame clips) at toy widths
    "block_out_channels": [8, 8, 8, 8, 8, 8],
    "norm_num_groups": 4,
    "layers_per_block": 1,
    "decoder_num_layers": 1,
    "decoder_num_attention_heads": 2,
    "decoder_attention_head_dim": 16,
    "decoder_ffn_mult": 2,
}


def _video_vae() -> tuple[dict[str, Any], dict[str, tuple[int, ...]]] | None:
    """vae/: the published config at toy widths, the decoder's and the (keyframe) encoder's tensors from the
    package's `build_video_decoder` / `build_video_encoder`."""
    try:
        from dif_frontend_h3.vae_config import VideoVaeConfig
        from dif_frontend_h3.video_vae import build_video_decoder
        from dif_frontend_h3.video_vae_encoder import build_video_encoder
    except ImportError:
        return None
    config = json.loads((PUBLISHED / "vae" / "config.json").read_text())
    config.update(TINY_VIDEO_VAE, _diffusers_version=VERSION)
    cfg = VideoVaeConfig.from_dict(config)
    decoder = build_video_decoder(cfg, frames=1, height=1, width=1)
    return config, param_shapes(decoder, build_video_encoder(cfg, height=32, width=32))


TINY_AUDIO_VAE: dict[str, Any] = {  # the published rates (hop 800 = 40 latents/s at 32 kHz) at toy widths
    "latent_dim": 16,
    "decoder_dim": 128,  # halves at each of the 7 upsampling stages
    "resblock_kernel_sizes": [3, 7],
    "resblock_dilation_sizes": [[1, 3], [1, 3]],
    "encoder_dim": 4,
}


def _audio_vae() -> tuple[dict[str, Any], dict[str, tuple[int, ...]]] | None:
    """audio_vae/: the published config at toy widths, decoder tensors from the package's
    `build_audio_decoder`, every conv stored as the checkpoint does, a weight-norm pair `weight_g` [d0, 1, 1]
    / `weight_v` (the encoder half, unused by t2va, is not written)."""
    try:
        from dif_frontend_h3.audio_vae import build_audio_decoder
        from dif_frontend_h3.vae_config import AudioVaeConfig
    except ImportError:
        return None
    config = json.loads((PUBLISHED / "audio_vae" / "config.json").read_text())
    config.update(TINY_AUDIO_VAE, _diffusers_version=VERSION)
    cfg = AudioVaeConfig.from_dict(config)
    shapes = {}
    for name, shape in param_shapes(build_audio_decoder(cfg, num_latents=4)).items():
        if name.endswith(".weight") and len(shape) == 3 and not name.endswith("filter"):
            stem = name[: -len(".weight")]
            shapes[f"{stem}.weight_g"] = (shape[0], 1, 1)
            shapes[f"{stem}.weight_v"] = shape
        else:
            shapes[name] = shape
    return config, shapes


def _vae_components() -> dict[str, tuple[dict[str, Any], dict[str, tuple[int, ...]]]]:
    found = {"vae": _video_vae(), "audio_vae": _audio_vae()}
    return {k: v for k, v in found.items() if v is not None}


def make(out: Path, tokenizer: Path) -> None:
    text_config = json.loads((PUBLISHED / "text_encoder" / "config.json").read_text())
    text_config["text_config"] = TEXT_CONFIG
    text_config["vision_config"].update(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=8,
                                        deepstack_visual_indexes=[0])  # fmt: skip
    t_cfg = H3TransformerConfig.from_dict(TRANSFORMER)
    q_cfg = H3TextConfig.from_dict(text_config)
    dit = param_shapes(build_denoiser(t_cfg, build_layout(np.ones(1, np.int64), 2, 2, 2, 1)))
    text = param_shapes(build_text_encoder(q_cfg, seq_len=4, tap=TAP))
    # a transformers save holds the whole stack: the last layer and the final norm the tap does not read
    text = {f"model.{n}": s for n, s in text.items()}
    last = {n.replace(f"layers.{TAP - 1}.", f"layers.{TAP}."): s for n, s in text.items() if f".layers.{TAP - 1}." in n}
    text.update(last)
    text["model.language_model.norm.weight"] = (q_cfg.hidden_size,)
    vision = build_vision_tower(H3VisionConfig.from_dict(text_config), images=1, grid_h=2, grid_w=2)
    text.update({f"model.{n}": s for n, s in param_shapes(vision).items()})
    components = {"transformer": (TRANSFORMER, dit), "text_encoder": (text_config, text), **_vae_components()}
    scheduler = {"_class_name": "MiniMaxH3Scheduler", "_diffusers_version": VERSION, "shift": 12.0}
    line = write_diffusers_folder(out, MODEL_INDEX, components, tensor_for, scheduler=scheduler, tokenizer=tokenizer)
    (out / "audio_scheduler").mkdir()
    (out / "processor").mkdir()
    (out / "processor" / "preprocessor_config.json").write_bytes(PROCESSOR.read_bytes())
    audio = {**scheduler, "shift": 3.0}
    (out / "audio_scheduler" / "scheduler_config.json").write_text(json.dumps(audio, indent=2) + "\n")
    print(line)


def main(argv: list[str] | None = None) -> int:
    return script_main(argv, description=(__doc__ or "").splitlines()[0], default_out=DEFAULT_OUT,
                       default_tokenizer=DEFAULT_TOKENIZER, make=make)  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
