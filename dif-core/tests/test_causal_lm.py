"""dif.layers.causal_lm: the decoder stack is built only as deep as the taps, numbered like
transformers' hidden_states (tap = layer count is the final-normed state)."""

from __future__ import annotations

import numpy as np
import pytest
from attrs import frozen

import dif.ops  # noqa: F401  (registers the core ops)
from dif.checkpoint import decoder_summary
from dif.dtypes import DType
from dif.errors import DifError
from dif.interp import interpret
from dif.ir.builder import ProgramBuilder
from dif.ir.program import Program
from dif.layers import (
    BaseDecoderConfig,
    DecoderLayerSpec,
    decoder_rope_tables,
    tapped_hidden_states,
    tapped_text_encoder,
)


@frozen
class TinyConfig:
    vocab_size: int = 11
    hidden_size: int = 8
    intermediate_size: int = 12
    num_hidden_layers: int = 3
    num_attention_heads: int = 2
    num_key_value_heads: int = 1
    head_dim: int = 4
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    attention_bias: bool = False


def _build(taps: tuple[int, ...], seq: int = 5) -> Program:
    cfg = TinyConfig()
    b = ProgramBuilder("tiny_lm")
    ids = b.input("ids", (1, seq), "i64")
    mask = b.input("mask", (1, seq), "bool")
    cos = b.input("cos", (seq, cfg.head_dim), "f32")
    sin = b.input("sin", (seq, cfg.head_dim), "f32")
    spec = DecoderLayerSpec.qwen3(cfg)
    outs = tapped_hidden_states(b, cfg, spec, "lm", ids, taps, key_mask=mask, cos=cos, sin=sin, dtype="f32")
    b.output(*outs)
    return b.build()


def _weights(program: Program) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {p.name: (rng.standard_normal(p.type.shape) * 0.3).astype(np.float32) for p in program.params}


def test_only_the_tapped_depth_is_built_and_the_last_tap_is_normed() -> None:
    shallow = {p.name for p in _build((0, 2)).params}
    assert "lm.layers.1.mlp.down_proj.weight" in shallow and not any(n.startswith("lm.layers.2.") for n in shallow)
    assert "lm.norm.weight" not in shallow
    full = _build((1, 3))
    assert "lm.norm.weight" in {p.name for p in full.params}
    assert full.provenance[full.nodes[-1].id].block == "lm.norm"

    seq = 5
    weights = _weights(full)
    cos, sin = decoder_rope_tables(TinyConfig(), np.arange(seq))
    inputs = {"ids": np.arange(seq, dtype=np.int64)[None], "mask": np.ones((1, seq), bool), "cos": cos, "sin": sin}
    tap1, tap3 = (interpret(full, inputs, weights)[name] for name in full.outputs)
    assert tap1.shape == tap3.shape == (1, seq, 8)
    # tap 3 = rms_norm(output of layer 2) * weight: divided by the weight, every row has unit RMS
    unit = tap3 / weights["lm.norm.weight"]
    np.testing.assert_allclose(np.sqrt(np.mean(unit.astype(np.float64) ** 2, axis=-1)), 1.0, rtol=1e-4)
    assert not np.allclose(np.sqrt(np.mean(tap1.astype(np.float64) ** 2, axis=-1)), 1.0, rtol=1e-2)


def test_taps_out_of_range() -> None:
    with pytest.raises(DifError, match=r"taps \(4,\) must lie in 0..3"):
        _build((4,))


def test_tapped_text_encoder_declares_the_inputs_and_matches_the_stack() -> None:
    cfg = BaseDecoderConfig(11, 8, 12, 3, 2, 1, 4)  # vocab, hidden, mlp, layers, heads, kv heads, head dim
    assert cfg.rope_theta == 10_000.0 and decoder_summary(cfg) == {"layers": 3, "hidden": 8, "heads": 2, "kv_heads": 1}
    b = ProgramBuilder("te")
    spec = DecoderLayerSpec.qwen3(cfg)
    outs = tapped_text_encoder(b, cfg, spec, "lm", (1, 3), batch=1, seq_len=5, dtype=DType.F32, family="toy")
    b.output(*outs)
    program = b.build()
    assert [(v.name, v.type.shape, v.type.dtype.value) for v in program.inputs] == [
        ("input_ids", (1, 5), "i64"),
        ("attention_mask", (1, 5), "bool"),
        ("rope_cos", (5, 4), "f32"),
        ("rope_sin", (5, 4), "f32"),
    ]
    assert program.meta == {"family": "toy", "component": "text_encoder", "dtype": "f32", "taps": "1,3"}
    assert {program.provenance[n.id].module for n in program.nodes} == {"text_encoder"}
    reference = _build((1, 3))  # same stack from tapped_hidden_states, inputs named differently
    cos, sin = decoder_rope_tables(cfg, np.arange(5))
    ids, mask = np.arange(5, dtype=np.int64)[None], np.ones((1, 5), bool)
    weights = _weights(reference)
    got = interpret(program, {"input_ids": ids, "attention_mask": mask, "rope_cos": cos, "rope_sin": sin}, weights)
    want = interpret(reference, {"ids": ids, "mask": mask, "cos": cos, "sin": sin}, weights)
    for a, b_ in zip(got.values(), want.values(), strict=True):
        np.testing.assert_array_equal(a, b_)
