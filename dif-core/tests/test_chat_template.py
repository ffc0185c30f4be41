"""dif.text.chat: the checkpoint's own chat template, found and rendered as transformers' tokenizer does.

Oracle tests compare with transformers (AutoTokenizer.from_pretrained + apply_chat_template(tokenize=False))
on the real Qwen3 and Qwen3-VL tokenizer folders that the embedded default checkpoints ship, on
copies whose template differs, and on broken templates.
"""

from __future__ import annotations

import json
import shutil
from datetime import datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dif.errors import CheckpointError
from dif.text import Message, TextTokenizer, find_chat_template

# Repo paths, not imports: dif-core's tests also run where only dif-core is installed.
REPO = Path(__file__).resolve().parents[2]
QWEN3 = REPO / "dif-frontend-flux2" / "src" / "dif_frontend_flux2" / "default" / "tokenizer"  # Qwen3 template
QWEN3_VL = REPO / "dif-frontend-krea2" / "src" / "dif_frontend_krea2" / "default" / "tokenizer"  # Qwen3-VL template
FOLDERS = [pytest.param(QWEN3, id="qwen3"), pytest.param(QWEN3_VL, id="qwen3-vl")]
needs_folders = pytest.mark.skipif(
    not (QWEN3 / "vocab.json").is_file() or not (QWEN3_VL / "vocab.json").is_file(),
    reason="the embedded default checkpoints' tokenizer folders are missing",
)
pytestmark = needs_folders

PROMPTS = [
    "A cat holding a sign that says hello world",
    "  spaces\n\nnewlines\ttabs 1234567 héllo wörld 你好世界 🐱 don't I'll",
    "",
    "<think> literal special tokens <|im_end|> <d> inside",
]
SYSTEM = "Describe the image by detailing the color, shape, size, texture, quantity, text:"
# (messages, add_generation_prompt, extra keywords): the reference pipelines' call plus turns around it.
CASES: list[tuple[list[dict[str, Any]], bool, dict[str, Any]]] = [
    *[([{"role": "user", "content": p}], True, {"enable_thinking": False}) for p in PROMPTS],
    ([{"role": "user", "content": PROMPTS[1]}], True, {}),
    ([{"role": "user", "content": PROMPTS[0]}], True, {"enable_thinking": True}),
    ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "a fox"}], True, {}),
    ([{"role": "system", "content": SYSTEM}, {"role": "user", "content": "a fox"}], False, {"enable_thinking": False}),
    (
        [
            {"role": "user", "content": "why?"},
            {"role": "assistant", "content": "<think>\nhm\n</think>\n\nbecause"},
            {"role": "user", "content": "and then?"},
            {"role": "assistant", "content": "<think>\nhm again\n</think>\n\nthen"},
        ],
        False,
        {},
    ),
]

# A template that differs from Qwen's: its own default system line, other role markers, the eos
# token from tokenizer_config.json, indented blocks (lstrip_blocks) and newlines after tags (trim_blocks).
DIFFERENT_TEMPLATE = """{%- if messages[0].role != 'system' %}
<|im_start|>system
You paint what you are told.{{ eos_token }}
{% endif %}
{% for m in messages %}
    {% if m.role == 'user' %}
<|im_start|>human: {{ m.content | trim }}<|im_end|>
    {% else %}
<|im_start|>{{ m.role }}: {{ m.content }}<|im_end|>
    {% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>painter:{% if enable_thinking is defined and not enable_thinking %} <think></think>{% endif %}

{% endif %}"""

# The environment's extras: tojson without HTML escaping and with its options, namespace, dict,
# loop controls, the {% generation %} block, string methods, and tools/documents being defined.
FEATURES_TEMPLATE = """{% set ns = namespace(n=0) %}
{% for m in messages %}{% set ns.n = ns.n + 1 %}{% if loop.index > 2 %}{% break %}{% endif %}
{% generation %}[{{ m.role | upper }}] {{ m.content.split(' ')[0] }}{% endgeneration %}
{% endfor %}
{{ messages | tojson }}|{{ dict(a=1, b='<&>') | tojson(indent=1, sort_keys=True) }}|{{ ns.n }}
|{{ tools is defined }}|{{ tools is none }}|{{ documents is none }}|{{ pad_token }}|{{ add_generation_prompt }}"""


