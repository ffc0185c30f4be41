"""Full-size programs built from the published Krea 2 configs map onto the real modules exactly:
the torch models are built on the meta device (shapes only) and their state dicts compared with
the programs' parameters, name by name and shape by shape."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dif_frontend_krea2.config import load_configs
from dif_frontend_krea2.model import build_denoiser, build_text_fusion, build_transformer
from dif_frontend_krea2.text_encoder import build_text_encoder
from dif_frontend_krea2.vae import build_vae_decoder, unused_tensor_patterns

pytestmark = pytest.mark.oracle

KREA2_TRANSFORMER_PARAMS = 12_820_073_036  # the published count (dif_frontend_krea2/configs/SOURCES.md)


@pytest.mark.parametrize("variant", ["turbo", "raw"])
def test_transformer_names_and_shapes(torch, model_configs: Callable[[str], Path], variant: str) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    folder = model_configs(variant)
    cfgs = load_configs(folder)
    prog = build_transformer(cfgs.transformer, image_len=4096, text_len=512, dtype="bf16")
    with torch.device("meta"):
        cls = diffusers.Krea2Transformer2DModel
        ref = cls.from_config(cls.load_config(folder / "transformer"))
    expected = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    assert {p.name: p.type.shape for p in prog.params} == expected
    assert prog.param_count() == KREA2_TRANSFORMER_PARAMS == sum(v.numel() for v in ref.parameters())
    # the two programs the pipeline runs partition the same parameters
    fusion = build_text_fusion(cfgs.transformer, dtype="bf16")
    den = build_denoiser(cfgs.transformer, image_len=4096, dtype="bf16")
    f_names, d_names = {p.name for p in fusion.params}, {p.name for p in den.params}
    assert f_names | d_names == set(expected) and not f_names & d_names
    # provenance is recorded per block
    blocks = {prog.provenance[n.id].block for n in prog.nodes}
    assert {"transformer_blocks.27", "text_fusion.refiner_blocks.1", "final_layer", "txt_in"} <= blocks


def test_text_encoder_names_and_shapes(torch, model_configs: Callable[[str], Path]) -> None:  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    folder = model_configs("turbo")
    cfgs = load_configs(folder)
    taps = cfgs.pipeline.text_encoder_select_layers
    prog = build_text_encoder(cfgs.text_encoder, seq_len=546, taps=taps, drop_prefix=34, dtype="bf16")
    config = transformers.AutoConfig.from_pretrained(folder / "text_encoder")
    with torch.device("meta"):
        ref = transformers.Qwen3VLModel._from_config(config)
    expected = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    mine = {p.name: p.type.shape for p in prog.params}
    assert all(expected[name] == shape for name, shape in mine.items())
    # exactly the layers the deepest tap (35) needs: 35 of 36, no final norm, no vision tower
    needed = {k for k in expected if k.startswith("language_model.") and ".layers.35." not in k}
    assert set(mine) == needed - {"language_model.norm.weight"}
    assert prog.output_values[0].type.shape == (1, 512, 12, 2560)


def test_vae_decoder_names_and_shapes(torch, model_configs: Callable[[str], Path]) -> None:  # type: ignore[no-untyped-def]
    import re

    diffusers = pytest.importorskip("diffusers")
    folder = model_configs("turbo")
    cfgs = load_configs(folder)
    prog = build_vae_decoder(cfgs.vae, latent_h=128, latent_w=128, dtype="bf16")
    with torch.device("meta"):
        cls = diffusers.AutoencoderKLQwenImage
        ref = cls.from_config(cls.load_config(folder / "vae"))
    expected = {k: tuple(v.shape) for k, v in ref.state_dict().items()}
    unused = [re.compile(p) for p in unused_tensor_patterns()]
    used = {k: (s[:2] + s[3:] if len(s) == 5 else s) for k, s in expected.items()
            if not any(p.fullmatch(k) for p in unused)}  # 3D kernels: their last temporal tap
    assert {p.name: p.type.shape for p in prog.params} == used
    assert prog.output_values[0].type.shape == (1, 3, 1024, 1024)
