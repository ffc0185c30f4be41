"""Shared fixtures for the Krea 2 frontend tests: oracle availability, tiny checkpoints, metrics.

Oracle tests (marker `oracle`) build tiny random diffusers/transformers models, write them with
`save_pretrained` into a Krea 2 diffusers folder (plus the real Qwen tokenizer files), and let dif
load that folder from disk, so names, layouts and the product path are all exercised.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from dif_frontend_krea2 import DEFAULT_CHECKPOINT

TOKENIZER_DIR = DEFAULT_CHECKPOINT / "tokenizer"  # the real Qwen3-VL tokenizer files Krea 2 ships

# Tiny but structurally complete: GQA everywhere, 2 layerwise + 1 refiner fusion blocks, 3 taps
# (one of them the final-normed last layer), a 4-level VAE with temporal up blocks.
TINY_TRANSFORMER: dict[str, Any] = dict(
    in_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=4, num_key_value_heads=2,
    intermediate_size=96, timestep_embed_dim=32, text_hidden_dim=32, num_text_layers=3,
    text_num_attention_heads=2, text_num_key_value_heads=1, text_intermediate_size=48,
    num_layerwise_text_blocks=2, num_refiner_text_blocks=1, axes_dims_rope=(4, 6, 6), rope_theta=1000.0,
    norm_eps=1e-5,
)
TINY_TAPS = (1, 2, 3)
TINY_TEXT: dict[str, Any] = dict(
    hidden_size=32, intermediate_size=48, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
    head_dim=8, vocab_size=151936,
    rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [2, 1, 1], "mrope_interleaved": True},
)
TINY_VISION: dict[str, Any] = dict(
    depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32, deepstack_visual_indexes=[0],
    patch_size=4, num_position_embeddings=16,
)
TINY_VAE: dict[str, Any] = dict(
    base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, temperal_downsample=[False, True, True],
    latents_mean=[0.1, -0.2, 0.3, 0.0], latents_std=[1.5, 0.7, 2.0, 1.0],
)
SCHEDULER: dict[str, Any] = dict(
    base_image_seq_len=256, base_shift=0.5, max_image_seq_len=6400, max_shift=1.15, num_train_timesteps=1000,
    shift=1.0, time_shift_type="exponential", use_dynamic_shifting=True,
)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "oracle: needs torch + diffusers/transformers as reference oracles")


@pytest.fixture(scope="session")
def tiny() -> SimpleNamespace:
    """The tiny configs (diffusers / transformers constructor keywords) the tests build from."""
    return SimpleNamespace(transformer=TINY_TRANSFORMER, taps=TINY_TAPS, text=TINY_TEXT, vision=TINY_VISION,
                           vae=TINY_VAE, scheduler=SCHEDULER)


@pytest.fixture(scope="session")
def rel_l2_fn() -> Callable[[np.ndarray, np.ndarray], float]:
    return rel_l2


def rel_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    """||a - e|| / ||e|| in float64."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"shape {a.shape} != {e.shape}"
    return float(np.linalg.norm(a - e) / max(np.linalg.norm(e), 1e-30))


@pytest.fixture(scope="session")
def torch():  # type: ignore[no-untyped-def]
    """The torch module (tests using it skip with a reason when it is not installed)."""
    mod = pytest.importorskip("torch", reason="oracle tests need torch")
    mod.set_grad_enabled(False)
    return mod


@pytest.fixture(scope="session")
def model_configs() -> Callable[[str], Path]:
    """variant ("turbo" | "raw") -> the folder of its published configs (the package's `configs/` data)."""
    from dif_frontend_krea2.configs import published

    return published


@pytest.fixture(scope="session")
def tokenizer_dir() -> Path:
    """The Qwen3-VL tokenizer folder (vocab.json, merges.txt, tokenizer_config.json) of the embedded checkpoint."""
    return TOKENIZER_DIR


def randomize_(module: Any, torch: Any, seed: int) -> None:
    """Non-trivial weights in place: zero-initialised tables and zero-centred norms get noise too,
    so every parameter matters to the output (a wrong name or layout cannot hide)."""
    gen = torch.Generator().manual_seed(seed)
    for name, t in module.named_parameters():
        noise = torch.randn(t.shape, generator=gen, dtype=t.dtype)
        leaf = name.rsplit(".", 1)[-1]
        if leaf == "gamma" or ("norm" in name and t.ndim == 1 and name.startswith(("language_model", "model."))):
            t.copy_(1.0 + 0.2 * noise)  # multiplicative norm weights stay near 1
        elif t.ndim == 1 or "scale_shift_table" in name or "norm" in name:
            t.copy_(0.2 * noise)
        else:
            fan_in = max(1, t[0].numel())
            t.copy_(noise / fan_in**0.5)


def make_checkpoint(root: Path, torch: Any, *, distilled: bool, seed: int = 0) -> Path:
    """A tiny Krea 2 diffusers folder at `root` (model_index, 4 components, real tokenizer files)."""
    import diffusers
    import transformers

    root.mkdir(parents=True, exist_ok=True)
    tm = diffusers.Krea2Transformer2DModel(**TINY_TRANSFORMER).eval()
    randomize_(tm, torch, seed)
    tm.save_pretrained(root / "transformer")
    te = transformers.Qwen3VLModel(
        transformers.Qwen3VLConfig(text_config=TINY_TEXT, vision_config=TINY_VISION)
    ).eval()
    randomize_(te, torch, seed + 1)
    te.save_pretrained(root / "text_encoder")
    vae = diffusers.AutoencoderKLQwenImage(**TINY_VAE).eval()
    randomize_(vae, torch, seed + 2)
    vae.save_pretrained(root / "vae")
    diffusers.FlowMatchEulerDiscreteScheduler(**SCHEDULER).save_pretrained(root / "scheduler")
    shutil.copytree(TOKENIZER_DIR, root / "tokenizer", dirs_exist_ok=True)
    index = {
        "_class_name": "Krea2Pipeline",
        "_diffusers_version": diffusers.__version__,
        "is_distilled": distilled,
        "patch_size": 2,
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
        "text_encoder": ["transformers", "Qwen3VLModel"],
        "text_encoder_select_layers": list(TINY_TAPS),
        "tokenizer": ["transformers", "Qwen2Tokenizer"],
        "transformer": ["diffusers", "Krea2Transformer2DModel"],
        "vae": ["diffusers", "AutoencoderKLQwenImage"],
    }
    (root / "model_index.json").write_text(json.dumps(index, indent=2))
    return root


@pytest.fixture(scope="session")
def tiny_checkpoints(torch, tokenizer_dir, tmp_path_factory) -> dict[str, Path]:  # type: ignore[no-untyped-def]
    """{'turbo': folder, 'raw': folder}: the same tiny weights, differing only in `is_distilled`."""
    pytest.importorskip("diffusers", reason="oracle tests need diffusers")
    pytest.importorskip("transformers", reason="oracle tests need transformers")
    base = tmp_path_factory.mktemp("krea2")
    turbo = make_checkpoint(base / "turbo", torch, distilled=True)
    raw = base / "raw"
    shutil.copytree(turbo, raw)
    index = json.loads((raw / "model_index.json").read_text())
    index["is_distilled"] = False
    (raw / "model_index.json").write_text(json.dumps(index, indent=2))
    return {"turbo": turbo, "raw": raw}
