"""Prompt text -> token ids: explicit chat formatters and a tokenizer over a checkpoint's files."""

from dif.text.chat import Message, chatml
from dif.text.tokenizer import QWEN2_SPLIT_PATTERN, TextTokenizer

__all__ = ["QWEN2_SPLIT_PATTERN", "Message", "TextTokenizer", "chatml"]
