"""The Krea 2 prompt layout with the real Qwen tokenizer files: [prefix | prompt | PAD | suffix],
positions counting real tokens only (pitfall 8)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dif.errors import DifWarning
from dif.text import Message, TextTokenizer
from dif_frontend_krea2.tokenize import (
    PREFIX_TOKENS,
    PROMPT_PREFIX,
    PROMPT_SUFFIX,
    SUFFIX_TOKENS,
    SYSTEM_PROMPT,
    encode_prompt,
    positions_from_mask,
)


@pytest.fixture(scope="module")
def tok(tokenizer_dir: Path) -> TextTokenizer:
    return TextTokenizer.from_folder(tokenizer_dir)


def test_template_is_the_qwen_chat_layout(tok: TextTokenizer) -> None:
    # the reference's fixed strings are what the checkpoint's own (Qwen3-VL) template renders
    messages = [Message("system", SYSTEM_PROMPT), Message("user", "a fox")]
    rendered = tok.apply_chat_template(messages, add_generation_prompt=True)
    assert rendered == PROMPT_PREFIX + "a fox" + PROMPT_SUFFIX


def test_layout_pads_in_the_middle(tok: TextTokenizer) -> None:
    assert len(tok.encode(PROMPT_PREFIX)) == PREFIX_TOKENS
    assert len(tok.encode(PROMPT_SUFFIX)) == SUFFIX_TOKENS
    pt = encode_prompt(tok, "a red fox in the snow", max_sequence_length=24)
    n = pt.num_prompt_tokens
    assert pt.seq_len == 24 + PREFIX_TOKENS and pt.text_mask.shape == (1, 24) and pt.drop_prefix == PREFIX_TOKENS
    assert 0 < n < 24 - SUFFIX_TOKENS
    ids, mask = pt.ids[0], pt.mask[0]
    body = PREFIX_TOKENS + n
    assert ids[:PREFIX_TOKENS].tolist() == tok.encode(PROMPT_PREFIX)
    assert ids[PREFIX_TOKENS:body].tolist() == tok.encode("a red fox in the snow")
    assert (ids[body:-SUFFIX_TOKENS] == tok.pad_id).all() and not mask[body:-SUFFIX_TOKENS].any()
    assert ids[-SUFFIX_TOKENS:].tolist() == tok.encode(PROMPT_SUFFIX) and mask[-SUFFIX_TOKENS:].all()
    pos = pt.positions
    assert pos[: body].tolist() == list(range(body))
    assert (pos[body:-SUFFIX_TOKENS] == body - 1).all()  # pads reuse the last real position
    assert pos[-SUFFIX_TOKENS:].tolist() == list(range(body, body + SUFFIX_TOKENS))  # suffix continues


def test_long_prompt_truncates_before_the_suffix(tok: TextTokenizer) -> None:
    with pytest.warns(DifWarning, match=r"prompt is 101 tokens; the text encoder takes 11: the last 90 are ignored"):
        pt = encode_prompt(tok, "fox " * 100, max_sequence_length=16)
    assert pt.seq_len == 16 + PREFIX_TOKENS and pt.mask.all()
    assert pt.num_prompt_tokens == 16 - SUFFIX_TOKENS
    np.testing.assert_array_equal(pt.positions, np.arange(pt.seq_len))


def test_positions_from_mask() -> None:
    assert positions_from_mask(np.array([0, 1, 1, 0, 0, 1])).tolist() == [0, 0, 1, 1, 1, 2]
