"""Text conditioning, step 0: chat templates as small explicit formatters (no template engine).

Where it sits: before `dif.text.tokenizer`. Checkpoints ship Jinja chat templates; dif does not
run them. Each model family's frontend names the formatter that reproduces what its reference
pipeline's template renders for the messages that pipeline sends (and tests check the strings).

`chatml` is the ChatML layout of Qwen2/Qwen3/Qwen3-VL templates for plain-text messages:
    <|im_start|>{role}\\n{content}<|im_end|>\\n      per message
    <|im_start|>assistant\\n                          with add_generation_prompt
    <think>\\n\\n</think>\\n\\n                       Qwen3 only, when thinking is switched off
Not covered (no model here needs them): tools, multimodal content parts, assistant reasoning
history.
"""

from __future__ import annotations

from collections.abc import Sequence

from attrs import frozen

from dif.errors import DifError

ROLES = ("system", "user", "assistant")


@frozen
class Message:
    role: str
    content: str


def chatml(
    messages: Sequence[Message], *, add_generation_prompt: bool = True, enable_thinking: bool | None = None
) -> str:
    """The ChatML string for `messages`.

    enable_thinking=False appends the empty think block after the generation prompt, as Qwen3's
    template does for `enable_thinking=False`; None/True add nothing (thinking is then left to
    the model, which is also what templates without a thinking switch render).
    """
    parts = []
    for m in messages:
        if m.role not in ROLES:
            raise DifError(f"chat role '{m.role}' is not one of {ROLES}")
        parts.append(f"<|im_start|>{m.role}\n{m.content}<|im_end|>\n")
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
        if enable_thinking is False:
            parts.append("<think>\n\n</think>\n\n")
    return "".join(parts)
