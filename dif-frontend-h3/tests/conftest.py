"""Shared fixtures of the MiniMax-H3 frontend tests: tiny configs, the oracle modules, rel-L2.

The tiny configs keep every structural feature of the real model: attention wider than the residual
stream (2 x 32 > 48), partial RoPE (24 of 32 channels), a text refiner, different time-MLP widths, a
non-square latent canvas; the text encoder taps hidden_states[2] of a 3-layer Qwen3-VL stack (the real
model taps 50 of 64: an inner layer, never the final-normed one).
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

TINY_TRANSFORMER: dict[str, Any] = dict(
    num_attention_heads=2,
    attention_head_dim=32,
    hidden_size=48,
    num_layers=2,
    num_refiner_layers=1,
    ffn_dim=64,
    in_channels=4,
    audio_in_channels=8,
    patch_size=(1, 2, 2),
    text_dim=16,
    freq_dim=32,
    time_embed_hidden_dim=40,
    time_embed_dim=24,
    rope_freq_dim=4,
    rope_theta=10000.0,
)
TINY_TEXT: dict[str, Any] = dict(
    hidden_size=16,
    intermediate_size=40,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    vocab_size=151936,
    rope_parameters={"rope_type": "default", "rope_theta": 5e6, "mrope_section": [2, 1, 1], "mrope_interleaved": True},
)
TINY_VISION: dict[str, Any] = dict(
    depth=1,
    hidden_size=16,
    intermediate_size=32,
    num_heads=2,
    out_hidden_size=16,
    deepstack_visual_indexes=[0],
    patch_size=4,
    num_position_embeddings=16,
)
TINY_TAP = 2


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "oracle: needs torch + diffusers/transformers as reference oracles")


@pytest.fixture(scope="session")
def tiny() -> SimpleNamespace:
    return SimpleNamespace(transformer=TINY_TRANSFORMER, text=TINY_TEXT, vision=TINY_VISION, tap=TINY_TAP)


def rel_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    """||a - e|| / ||e|| in float64."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"shape {a.shape} != {e.shape}"
    return float(np.linalg.norm(a - e) / max(np.linalg.norm(e), 1e-30))


@pytest.fixture(scope="session")
def rel_l2_fn() -> Callable[[np.ndarray, np.ndarray], float]:
    return rel_l2


@pytest.fixture(scope="session")
def torch():  # type: ignore[no-untyped-def]
    mod = pytest.importorskip("torch", reason="oracle tests need torch")
    mod.set_grad_enabled(False)
    return mod


def randomize_(module: Any, torch: Any, seed: int) -> None:
    """Non-trivial weights in place (norm weights near 1, everything else scaled by fan-in), so every
    parameter matters to the output."""
    gen = torch.Generator().manual_seed(seed)
    for name, t in module.named_parameters():
        noise = torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype)
        if "norm" in name and t.ndim == 1:
            t.copy_(1.0 + 0.2 * noise)
        elif t.ndim == 1:
            t.copy_(0.2 * noise)
        else:
            t.copy_(noise / max(1, t[0].numel()) ** 0.5)


@pytest.fixture(scope="session")
def randomize() -> Callable[[Any, Any, int], None]:
    return randomize_
