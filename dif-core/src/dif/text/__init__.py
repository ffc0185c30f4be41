"""Prompt text -> token ids: the checkpoint's chat template (rendered as transformers does) and a
tokenizer over the checkpoint's files."""

from dif.text.chat import ChatTemplate, Message, find_chat_template
from dif.text.tokenizer import QWEN2_SPLIT_PATTERN, TextTokenizer

__all__ = ["QWEN2_SPLIT_PATTERN", "ChatTemplate", "Message", "TextTokenizer", "find_chat_template"]
