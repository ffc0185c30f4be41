"""dif.text: the tokenizer over real Qwen files (vocab.json + merges.txt); chat templates: test_chat_template.py."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from dif.errors import CheckpointError
from dif.text import TextTokenizer

# The real Qwen3-VL tokenizer files as Krea 2's embedded checkpoint ships them: a repo path, not an import, since
# dif-core's tests also run where only dif-core is installed (tests/test_install_smoke.py).
QWEN = Path(__file__).resolve().parents[2] / "dif-frontend-krea2/src/dif_frontend_krea2/default/tokenizer"
needs_qwen = pytest.mark.skipif(not QWEN.is_dir(), reason=f"Qwen tokenizer files not found at {QWEN}")

PROMPTS = [
    "A cat holding a sign that says hello world",
    "  spaces\n\nnewlines\ttabs 1234567 héllo wörld 你好世界 🐱 don't I'll",
    "",
    "<think> literal special tokens <|im_end|> <d> inside",
]


def chat_text(prompt: str) -> str:
    """Qwen3's rendering of one user turn with thinking off: tokenizer input full of special tokens."""
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


@needs_qwen
def test_special_tokens_and_padding() -> None:
    tok = TextTokenizer.from_folder(QWEN)
    assert tok.pad_id == 151643  # <|endoftext|>
    ids = tok.encode(chat_text("hi"))
    assert ids[0] == tok.token_to_id("<|im_start|>") == 151644
    assert tok.token_to_id("<think>") in ids and tok.token_to_id("</think>") in ids
    batch, mask = tok.encode_batch(["hi", "word " * 600], max_length=16)
    assert batch.shape == mask.shape == (2, 16) and batch.dtype == np.int64
    assert mask[0].sum() == 1 and (batch[0, 1:] == 151643).all()
    assert mask[1].all()  # truncated to the first 16 tokens
    assert tok.decode(tok.encode("héllo 你好")) == "héllo 你好"


@needs_qwen
def test_bad_folders(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no tokenizer.json"):
        TextTokenizer.from_folder(tmp_path)
    shutil.copy(QWEN / "vocab.json", tmp_path / "vocab.json")
    shutil.copy(QWEN / "merges.txt", tmp_path / "merges.txt")
    config = json.loads((QWEN / "tokenizer_config.json").read_text())
    config["added_tokens_decoder"] = {"5": config["added_tokens_decoder"]["151643"]}
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="got id 151643, tokenizer_config.json says 5"):
        TextTokenizer.from_folder(tmp_path)


@pytest.mark.oracle
@needs_qwen
def test_matches_transformers_tokenizer(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    ref = transformers.AutoTokenizer.from_pretrained(str(QWEN))
    ours = TextTokenizer.from_folder(QWEN)
    texts = [chat_text(p) for p in PROMPTS]
    ids, mask = ours.encode_batch(texts, 64)
    r = ref(texts, padding="max_length", max_length=64, truncation=True)
    np.testing.assert_array_equal(ids, np.array(r["input_ids"]))
    np.testing.assert_array_equal(mask, np.array(r["attention_mask"]))
    # tokenizer.json path: the serialized fast tokenizer loads to the same ids
    ref.save_pretrained(str(tmp_path))
    assert (tmp_path / "tokenizer.json").is_file()
    from_json = TextTokenizer.from_folder(tmp_path)
    np.testing.assert_array_equal(from_json.encode_batch(texts, 64)[0], ids)


def test_malformed_added_tokens_are_a_checkpoint_error(tmp_path: Path) -> None:
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        shutil.copy(QWEN / name, tmp_path / name)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    first = next(iter(config["added_tokens_decoder"]))
    del config["added_tokens_decoder"][first]["content"]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match=f"malformed added_tokens_decoder entry '{first}'"):
        TextTokenizer.from_folder(tmp_path)


@needs_qwen
def test_a_built_tokenizer_is_cached_and_a_damaged_entry_rebuilt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The BPE built from vocab.json + merges.txt is kept serialized in the dif cache: a later load reads it
    (the build is not called) and encodes alike; a damaged entry warns and is built again."""
    from dif.errors import DifWarning
    from dif.text import tokenizer as tokenizer_module

    monkeypatch.setenv("DIF_CACHE_DIR", str(tmp_path))
    first = TextTokenizer.from_folder(QWEN)
    (entry,) = (tmp_path / "tokenizers").iterdir()
    build = tokenizer_module._byte_level_bpe

    def no_build(*args: object) -> None:
        raise AssertionError("built again although the cache holds it")

    monkeypatch.setattr(tokenizer_module, "_byte_level_bpe", no_build)
    again = TextTokenizer.from_folder(QWEN)
    for prompt in PROMPTS:
        assert again.encode(chat_text(prompt)) == first.encode(chat_text(prompt))
    entry.write_bytes(entry.read_bytes()[:-100])
    monkeypatch.setattr(tokenizer_module, "_byte_level_bpe", build)
    with pytest.warns(DifWarning, match="rebuilding"):
        rebuilt = TextTokenizer.from_folder(QWEN)
    assert rebuilt.encode(chat_text(PROMPTS[1])) == first.encode(chat_text(PROMPTS[1]))
    assert entry.stat().st_size > 1000  # written again whole


@needs_qwen
def test_prompts_prefetched_in_a_child_encode_alike(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`prefetch` has a child process parse the cached tokenizer and encode the texts: the ids and the pad id
    are the in-process ones, and the parent never parses the tokenizer itself. A child not finished when
    `encode` asks is stopped and the parent encodes in-process; without a child (none could start) too."""
    monkeypatch.setenv("DIF_CACHE_DIR", str(tmp_path))
    texts = [chat_text(p) for p in PROMPTS]
    expected = TextTokenizer.from_folder(QWEN)  # builds and caches the BPE; the next loads get its serialized form
    wanted = [expected.encode(text) for text in texts]

    prefetched = TextTokenizer.from_folder(QWEN)
    prefetched.prefetch(texts)
    assert prefetched._child is not None and prefetched._child.wait() is not None
    assert [prefetched.encode(text) for text in texts] == wanted
    assert prefetched.pad_id == expected.pad_id == 151643
    assert prefetched._backend is None  # all from the child
    assert prefetched.encode("not prefetched") == expected.encode("not prefetched")  # parsed in-process now

    stopped = TextTokenizer.from_folder(QWEN)
    stopped.prefetch(texts)
    assert [stopped.encode(text) for text in texts] == wanted  # at once: the child is (almost surely) still busy

    monkeypatch.setattr("sys.executable", "")
    no_child = TextTokenizer.from_folder(QWEN)
    no_child.prefetch(texts)
    assert no_child._child is not None and no_child._child.wait() is None
    assert [no_child.encode(text) for text in texts] == wanted and no_child.pad_id == 151643


def test_a_child_that_cannot_parse_gives_no_answer() -> None:
    from dif.text.prefetch import EncodeInChild

    assert EncodeInChild.start("{not a tokenizer", ["hello"], ["<pad>"]).wait() is None


def test_an_unparseable_tokenizer_json_names_the_file_at_first_use(tmp_path: Path) -> None:
    (tmp_path / "tokenizer.json").write_text('{"version": "1.0", "model": 7}')
    tokenizer = TextTokenizer.from_folder(tmp_path)  # read now, parsed at first use
    with pytest.raises(CheckpointError, match=r"tokenizer\.json: cannot load"):
        tokenizer.encode("hello")
    (tmp_path / "tokenizer.json").write_bytes(b"\xff\xfe{}")
    with pytest.raises(CheckpointError, match="not UTF-8"):
        TextTokenizer.from_folder(tmp_path)
