"""Krea 2 prompt layout: prompt text -> token ids, key mask and rotary positions for the text encoder.

Frontend stage 1a (before `text_encoder.py`). The reference formats a Qwen chat prompt with a
fixed system message, pads the *prompt part* to a fixed length and appends the assistant suffix
after the padding, so pads sit mid-sequence: `[prefix (34) | prompt | PAD ... | suffix (5)]`.
Prefix and suffix are the reference pipeline's own constants (Krea2Pipeline writes them out and
never calls `apply_chat_template`), so they are fixed here too, whatever chat template the
checkpoint's tokenizer folder carries; they equal Qwen3-VL's template rendered for
[system, user] + generation prompt (checked in the tests), and the 34 dropped rows depend on them.
Positions count real tokens only (`cumsum(mask) - 1`, clamped at 0), so the suffix continues
right after the last prompt token. The first 34 rows (the system prefix) are dropped after encoding.
"""

from __future__ import annotations

import warnings

import numpy as np
from attrs import frozen

from dif.errors import DifError, DifWarning
from dif.text import TextTokenizer

SYSTEM_PROMPT = (
    "Describe the image by detailing the color, shape, size, texture, quantity, text, spatial relationships of "
    "the objects and background:"
)
PROMPT_PREFIX = f"<|im_start|>system\n{SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n"
PROMPT_SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"
PREFIX_TOKENS = 34  # rows dropped after encoding (the reference's fixed count)
SUFFIX_TOKENS = 5  # the reference reserves this many positions for the suffix when padding
MAX_SEQUENCE_LENGTH = 512


@frozen(eq=False)
class PromptTokens:
    """One prompt in the Krea 2 layout.

    ids (1, S) i64; mask (1, S) bool (False on padding); positions (S,) i64 rotary positions;
    drop_prefix: rows dropped from the encoder output; suffix_len: tokens after the padding."""

    ids: np.ndarray
    mask: np.ndarray
    positions: np.ndarray
    drop_prefix: int
    suffix_len: int

    @property
    def seq_len(self) -> int:
        return int(self.ids.shape[1])

    @property
    def text_mask(self) -> np.ndarray:
        """(1, S - drop_prefix) bool: the key mask the transformer receives."""
        return self.mask[:, self.drop_prefix :]

    @property
    def num_prompt_tokens(self) -> int:
        """Real tokens of the user prompt (after truncation)."""
        return int(self.mask[0, self.drop_prefix : self.seq_len - self.suffix_len].sum())


def positions_from_mask(mask: np.ndarray) -> np.ndarray:
    """Rotary positions (S,) of one mask row (S,): cumsum(mask) - 1, clamped at 0."""
    m = np.asarray(mask).reshape(-1).astype(np.int64)
    return np.maximum(np.cumsum(m) - 1, 0)


def encode_prompt(
    tokenizer: TextTokenizer, prompt: str, *, max_sequence_length: int = MAX_SEQUENCE_LENGTH
) -> PromptTokens:
    """Tokenize `prompt` into the Krea 2 layout; the encoder output keeps `max_sequence_length` rows
    (plus any difference if the suffix does not tokenize to 5 tokens, as in the reference). A
    prompt longer than the room left (`max_sequence_length` - 5 tokens) is cut, as the reference
    does, with a `DifWarning` giving both counts."""
    if max_sequence_length <= 0:
        raise DifError(f"max_sequence_length must be positive, got {max_sequence_length}")
    body_len = max_sequence_length + PREFIX_TOKENS - SUFFIX_TOKENS
    if (count := len(tokenizer.encode(PROMPT_PREFIX + prompt)) - PREFIX_TOKENS) > (room := body_len - PREFIX_TOKENS):
        warnings.warn(
            f"prompt is {count} tokens; the text encoder takes {room}: the last {count - room} are ignored",
            DifWarning,
            stacklevel=2,
        )
    ids, mask = tokenizer.encode_batch([PROMPT_PREFIX + prompt], body_len)
    suffix = np.asarray([tokenizer.encode(PROMPT_SUFFIX)], dtype=np.int64)
    all_ids = np.concatenate([ids, suffix], axis=1).astype(np.int64)
    all_mask = np.concatenate([mask.astype(bool), np.ones_like(suffix, dtype=bool)], axis=1)
    return PromptTokens(all_ids, all_mask, positions_from_mask(all_mask[0]), PREFIX_TOKENS, suffix.shape[1])
