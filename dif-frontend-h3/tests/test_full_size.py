"""Full-size architecture from the published configs (package data): the DiT program's parameter names and
shapes equal diffusers' MiniMaxH3Transformer3DModel built on the meta device (no allocation) and the
published safetensors index, 33,122,992,896 parameters; the text-encoder program's equal transformers'
Qwen3-VL text stack up to the tap (layers 0..49)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from dif_frontend_h3.config import load_configs
from dif_frontend_h3.configs import published
from dif_frontend_h3.layout import build_layout
from dif_frontend_h3.model import build_denoiser
from dif_frontend_h3.text_encoder import build_text_encoder

DIT_PARAMS = 33_122_992_896


def _dit_shapes() -> dict[str, tuple[int, ...]]:
    cfg = load_configs(published("h3")).transformer
    prog = build_denoiser(cfg, build_layout(np.ones(2, np.int64), 2, 2, 2, 1))
    return {p.name: tuple(p.type.shape) for p in prog.params}


def test_dit_names_match_published_index() -> None:
    shapes = _dit_shapes()
    index = json.loads((published("h3") / "transformer" / "diffusion_pytorch_model.safetensors.index.json").read_text())
    assert set(shapes) == set(index["weight_map"])
    assert sum(math.prod(s) for s in shapes.values()) == DIT_PARAMS


@pytest.mark.oracle
def test_dit_matches_diffusers_on_meta(torch) -> None:  # type: ignore[no-untyped-def]
    diffusers = pytest.importorskip("diffusers")
    cfg = json.loads((published("h3") / "transformer" / "config.json").read_text())
    with torch.device("meta"):
        model = diffusers.MiniMaxH3Transformer3DModel.from_config(cfg)
    want = {n: tuple(p.shape) for n, p in model.named_parameters()}
    assert _dit_shapes() == want
    assert sum(math.prod(s) for s in want.values()) == DIT_PARAMS


@pytest.mark.oracle
def test_text_encoder_matches_transformers_on_meta(torch) -> None:  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    configs = load_configs(published("h3"))
    prog = build_text_encoder(configs.text_encoder, seq_len=4, tap=configs.text_encoder_layer)
    got = {p.name: tuple(p.type.shape) for p in prog.params}
    cfg = transformers.AutoConfig.from_pretrained(published("h3") / "text_encoder")
    with torch.device("meta"):
        model = transformers.Qwen3VLForConditionalGeneration._from_config(cfg)
    want = {n: tuple(p.shape) for n, p in model.named_parameters() if n.startswith("model.language_model.")}
    want = {n[len("model.") :]: s for n, s in want.items() if not n.startswith("model.language_model.norm")}
    want = {n: s for n, s in want.items() if not (".layers." in n and int(n.split(".")[2]) >= 50)}
    assert got == want
