"""Shared fixtures for the SD-Turbo frontend tests: oracle availability, tiny checkpoints, metrics.

Oracle tests (marker `oracle`) build tiny random diffusers/transformers models, write them with
`save_pretrained` into an SD-Turbo diffusers folder (plus the embedded checkpoint's small CLIP-style
tokenizer files), and let dif load that folder from disk, so names, layouts and the product path are
all exercised.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dif_frontend_sdturbo import DEFAULT_CHECKPOINT

TOKENIZER_DIR = DEFAULT_CHECKPOINT / "tokenizer"

# Tiny but structurally complete: 3 levels (two with cross-attention, one plain), 2 layers per block,
# per-block head counts as SD 2.x gives them, linear projections, 2 transformer layers in one level.
TINY_UNET: dict[str, Any] = dict(
    sample_size=16,
    in_channels=4,
    out_channels=4,
    block_out_channels=(32, 64, 64),
    layers_per_block=2,
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    attention_head_dim=(2, 4, 4),
    cross_attention_dim=32,
    norm_num_groups=8,
    use_linear_projection=True,
    transformer_layers_per_block=(1, 2, 1),
)
TINY_TEXT: dict[str, Any] = dict(
    vocab_size=1000,
    hidden_size=32,
    intermediate_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    max_position_embeddings=77,
    hidden_act="gelu",
    layer_norm_eps=1e-5,
    bos_token_id=0,
    eos_token_id=2,
    pad_token_id=1,
    projection_dim=16,
)
TINY_VAE: dict[str, Any] = dict(
    in_channels=3,
    out_channels=3,
    latent_channels=4,
    block_out_channels=(16, 32, 32, 32),
    layers_per_block=1,
    norm_num_groups=8,
    down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
    scaling_factor=0.18215,
    sample_size=64,
)
TINY_TAESD: dict[str, Any] = dict(
    encoder_block_out_channels=(8, 8, 8, 8),
    decoder_block_out_channels=(16, 16, 16, 16),
    num_encoder_blocks=(1, 1, 1, 1),
    num_decoder_blocks=(2, 1, 1, 1),
    latent_channels=4,
)
SCHEDULER: dict[str, Any] = dict(
    beta_start=0.00085,
    beta_end=0.012,
    beta_schedule="scaled_linear",
    num_train_timesteps=1000,
    prediction_type="epsilon",
    timestep_spacing="trailing",
    steps_offset=1,
    interpolation_type="linear",
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "oracle: needs torch + diffusers/transformers as reference oracles")


def rel_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    """||a - e|| / ||e|| in float64."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"shape {a.shape} != {e.shape}"
    return float(np.linalg.norm(a - e) / max(np.linalg.norm(e), 1e-30))


@pytest.fixture(scope="session")
def rel_l2_fn():  # type: ignore[no-untyped-def]
    return rel_l2


@pytest.fixture(scope="session")
def torch():  # type: ignore[no-untyped-def]
    """The torch module (tests using it skip with a reason when it is not installed)."""
    mod = pytest.importorskip("torch", reason="oracle tests need torch")
    mod.set_grad_enabled(False)
    return mod


def randomize_(module: Any, torch: Any, seed: int) -> None:
    """Non-trivial weights in place (norm gains near 1, biases and tables small noise), so every
    parameter matters to the output and a wrong name or layout cannot hide."""
    gen = torch.Generator().manual_seed(seed)
    for name, t in module.named_parameters():
        noise = torch.randn(t.shape, generator=gen, dtype=t.dtype)
        if t.ndim == 1 and "norm" in name and name.endswith("weight"):
            t.copy_(1.0 + 0.2 * noise)
        elif t.ndim == 1:
            t.copy_(0.2 * noise)
        else:
            fan_in = max(1, t[0].numel())
            t.copy_(noise / fan_in**0.5)


def make_checkpoint(root: Path, torch: Any, *, seed: int = 0, scheduler: dict[str, Any] | None = None) -> Path:
    """A tiny SD-Turbo diffusers folder at `root` (model_index, 4 components, tokenizer) and a TAESD
    folder beside it (`root.parent / (root.name + "-taesd")`)."""
    import diffusers
    import transformers

    root.mkdir(parents=True, exist_ok=True)
    unet = diffusers.UNet2DConditionModel(**TINY_UNET).eval()
    randomize_(unet, torch, seed)
    unet.save_pretrained(root / "unet")
    te = transformers.CLIPTextModel(transformers.CLIPTextConfig(**TINY_TEXT)).eval()
    randomize_(te, torch, seed + 1)
    te.save_pretrained(root / "text_encoder")
    vae = diffusers.AutoencoderKL(**TINY_VAE).eval()
    randomize_(vae, torch, seed + 2)
    vae.save_pretrained(root / "vae")
    diffusers.EulerDiscreteScheduler(**(scheduler or SCHEDULER)).save_pretrained(root / "scheduler")
    shutil.copytree(TOKENIZER_DIR, root / "tokenizer", dirs_exist_ok=True)
    index = {
        "_class_name": "StableDiffusionPipeline",
        "_diffusers_version": diffusers.__version__,
        "feature_extractor": [None, None], "image_encoder": [None, None], "requires_safety_checker": False,
        "safety_checker": [None, None], "scheduler": ["diffusers", "EulerDiscreteScheduler"],
        "text_encoder": ["transformers", "CLIPTextModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
        "unet": ["diffusers", "UNet2DConditionModel"], "vae": ["diffusers", "AutoencoderKL"],
    }  # fmt: skip
    (root / "model_index.json").write_text(json.dumps(index, indent=2))
    taesd = diffusers.AutoencoderTiny(**TINY_TAESD).eval()
    randomize_(taesd, torch, seed + 3)
    taesd.save_pretrained(root.parent / f"{root.name}-taesd")
    return root


@pytest.fixture(scope="session")
def tiny_checkpoint(torch, tmp_path_factory) -> Path:  # type: ignore[no-untyped-def]
    """A tiny SD-Turbo folder (random weights) written by diffusers / transformers; its TAESD beside it."""
    pytest.importorskip("diffusers", reason="oracle tests need diffusers")
    pytest.importorskip("transformers", reason="oracle tests need transformers")
    return make_checkpoint(tmp_path_factory.mktemp("sdturbo") / "sd-turbo-tiny", torch)
