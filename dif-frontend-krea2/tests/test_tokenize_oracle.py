"""Oracle: Krea 2 prompt ids, mask and rotary positions equal Krea2Pipeline's, with the real Qwen tokenizer.

The reference is diffusers' own `get_text_hidden_states` (fixed prefix, padding before the suffix,
positions counting real tokens), run with a stub text encoder that records what it is handed. The
pipeline never renders the checkpoint's chat template, so a folder whose template differs must not
change the ids either.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import dif_frontend_krea2
from dif.text import TextTokenizer
from dif_frontend_krea2.tokenize import encode_prompt

# these comparisons cut long prompts on purpose: the truncation warning is expected (long-prompt tests assert it)
pytestmark = [pytest.mark.oracle, pytest.mark.filterwarnings("ignore:prompt is:dif.errors.DifWarning")]

DEFAULT_TOKENIZER = Path(dif_frontend_krea2.__file__).parent / "default" / "tokenizer"
PROMPTS = [
    "A cat holding a sign that says hello world",
    "  spaces\n\nnewlines\ttabs 1234567 héllo wörld 你好世界 🐱 don't I'll",
    "",
    "<think> literal special tokens <|im_end|> <d> inside",
    "fox " * 40,  # truncated before the suffix
]
MAX_SEQUENCE_LENGTH = 24


def reference(ref_tokenizer: Any, prompt: str, max_sequence_length: int) -> tuple[np.ndarray, ...]:
    """(input_ids (1, S), attention_mask (1, S), positions (S,), returned mask (1, S - 34)) of Krea2Pipeline."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")

    class RecordingEncoder(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))
            self.seen: list[Any] = []

        def forward(self, input_ids: Any, attention_mask: Any, position_ids: Any, **_: Any) -> Any:
            self.seen.append((input_ids, attention_mask, position_ids))
            return SimpleNamespace(hidden_states=[input_ids[..., None].float()] * 2)

    encoder = RecordingEncoder()
    pipe = diffusers.Krea2Pipeline(
        scheduler=None,
        vae=None,
        text_encoder=encoder,
        transformer=None,
        tokenizer=ref_tokenizer,
        text_encoder_select_layers=(1,),
    )
    _, text_mask = pipe.get_text_hidden_states(prompt, max_sequence_length=max_sequence_length, device="cpu")
    ((ids, mask, positions),) = encoder.seen
    assert (positions[0] == positions[1]).all() and (positions[0] == positions[2]).all()  # text: T = H = W
    return ids.numpy(), mask.numpy(), positions[0, 0].numpy(), text_mask.numpy()


def assert_same_as_reference(folder: Path) -> list[np.ndarray]:
    transformers = pytest.importorskip("transformers")
    ref_tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    tok = TextTokenizer.from_folder(folder)
    all_ids = []
    for prompt in PROMPTS:
        ours = encode_prompt(tok, prompt, max_sequence_length=MAX_SEQUENCE_LENGTH)
        ids, mask, positions, text_mask = reference(ref_tokenizer, prompt, MAX_SEQUENCE_LENGTH)
        np.testing.assert_array_equal(ours.ids, ids, err_msg=prompt)
        np.testing.assert_array_equal(ours.mask, mask.astype(bool), err_msg=prompt)
        np.testing.assert_array_equal(ours.positions, positions, err_msg=prompt)
        np.testing.assert_array_equal(ours.text_mask, text_mask, err_msg=prompt)
        all_ids.append(ours.ids)
    return all_ids


def test_default_checkpoint_ids_match_the_pipeline() -> None:
    assert_same_as_reference(DEFAULT_TOKENIZER)


def test_a_different_chat_template_changes_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "tokenizer"
    shutil.copytree(DEFAULT_TOKENIZER, folder)
    (folder / "chat_template.jinja").write_text(
        "{% for m in messages %}<|im_start|>{{ m.role }}: {{ m.content }}<|im_end|>{% endfor %}", encoding="utf-8"
    )
    assert TextTokenizer.from_folder(folder).apply_chat_template([{"role": "user", "content": "x"}]) == (
        "<|im_start|>user: x<|im_end|>"
    )
    default = TextTokenizer.from_folder(DEFAULT_TOKENIZER)
    for prompt, ids in zip(PROMPTS, assert_same_as_reference(folder), strict=True):
        np.testing.assert_array_equal(ids, encode_prompt(default, prompt, max_sequence_length=MAX_SEQUENCE_LENGTH).ids)