def reference_tokenizer(folder: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(folder))


def reference_text(ref: Any, messages: list[dict[str, Any]], gen: bool, kwargs: dict[str, Any]) -> str:
    return str(ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=gen, **kwargs))


def copy_tokenizer(src: Path, dst: Path, *, drop_config_template: bool = False) -> Path:
    dst.mkdir(parents=True, exist_ok=True)
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(src / name, dst / name)
    config = json.loads((src / "tokenizer_config.json").read_text(encoding="utf-8"))
    if drop_config_template:
        config.pop("chat_template", None)
    (dst / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False), encoding="utf-8")
    return dst


# -- rendering equals transformers -----------------------------------------------------------------
@pytest.mark.oracle
@pytest.mark.parametrize("folder", FOLDERS)
def test_real_templates_render_as_transformers(folder: Path) -> None:
    ref = reference_tokenizer(folder)
    ours = TextTokenizer.from_folder(folder)
    assert ours.chat_template is not None and ours.chat_template.text == ref.chat_template
    for messages, gen, kwargs in CASES:
        text = ours.apply_chat_template(messages, add_generation_prompt=gen, **kwargs)
        assert text == reference_text(ref, messages, gen, kwargs), (messages, gen, kwargs)
    # Message objects render like the dicts the pipelines pass
    as_objects = ours.apply_chat_template([Message("user", PROMPTS[1])], add_generation_prompt=True)
    assert as_objects == reference_text(ref, [{"role": "user", "content": PROMPTS[1]}], True, {})


@pytest.mark.oracle
@pytest.mark.parametrize("folder", FOLDERS)
def test_rendered_prompts_tokenize_as_transformers(folder: Path) -> None:
    """The klein call (one user turn, thinking off), then ids and mask padded to a fixed length."""
    ref = reference_tokenizer(folder)
    ours = TextTokenizer.from_folder(folder)
    messages = [[{"role": "user", "content": p}] for p in PROMPTS]
    texts = [ours.apply_chat_template(m, add_generation_prompt=True, enable_thinking=False) for m in messages]
    ids, mask = ours.encode_batch(texts, 40)
    for row, m in enumerate(messages):
        expected = ref(
            reference_text(ref, m, True, {"enable_thinking": False}),
            padding="max_length",
            truncation=True,
            max_length=40,
        )
        np.testing.assert_array_equal(ids[row], np.array(expected["input_ids"]))
        np.testing.assert_array_equal(mask[row], np.array(expected["attention_mask"]))


@pytest.mark.oracle
def test_a_different_template_is_followed(tmp_path: Path) -> None:
    """A copy of the Qwen3 folder whose chat_template.jinja differs: dif renders and tokenizes what
    transformers does with that template, not a Qwen layout."""
    folder = copy_tokenizer(QWEN3, tmp_path / "tokenizer")
    (folder / "chat_template.jinja").write_text(DIFFERENT_TEMPLATE, encoding="utf-8")
    ref = reference_tokenizer(folder)
    ours = TextTokenizer.from_folder(folder)
    qwen = TextTokenizer.from_folder(QWEN3)
    for messages, gen, kwargs in CASES:
        text = ours.apply_chat_template(messages, add_generation_prompt=gen, **kwargs)
        assert text == reference_text(ref, messages, gen, kwargs), (messages, gen, kwargs)
        assert text != qwen.apply_chat_template(messages, add_generation_prompt=gen, **kwargs)
    prompt = [{"role": "user", "content": PROMPTS[1]}]
    text = ours.apply_chat_template(prompt, add_generation_prompt=True, enable_thinking=False)
    assert text.startswith("<|im_start|>system\nYou paint what you are told.<|im_end|>\n<|im_start|>human: ")
    ids, mask = ours.encode_batch([text], 64)
    expected = ref(
        reference_text(ref, prompt, True, {"enable_thinking": False}),
        padding="max_length",
        truncation=True,
        max_length=64,
    )
    np.testing.assert_array_equal(ids[0], np.array(expected["input_ids"]))
    np.testing.assert_array_equal(mask[0], np.array(expected["attention_mask"]))


