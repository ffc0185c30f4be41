"""Shared fixtures for the FLUX.2 frontend tests: oracle availability, weight loading, metrics.

Oracle tests (marker `oracle`) build tiny random diffusers/transformers models, save them with
`save_pretrained`, and read them back with dif's own safetensors reader, so the program's
parameter names are checked against the real on-disk layout.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "oracle: needs torch + diffusers/transformers as reference oracles")


@pytest.fixture(scope="session")
def torch():  # type: ignore[no-untyped-def]
    """The torch module (tests using it skip with a reason when it is not installed)."""
    mod = pytest.importorskip("torch", reason="oracle tests need torch")
    mod.set_grad_enabled(False)
    return mod


@pytest.fixture(scope="session")
def model_configs() -> Callable[[str], Path]:
    """variant ("klein-4b", ...) -> the folder of its published configs (the package's `configs/` data)."""
    from dif_frontend_flux2.configs import published

    return published


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """All tensors of one safetensors file via dif's reader (mmap views, copied to own them)."""
    from dif.serialize.diftensor import open_safetensors

    return {k: np.array(v) for k, v in open_safetensors(path).items()}


@pytest.fixture(scope="session")
def load_weights() -> Callable[[Path], dict[str, np.ndarray]]:
    """Read every `*.safetensors` file of a save_pretrained folder into one name -> array dict."""

    def load(folder: Path) -> dict[str, np.ndarray]:
        files = sorted(Path(folder).glob("*.safetensors"))
        assert files, f"no safetensors file in {folder}"
        out: dict[str, np.ndarray] = {}
        for f in files:
            out.update(read_safetensors(f))
        return out

    return load


def rel_l2(actual: np.ndarray, expected: np.ndarray) -> float:
    """||a - e|| / ||e|| in float64."""
    a = np.asarray(actual, dtype=np.float64)
    e = np.asarray(expected, dtype=np.float64)
    assert a.shape == e.shape, f"shape {a.shape} != {e.shape}"
    return float(np.linalg.norm(a - e) / max(np.linalg.norm(e), 1e-30))


@pytest.fixture(scope="session")
def rel_l2_fn() -> Callable[[np.ndarray, np.ndarray], float]:
    return rel_l2


def randomize_(module, torch, seed: int = 0) -> None:  # type: ignore[no-untyped-def]
    """Give a freshly initialised torch module non-trivial weights in place: every float
    parameter and buffer gets noise, norm weights stay near 1 and variances stay positive, so
    biases, norm weights and running statistics are all exercised. Only state-dict entries are
    touched (non-persistent buffers such as RoPE inverse frequencies are derived, not weights)."""
    gen = torch.Generator().manual_seed(seed)
    for name, t in module.state_dict(keep_vars=True).items():
        if not t.is_floating_point():
            continue
        t = t.data
        noise = torch.randn(t.shape, generator=gen, dtype=t.dtype)
        leaf = name.rsplit(".", 1)[-1]
        if "running_var" in leaf:
            t.copy_(0.5 + noise.abs())
        elif "norm" in name and leaf == "weight" and t.ndim == 1:
            t.copy_(1.0 + 0.2 * noise)
        elif t.ndim == 1:
            t.copy_(0.2 * noise)
        else:
            fan_in = max(1, t[0].numel())
            t.copy_(noise / fan_in**0.5)


@pytest.fixture(scope="session")
def randomize() -> Callable[..., None]:
    return randomize_


# -- tiny oracle models (shared by the fp32 and bf16 parity tests) -------------------------------

TINY_TRANSFORMER = dict(
    num_layers=1,
    num_single_layers=1,
    attention_head_dim=32,
    num_attention_heads=2,
    joint_attention_dim=48,
    in_channels=16,
    timestep_guidance_channels=64,
    axes_dims_rope=(8, 8, 8, 8),
    rope_theta=2000,
    mlp_ratio=3.0,
    eps=1e-6,
)


@pytest.fixture
def tiny_transformer(torch, tmp_path):  # type: ignore[no-untyped-def]
    """factory(guidance_embeds) -> random Flux2Transformer2DModel saved to tmp_path."""
    diffusers = pytest.importorskip("diffusers", reason="oracle tests need diffusers")

    def make(guidance_embeds: bool = False):  # type: ignore[no-untyped-def]
        torch.manual_seed(0)
        model = diffusers.Flux2Transformer2DModel(**TINY_TRANSFORMER, guidance_embeds=guidance_embeds).eval()
        randomize_(model, torch, seed=1)
        return model

    return make


@pytest.fixture
def tiny_qwen3(torch):  # type: ignore[no-untyped-def]
    """A random 6-layer Qwen3ForCausalLM (GQA 4:2, head_dim 16, rope theta 1e4)."""
    transformers = pytest.importorskip("transformers", reason="oracle tests need transformers")
    config = transformers.Qwen3Config(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=6,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=128,
        rms_norm_eps=1e-6,
        rope_theta=10000.0,
        tie_word_embeddings=False,
    )
    torch.manual_seed(0)
    model = transformers.Qwen3ForCausalLM(config).eval()
    randomize_(model, torch, seed=2)
    return model


# -- the BFL (original) names of a diffusers transformer, for single-file and GGUF tests ----------

BFL_QKV = {"img_attn.qkv": ("to_q", "to_k", "to_v"), "txt_attn.qkv": ("add_q_proj", "add_k_proj", "add_v_proj")}


def bfl_state_dict(folder: Path) -> dict[str, np.ndarray]:
    """The diffusers transformer at `folder` under its original BFL names."""
    from dif.weights import open_component
    from dif_frontend_flux2.weights import _DOUBLE, _SINGLE, _TOP

    src = open_component(folder)
    w = {n: np.array(src[n]) for n in src.names()}
    out: dict[str, np.ndarray] = {}
    inverse_top = {v: k for k, v in _TOP.items()}
    for name, value in w.items():
        module, kind = name.rsplit(".", 1)
        if module in inverse_top:
            out[f"{inverse_top[module]}.{kind}"] = value
        elif module == "norm_out.linear":
            out[f"final_layer.adaLN_modulation.1.{kind}"] = np.concatenate(np.split(value, 2)[::-1])
        elif module.startswith("transformer_blocks."):
            _, i, inner = module.split(".", 2)
            for bfl, parts in BFL_QKV.items():
                if inner == f"attn.{parts[0]}":
                    fused = [w[f"transformer_blocks.{i}.attn.{p}.{kind}"] for p in parts]
                    out[f"double_blocks.{i}.{bfl}.{kind}"] = np.concatenate(fused)
            if any(inner == f"attn.{p}" for parts in BFL_QKV.values() for p in parts):
                continue
            bfl = {v: k for k, v in _DOUBLE.items()}[inner]
            out[f"double_blocks.{i}.{bfl}.{'scale' if 'norm' in bfl else kind}"] = value
        elif module.startswith("single_transformer_blocks."):
            _, i, inner = module.split(".", 2)
            bfl = {v: k for k, v in _SINGLE.items()}[inner]
            out[f"single_blocks.{i}.{bfl}.{'scale' if 'norm' in bfl else kind}"] = value
        else:
            raise AssertionError(name)
    return out


@pytest.fixture(scope="session")
def bfl_tensors() -> Callable[[Path], dict[str, np.ndarray]]:
    """folder -> the diffusers transformer saved there, under BFL names (q, k, v fused back)."""
    return bfl_state_dict
