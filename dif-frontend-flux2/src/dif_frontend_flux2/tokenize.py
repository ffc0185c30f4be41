"""FLUX.2 [klein] prompt -> token ids, exactly as Flux2KleinPipeline prepares them for Qwen3.

Frontend stage, before the text encoder: each prompt becomes one user turn rendered with the
checkpoint's own chat template (tokenizer/), as the reference does with
`apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, enable_thinking=False)`;
for Qwen3's template that is
    <|im_start|>user\\n{prompt}<|im_end|>\\n<|im_start|>assistant\\n<think>\\n\\n</think>\\n\\n
then is tokenized with the checkpoint's tokenizer files, truncated to 512 tokens and padded on
the right with <|endoftext|> to exactly 512 (every pad row still reaches the denoiser, pitfall 7).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from dif.errors import DifWarning
from dif.text import Message, TextTokenizer

MAX_LENGTH = 512


def klein_prompt_text(tokenizer: TextTokenizer, prompt: str) -> str:
    """The chat-formatted text the reference pipeline tokenizes for `prompt`."""
    return tokenizer.apply_chat_template([Message("user", prompt)], add_generation_prompt=True, enable_thinking=False)


def load_tokenizer(folder: str | Path) -> TextTokenizer:
    return TextTokenizer.from_folder(folder)


def tokenize_prompts(
    tokenizer: TextTokenizer, prompts: Sequence[str], max_length: int = MAX_LENGTH
) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids int64, attention_mask bool), both (len(prompts), max_length). A prompt whose
    chat-formatted text is longer than `max_length` tokens is cut, as the reference does, with a
    `DifWarning` giving both counts."""
    texts = [klein_prompt_text(tokenizer, p) for p in prompts]
    for text in texts:
        if (count := len(tokenizer.encode(text))) > max_length:
            warnings.warn(
                f"prompt is {count} tokens with its chat template; the text encoder takes {max_length}: "
                f"the last {count - max_length} are ignored",
                DifWarning,
                stacklevel=2,
            )
    ids, mask = tokenizer.encode_batch(texts, max_length)
    return ids, mask.astype(bool)
