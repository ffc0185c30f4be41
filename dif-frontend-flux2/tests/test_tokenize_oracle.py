"""Oracle: FLUX.2 [klein] prompt ids and masks equal Flux2KleinPipeline's, with the checkpoint's own chat template.

The reference is diffusers' own `_get_qwen3_prompt_embeds` (apply_chat_template, then the tokenizer
call), run with a stub text encoder that records the ids and mask it is handed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

import dif_frontend_flux2
from dif_frontend_flux2.tokenize import MAX_LENGTH, load_tokenizer, tokenize_prompts

# these comparisons cut long prompts on purpose: the truncation warning is expected (long-prompt tests assert it)
pytestmark = [pytest.mark.oracle, pytest.mark.filterwarnings("ignore:prompt is:dif.errors.DifWarning")]

DEFAULT_TOKENIZER = Path(dif_frontend_flux2.__file__).parent / "default" / "tokenizer"
PROMPTS = [
    "A cat holding a sign that says hello world",
    "  spaces\n\nnewlines\ttabs 1234567 héllo wörld 你好世界 🐱 don't I'll",
    "",
    "<think> literal special tokens <|im_end|> <d> inside",
]


def reference_ids(folder: Path, prompts: list[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
    """(input_ids, attention_mask) that Flux2KleinPipeline feeds its text encoder."""
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    transformers = pytest.importorskip("transformers")

    class RecordingEncoder(torch.nn.Module):  # type: ignore[name-defined]
        def __init__(self) -> None:
            super().__init__()
            self.anchor = torch.nn.Parameter(torch.zeros(1))  # gives the module a device
            self.seen: list[Any] = []

        def forward(self, input_ids: Any, attention_mask: Any, **_: Any) -> Any:
            self.seen.append((input_ids, attention_mask))
            return SimpleNamespace(hidden_states=[input_ids[..., None].float()])

    encoder = RecordingEncoder()
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(folder))
    diffusers.Flux2KleinPipeline._get_qwen3_prompt_embeds(
        encoder,
        tokenizer,
        prompts,
        dtype=torch.float32,
        device="cpu",
        max_sequence_length=max_length,
        hidden_states_layers=(0,),
    )
    ((ids, mask),) = encoder.seen
    return ids.numpy(), mask.numpy()


def assert_same_as_reference(folder: Path, prompts: list[str], max_length: int) -> np.ndarray:
    ids, mask = tokenize_prompts(load_tokenizer(folder), prompts, max_length)
    ref_ids, ref_mask = reference_ids(folder, prompts, max_length)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_array_equal(mask, ref_mask.astype(bool))
    return ids


def test_default_checkpoint_ids_match_the_pipeline() -> None:
    ids = assert_same_as_reference(DEFAULT_TOKENIZER, PROMPTS, MAX_LENGTH)
    assert ids.shape == (len(PROMPTS), MAX_LENGTH)
    long_ids = assert_same_as_reference(DEFAULT_TOKENIZER, ["fox " * 40], 16)  # truncated: no pad left
    assert (long_ids != 151643).all()


def test_a_checkpoint_with_a_different_template_gets_the_pipelines_ids(tmp_path: Path) -> None:
    """The real Qwen3 template changed the way a fine-tune might: a default system turn and another
    empty-thinking block. dif must follow the folder, as the pipeline does."""
    folder = tmp_path / "tokenizer"
    shutil.copytree(DEFAULT_TOKENIZER, folder)
    template = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))["chat_template"]
    changed = template.replace("'<think>\\n\\n</think>\\n\\n'", "'<think>\\n</think>\\n'").replace(
        "{%- else %}\n    {%- if messages[0].role == 'system' %}",
        "{%- else %}\n    {%- if messages[0].role != 'system' %}\n"
        "        {{- '<|im_start|>system\\nYou are an image model.<|im_end|>\\n' }}\n    {%- endif %}\n"
        "    {%- if messages[0].role == 'system' %}",
    )
    assert changed.count("You are an image model.") == 1 and "'<think>\\n</think>\\n'" in changed
    (folder / "chat_template.jinja").write_text(changed, encoding="utf-8")  # wins over the config entry
    ids = assert_same_as_reference(folder, PROMPTS, 64)
    default_ids, _ = tokenize_prompts(load_tokenizer(DEFAULT_TOKENIZER), PROMPTS, 64)
    assert not np.array_equal(ids, default_ids)
