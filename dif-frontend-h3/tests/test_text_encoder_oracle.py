"""Text features (fp32, CPU) against transformers' Qwen3VLForConditionalGeneration at a tiny random config,
saved with save_pretrained and read from disk: hidden_states[2] of 3 layers (the real model taps 50 of 64),
the prompt tokenized verbatim as the modular pipeline does (no template, no special tokens). Gate 1e-5."""

from __future__ import annotations

import pytest

from dif.interp import interpret
from dif.text import TextTokenizer
from dif.weights import open_component
from dif_frontend_h3 import DEFAULT_CHECKPOINT
from dif_frontend_h3.config import H3TextConfig
from dif_frontend_h3.text_encoder import build_text_encoder, prompt_ids, text_inputs
from dif_frontend_h3.weights import bind_text_encoder

pytestmark = pytest.mark.oracle
TOKENIZER = DEFAULT_CHECKPOINT / "tokenizer"


def test_text_features_match_transformers(torch, tiny, randomize, rel_l2_fn, tmp_path) -> None:  # type: ignore[no-untyped-def]
    transformers = pytest.importorskip("transformers")
    cfg = transformers.Qwen3VLConfig(text_config=tiny.text, vision_config=tiny.vision)
    model = transformers.Qwen3VLForConditionalGeneration(cfg).eval()
    randomize(model, torch, 3)
    model.save_pretrained(tmp_path / "text_encoder")
    ref_tok = transformers.AutoTokenizer.from_pretrained(TOKENIZER)
    tok = TextTokenizer.from_folder(TOKENIZER)
    prompt = "A lighthouse at dusk, waves <|im_end|> crash; 海浪"
    want_ids = ref_tok(prompt, add_special_tokens=False)["input_ids"]
    ids = prompt_ids(tok, prompt)
    assert ids[0].tolist() == want_ids
    t_ids = torch.tensor([want_ids])
    hs = model.model(input_ids=t_ids, attention_mask=torch.ones_like(t_ids), output_hidden_states=True).hidden_states
    want = hs[tiny.tap].numpy()

    source = open_component(tmp_path / "text_encoder")
    te_cfg = H3TextConfig.from_dict(cfg.to_dict())
    prog = build_text_encoder(te_cfg, seq_len=ids.shape[1], tap=tiny.tap)
    got = interpret(prog, text_inputs(te_cfg, ids), bind_text_encoder(prog, source))[prog.outputs[0]]
    err = rel_l2_fn(got, want)
    print(f"text features rel-L2 {err:.2e}")
    assert err <= 1e-5
    assert rel_l2_fn(got, hs[tiny.tap + 1].numpy()) > 1e-2  # the tap is the right layer, not a neighbour