@pytest.mark.oracle
def test_environment_features_match_transformers(tmp_path: Path) -> None:
    folder = copy_tokenizer(QWEN3, tmp_path / "tokenizer")
    (folder / "chat_template.jinja").write_text(FEATURES_TEMPLATE, encoding="utf-8")
    ref = reference_tokenizer(folder)
    ours = TextTokenizer.from_folder(folder)
    messages = [
        {"role": "system", "content": "ünïcode <b>&'\""},
        {"role": "user", "content": "hello there"},
        {"role": "user", "content": "never shown"},
    ]
    for gen in (False, True):
        assert ours.apply_chat_template(messages, add_generation_prompt=gen) == reference_text(ref, messages, gen, {})
    stamp = TextTokenizer.from_folder(copy_tokenizer(QWEN3, tmp_path / "stamp"))
    (tmp_path / "stamp" / "chat_template.jinja").write_text("{{ strftime_now('%Y') }}", encoding="utf-8")
    stamp = TextTokenizer.from_folder(tmp_path / "stamp")
    assert stamp.apply_chat_template([Message("user", "x")]) == str(datetime.now().year)


# -- where the template is found (transformers' tokenizer precedence) --------------------------------
@pytest.mark.oracle
def test_template_file_wins_over_config_and_named_lists_use_default(tmp_path: Path) -> None:
    user = [{"role": "user", "content": "a fox"}]
    jinja_wins = copy_tokenizer(QWEN3, tmp_path / "jinja")
    (jinja_wins / "chat_template.jinja").write_text("from the file: {{ messages[0].content }}", encoding="utf-8")
    named = copy_tokenizer(QWEN3, tmp_path / "named", drop_config_template=True)
    config = json.loads((named / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = [
        {"name": "tool_use", "template": "tools: {{ messages[0].content }}"},
        {"name": "default", "template": "default: {{ messages[0].content }}"},
    ]
    (named / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    extra = copy_tokenizer(QWEN3, tmp_path / "extra", drop_config_template=True)
    (extra / "chat_template.jinja").write_text("main: {{ messages[0].content }}", encoding="utf-8")
    (extra / "additional_chat_templates").mkdir()
    (extra / "additional_chat_templates" / "other.jinja").write_text("other", encoding="utf-8")
    for folder, expected in ((jinja_wins, "from the file: a fox"), (named, "default: a fox"), (extra, "main: a fox")):
        ours = TextTokenizer.from_folder(folder).apply_chat_template(user)
        assert ours == reference_text(reference_tokenizer(folder), user, False, {}) == expected
    found = find_chat_template(jinja_wins)
    assert found is not None and found.source == str(jinja_wins / "chat_template.jinja")


@pytest.mark.oracle
def test_no_template_is_an_error_naming_the_folder(tmp_path: Path) -> None:
    folder = copy_tokenizer(QWEN3, tmp_path / "tokenizer", drop_config_template=True)
    # a processor's chat_template.json is not read by the tokenizer the pipelines use
    (folder / "chat_template.json").write_text(json.dumps({"chat_template": "{{ 'x' }}"}), encoding="utf-8")
    assert reference_tokenizer(folder).chat_template is None
    tok = TextTokenizer.from_folder(folder)  # loading works: only rendering needs a template
    assert tok.chat_template is None
    with pytest.raises(CheckpointError, match="no chat template") as info:
        tok.apply_chat_template([Message("user", "x")])
    assert str(folder) in str(info.value) and "chat_template.json is read only by processors" in str(info.value)


def test_several_templates_without_default_is_an_error(tmp_path: Path) -> None:
    folder = copy_tokenizer(QWEN3, tmp_path / "tokenizer", drop_config_template=True)
    (folder / "additional_chat_templates").mkdir()
    for name in ("a", "b"):
        (folder / "additional_chat_templates" / f"{name}.jinja").write_text(name, encoding="utf-8")
    tok = TextTokenizer.from_folder(folder)  # loads: only rendering needs the template
    with pytest.raises(CheckpointError, match=r"several chat templates \(a, b\) and none named 'default'"):
        tok.apply_chat_template([Message("user", "x")])


def test_malformed_config_entry_names_the_file(tmp_path: Path) -> None:
    folder = copy_tokenizer(QWEN3, tmp_path / "tokenizer", drop_config_template=True)
    config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
    config["chat_template"] = {"default": "x"}
    (folder / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    tok = TextTokenizer.from_folder(folder)
    with pytest.raises(CheckpointError, match=r"tokenizer_config.json \"chat_template\": expected a string"):
        tok.apply_chat_template([Message("user", "x")])


# -- bad templates ------------------------------------------------------------------------------------
BAD_SYNTAX = "{% for m in messages %}{{ m.content }}"  # no endfor
RAISES = "{% if messages[0].role != 'system' %}{{ raise_exception('a system turn must come first') }}{% endif %}"


@pytest.mark.parametrize("where", ["jinja", "config"])
def test_invalid_jinja_is_an_error_naming_the_file(tmp_path: Path, where: str) -> None:
    folder = copy_tokenizer(QWEN3, tmp_path / "tokenizer", drop_config_template=True)
    if where == "jinja":
        (folder / "chat_template.jinja").write_text(BAD_SYNTAX, encoding="utf-8")
        source = str(folder / "chat_template.jinja")
    else:
        config = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "chat_template": BAD_SYNTAX}))
        source = f'{folder / "tokenizer_config.json"} "chat_template"'
    tok = TextTokenizer.from_folder(folder)  # compiled on first render, so loading still works
    with pytest.raises(CheckpointError, match="not valid Jinja") as info:
        tok.apply_chat_template([Message("user", "x")], add_generation_prompt=True)
    assert str(info.value).startswith(source + ":") and "endfor" in str(info.value)


def test_raise_exception_is_an_error_naming_the_file(tmp_path: Path) -> None:
    folder = copy_tokenizer(QWEN3, tmp_path / "tokenizer")
    (folder / "chat_template.jinja").write_text(RAISES, encoding="utf-8")
    tok = TextTokenizer.from_folder(folder)
    assert tok.apply_chat_template([Message("system", "s")]) == ""
    with pytest.raises(CheckpointError, match="a system turn must come first") as info:
        tok.apply_chat_template([Message("user", "x")])
    assert str(info.value).startswith(str(folder / "chat_template.jinja") + ":")


def test_sandbox_and_empty_conversation_are_errors(tmp_path: Path) -> None:
    folder = copy_tokenizer(QWEN3, tmp_path / "tokenizer")
    (folder / "chat_template.jinja").write_text("{{ messages.__class__ }}{% set ns = namespace(_x=1) %}")
    tok = TextTokenizer.from_folder(folder)
    with pytest.raises(CheckpointError, match="failed while rendering"):
        tok.apply_chat_template([Message("user", "x")])
    with pytest.raises(CheckpointError, match="empty conversation"):
        tok.apply_chat_template([])


@pytest.mark.oracle
def test_transformers_refuses_the_same_bad_templates(tmp_path: Path) -> None:
    """dif's errors stand where the reference fails too (it would not render a prompt either)."""
    jinja2 = pytest.importorskip("jinja2")
    for i, template in enumerate((BAD_SYNTAX, RAISES)):
        folder = copy_tokenizer(QWEN3, tmp_path / f"t{i}")
        (folder / "chat_template.jinja").write_text(template, encoding="utf-8")
        with pytest.raises(jinja2.TemplateError):
            reference_tokenizer(folder).apply_chat_template([{"role": "user", "content": "x"}], tokenize=False)
