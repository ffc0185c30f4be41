"""Checkpoint binding: bad checkpoints fail before anything runs, naming the tensor and its file;
the VAE's 3D kernels are read as their last temporal tap; the text encoder's two namings."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from dif.errors import WeightError
from dif.ir.program import Program
from dif.serialize.diftensor import save_tensors
from dif.weights import open_component
from dif_frontend_krea2.config import Krea2TransformerConfig, QwenImageVaeConfig, QwenVLTextConfig
from dif_frontend_krea2.model import build_denoiser, build_text_fusion, build_transformer
from dif_frontend_krea2.text_encoder import build_text_encoder
from dif_frontend_krea2.vae import build_vae_decoder
from dif_frontend_krea2.weights import (
    bind_denoiser,
    bind_text_encoder,
    bind_text_fusion,
    bind_transformer,
    bind_vae,
    last_temporal_tap,
)

FILE = "diffusion_pytorch_model.safetensors"


@pytest.fixture
def cfg(tiny: SimpleNamespace) -> Krea2TransformerConfig:
    return Krea2TransformerConfig.from_dict(tiny.transformer)


def _random(program: Program, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {p.name: rng.standard_normal(p.type.shape).astype(p.type.dtype.np) for p in program.params}


def _save(folder: Path, tensors: dict[str, np.ndarray], name: str = FILE) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    save_tensors(folder / name, tensors, dif_metadata=False)
    return folder


def test_transformer_bad_checkpoints_name_tensor_and_file(tmp_path: Path, cfg: Krea2TransformerConfig) -> None:
    prog = build_transformer(cfg, image_len=4, text_len=3)
    tensors = _random(prog)
    good = open_component(_save(tmp_path / "good", tensors))
    bound = bind_transformer(prog, good)
    assert set(bound) == {p.name for p in prog.params}

    missing = dict(tensors)
    missing.pop("transformer_blocks.1.attn.to_gate.weight")
    with pytest.raises(WeightError) as err:
        bind_transformer(prog, open_component(_save(tmp_path / "missing", missing)))
    assert "'transformer_blocks.1.attn.to_gate.weight'" in str(err.value) and "missing" in str(err.value)
    assert str(tmp_path / "missing") in str(err.value)

    bad = dict(tensors)
    bad["text_fusion.projector.weight"] = np.zeros((1, 4), np.float32)  # 4 taps instead of 3
    with pytest.raises(WeightError) as err:
        bind_transformer(prog, open_component(_save(tmp_path / "shape", bad)))
    msg = str(err.value)
    assert "'text_fusion.projector.weight'" in msg and str(tmp_path / "shape" / FILE) in msg
    assert "[1,3]" in msg.replace(" ", "") and "mis-shaped" in msg


def test_fusion_and_denoiser_split_the_checkpoint(tmp_path: Path, cfg: Krea2TransformerConfig) -> None:
    fusion = build_text_fusion(cfg, text_len=3)
    den = build_denoiser(cfg, image_len=4, text_len=3)
    tensors = _random(build_transformer(cfg, image_len=4, text_len=3))
    source = open_component(_save(tmp_path / "ok", tensors))
    fw, dw = bind_text_fusion(fusion, source), bind_denoiser(den, source)
    assert set(fw) | set(dw) == set(tensors) and not set(fw) & set(dw)
    extra = {**tensors, "transformer_blocks.0.attn.to_extra.weight": np.zeros((2, 2), np.float32)}
    with pytest.raises(WeightError, match=r"unexpected.*to_extra"):
        bind_denoiser(den, open_component(_save(tmp_path / "extra", extra)))


def test_vae_reads_last_temporal_tap(tmp_path: Path, tiny: SimpleNamespace) -> None:
    cfg = QwenImageVaeConfig.from_dict(tiny.vae)
    prog = build_vae_decoder(cfg, latent_h=2, latent_w=3)
    tensors = _random(prog)
    stored = {}
    for name, arr in tensors.items():  # causal convs are 5D on disk: (O, I, T, kh, kw)
        is_conv2d = ".resample.1." in name or ".attentions." in name
        if name.endswith(".weight") and arr.ndim == 4 and not is_conv2d:
            t = arr.shape[2]
            stored[name] = np.stack([arr * 7.0] * (t - 1) + [arr], axis=2) if t > 1 else arr[:, :, None]
        else:
            stored[name] = arr
    stored["decoder.up_blocks.0.upsamplers.0.time_conv.weight"] = np.zeros((16, 8, 3, 1, 1), np.float32)
    stored["encoder.conv_in.weight"] = np.zeros((8, 3, 3, 3, 3), np.float32)
    source = open_component(_save(tmp_path / "vae", stored))
    bound = bind_vae(prog, source)
    for name in ("decoder.conv_in.weight", "post_quant_conv.weight", "decoder.up_blocks.0.resnets.0.conv2.weight"):
        np.testing.assert_array_equal(bound[name], tensors[name])
    assert stored["decoder.conv_in.weight"].ndim == 5
    wrong = dict(stored)
    wrong["decoder.conv_out.weight"] = np.zeros((3, 5, 3, 3, 3), np.float32)
    with pytest.raises(WeightError) as err:
        bind_vae(prog, last_temporal_tap(open_component(_save(tmp_path / "bad", wrong))))
    msg = str(err.value)
    assert "'decoder.conv_out.weight'" in msg and "last temporal tap" in msg and str(tmp_path / "bad") in msg


def test_text_encoder_accepts_both_namings(tmp_path: Path) -> None:
    cfg = QwenVLTextConfig.from_dict({"model_type": "qwen3_vl_text", "vocab_size": 50, "hidden_size": 16,
                                      "intermediate_size": 24, "num_hidden_layers": 4, "num_attention_heads": 2,
                                      "num_key_value_heads": 1, "head_dim": 8})
    prog = build_text_encoder(cfg, seq_len=5, taps=(1, 2))
    assert not any(".layers.2." in p.name for p in prog.params)  # layers past the deepest tap are not built
    tensors = _random(prog)
    unused = {"language_model.layers.3.mlp.up_proj.weight": np.zeros((24, 16), np.float32),
              "language_model.norm.weight": np.ones(16, np.float32),
              "visual.blocks.0.attn.qkv.weight": np.zeros((3, 3), np.float32)}
    plain = open_component(_save(tmp_path / "plain", {**tensors, **unused}, "model.safetensors"))
    assert set(bind_text_encoder(prog, plain)) == set(tensors)
    prefixed = {"model." + k: v for k, v in {**tensors, **unused}.items()} | {"lm_head.weight": np.zeros((50, 16))}
    src = open_component(_save(tmp_path / "cg", prefixed, "model.safetensors"))
    bound = bind_text_encoder(prog, src)
    embed = "language_model.embed_tokens.weight"
    np.testing.assert_array_equal(bound[embed], tensors[embed])
    broken = {k: v for k, v in prefixed.items() if k != "model.language_model.layers.1.self_attn.k_norm.weight"}
    with pytest.raises(WeightError, match=r"model\.language_model\.layers\.1\.self_attn\.k_norm\.weight"):
        bind_text_encoder(prog, open_component(_save(tmp_path / "broken", broken, "model.safetensors")))
