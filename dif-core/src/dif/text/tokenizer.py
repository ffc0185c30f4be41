"""Text conditioning, step 1: a checkpoint's own tokenizer files -> token ids and attention masks.

Where it sits: a frontend formats the prompt (with the folder's chat template, `dif.text.chat`),
tokenizes it here, and feeds the ids and mask to its text-encoder program. Built on the `tokenizers`
library, loaded from either
  tokenizer.json                         (the serialized fast tokenizer), or
  vocab.json + merges.txt                (byte-level BPE, Qwen2-style pre-tokenization), plus
  tokenizer_config.json                  (added/special tokens with their ids, pad token;
                                          `additional_special_tokens` not yet known get the next ids),
  the chat template                      (found as `dif.text.chat.find_chat_template` says).
Padding and truncation are done here in numpy, not by the library, so the rule is explicit:
truncate to the first `max_length` tokens, pad on the right with the pad token, mask 1/0.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dif.errors import CheckpointError, DifError
from dif.text.chat import ChatTemplate, Message, find_chat_template, missing_template_error, token_text

# Qwen2/Qwen3 pre-tokenization: contractions, letter runs with one optional leading non-letter,
# single digits, punctuation runs with trailing newlines, newline runs, and whitespace (a space
# before a word stays attached to that word). Part of the tokenizer's definition: ids change if
# this changes, so tests compare against the reference tokenizer.
QWEN2_SPLIT_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    r"|[^\r\n\p{L}\p{N}]?\p{L}+"
    r"|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+"
    r"|\s+(?!\S)"
    r"|\s+"
)


class TextTokenizer:
    """Ids and masks for prompts; see the module docstring for where the files come from."""

    def __init__(
        self,
        backend: Any,
        *,
        pad_token: str | None,
        source: str,
        chat_template: ChatTemplate | Callable[[], ChatTemplate | None] | None = None,
    ) -> None:
        """`chat_template` may be a finder, called on first use: a frontend that never renders the
        template (Krea 2) loads a folder whose template entries are broken, as the reference does."""
        self.backend = backend
        self.source = source
        self._chat_template = chat_template
        self.pad_token = pad_token
        self.pad_id = None if pad_token is None else backend.token_to_id(pad_token)
        if pad_token is not None and self.pad_id is None:
            raise CheckpointError(f"{source}: pad token {pad_token!r} is not in the vocabulary")

    # -- loading -------------------------------------------------------------------------------
    @classmethod
    def from_folder(cls, folder: str | Path) -> TextTokenizer:
        """Load from a tokenizer folder (tokenizer.json preferred over vocab.json + merges.txt)."""
        from tokenizers import Tokenizer

        from dif.checkpoint import read_json_object

        folder = Path(folder)
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: tokenizer folder does not exist")
        config_file = folder / "tokenizer_config.json"
        config = read_json_object(config_file) if config_file.is_file() else {}
        if (folder / "tokenizer.json").is_file():
            try:
                backend = Tokenizer.from_file(str(folder / "tokenizer.json"))
            except Exception as exc:  # the library raises plain Exception subclasses
                raise CheckpointError(f"{folder / 'tokenizer.json'}: cannot load: {exc}") from None
            except BaseException as exc:
                _reraise_unless_panic(exc)
                raise CheckpointError(f"{folder / 'tokenizer.json'}: cannot load: tokenizers panicked: {exc}") from None
            backend.no_padding()
            backend.no_truncation()
        elif (folder / "vocab.json").is_file() and (folder / "merges.txt").is_file():
            backend = _cached_byte_level_bpe(folder, config)
        else:
            raise CheckpointError(
                f"{folder}: no tokenizer.json and no vocab.json + merges.txt",
                hint="point at the checkpoint's tokenizer/ folder",
            )
        return cls(
            backend,
            pad_token=token_text(config.get("pad_token")),
            source=str(folder),
            chat_template=functools.partial(find_chat_template, folder, config),
        )

    # -- use -----------------------------------------------------------------------------------
    @property
    def chat_template(self) -> ChatTemplate | None:
        """The folder's chat template, or None when it has none (looked up once, on first use)."""
        if callable(self._chat_template):
            self._chat_template = self._chat_template()
        return self._chat_template

    def apply_chat_template(
        self, messages: Sequence[Message | dict[str, Any]], *, add_generation_prompt: bool = False, **kwargs: Any
    ) -> str:
        """The folder's chat template rendered for one conversation: the text transformers'
        `apply_chat_template(messages, tokenize=False, add_generation_prompt=..., **kwargs)` returns."""
        if self.chat_template is None:
            raise missing_template_error(self.source)
        return self.chat_template.render(messages, add_generation_prompt=add_generation_prompt, **kwargs)

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, special-token strings in it recognised, nothing added around it."""
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool = False) -> str:
        return str(self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def token_to_id(self, token: str) -> int | None:
        result = self.backend.token_to_id(token)
        return None if result is None else int(result)

    def encode_batch(self, texts: Sequence[str], max_length: int) -> tuple[np.ndarray, np.ndarray]:
        """(ids, mask), both int64 [len(texts), max_length]: truncated to the first `max_length`
        tokens, right-padded with the pad token; mask is 1 on real tokens, 0 on padding."""
        if self.pad_id is None:
            raise DifError(f"tokenizer {self.source} has no pad token; cannot pad to {max_length}")
        ids = np.full((len(texts), max_length), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(texts), max_length), dtype=np.int64)
        for row, text in enumerate(texts):
            tokens = self.encode(text)[:max_length]
            ids[row, : len(tokens)] = tokens
            mask[row, : len(tokens)] = 1
        return ids, mask

    @property
    def vocab_size(self) -> int:
        """Number of ids, added tokens included."""
        return int(self.backend.get_vocab_size(with_added_tokens=True))


def _reraise_unless_panic(exc: BaseException) -> None:
    """Re-raise `exc` unless it is a Rust panic inside `tokenizers` (pyo3's PanicException derives
    from BaseException, not Exception), which is the input file's fault, not the user's Ctrl-C."""
    if type(exc).__name__ != "PanicException":
        raise exc


CACHED_VOCAB_BYTES = 256 << 10  # vocab.json from this size on is worth caching (Qwen's: 2.7 MB)
MAX_CACHED_ID = 1 << 22  # larger vocabularies are not cached (real ones hold up to ~260k tokens)


def _cached_byte_level_bpe(folder: Path, config: dict[str, Any]) -> Any:
    """`_byte_level_bpe`, kept as the library's own serialized tokenizer in the dif cache (keyed by the three
    files' contents and the library version): building the BPE from vocab.json + merges.txt takes about four
    times as long as reading the serialized form, on every fresh process."""
    import hashlib

    import tokenizers

    from dif.diskcache import key_digest, read_entry, write_entry
    from dif.env import cache_dir

    files = hashlib.sha256()
    for name in ("vocab.json", "merges.txt", "tokenizer_config.json"):
        file = folder / name
        files.update(file.read_bytes() if file.is_file() else b"")
        files.update(b"\0")
    key = {"kind": "byte-level bpe", "tokenizers": str(tokenizers.__version__), "files": files.hexdigest()}
    path = cache_dir() / "tokenizers" / f"{key_digest(key)}.json"
    stored = read_entry(path, key)
    if stored is not None:
        try:
            return tokenizers.Tokenizer.from_str(stored.decode())
        except Exception:  # noqa: BLE001 - sealed but unreadable by this library: build it again
            pass
    backend = _byte_level_bpe(folder, config)
    if (folder / "vocab.json").stat().st_size < CACHED_VOCAB_BYTES or backend.get_vocab_size() > MAX_CACHED_ID:
        return backend  # small ones build in milliseconds; ids far beyond any real vocabulary serialize slowly
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_entry(path, backend.to_str().encode(), key)
    except OSError:  # a read-only cache costs the next process the build, nothing else
        pass
    return backend


def _byte_level_bpe(folder: Path, config: dict[str, Any]) -> Any:
    """A Qwen2-style byte-level BPE from vocab.json + merges.txt, then the added tokens of
    tokenizer_config.json in id order (each must land on the id the config gives it)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    try:  # the library raises plain Exceptions, for unreadable files and for merges of unknown tokens alike
        vocab, merges = BPE.read_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
        model = BPE(vocab, merges, unk_token=None, fuse_unk=False, byte_fallback=False)
    except Exception as exc:
        raise CheckpointError(f"{folder}: cannot read vocab.json / merges.txt: {exc}") from None
    except BaseException as exc:
        _reraise_unless_panic(exc)
        raise CheckpointError(f"{folder}: cannot read vocab.json / merges.txt: tokenizers panicked: {exc}") from None
    backend = Tokenizer(model)
    backend.normalizer = normalizers.NFC()
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN2_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=bool(config.get("add_prefix_space", False)), use_regex=False),
        ]
    )
    backend.decoder = decoders.ByteLevel()
    added = _added_tokens(folder, config)
    for key in sorted(added, key=int):
        spec = added[key]
        token = AddedToken(
            spec["content"],
            single_word=bool(spec.get("single_word", False)),
            lstrip=bool(spec.get("lstrip", False)),
            rstrip=bool(spec.get("rstrip", False)),
            normalized=bool(spec.get("normalized", not spec.get("special", False))),
            special=bool(spec.get("special", False)),
        )
        if spec.get("special", False):
            backend.add_special_tokens([token])
        else:
            backend.add_tokens([token])
        got = backend.token_to_id(spec["content"])
        if got != int(key):
            raise CheckpointError(
                f"{folder}: added token {spec['content']!r} got id {got}, tokenizer_config.json says {key}",
                hint="vocab.json and tokenizer_config.json come from different tokenizers",
            )
    # Special tokens named only in `additional_special_tokens` get the next free ids, in list order.
    extras = config.get("additional_special_tokens") or []
    if not isinstance(extras, list):
        raise CheckpointError(
            f"{folder / 'tokenizer_config.json'}: additional_special_tokens must be a list, got {type(extras).__name__}"
        )
    for extra in extras:
        text = token_text(extra)
        if text is not None and backend.token_to_id(text) is None:
            backend.add_special_tokens([AddedToken(text, special=True, normalized=False)])
    return backend


def _added_tokens(folder: Path, config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """`added_tokens_decoder` of tokenizer_config.json, checked: integer ids, each with a string `content`."""
    added = config.get("added_tokens_decoder") or {}
    bad = [
        key
        for key, spec in (added.items() if isinstance(added, dict) else [("added_tokens_decoder", None)])
        if not str(key).isdigit() or not isinstance(spec, dict) or not isinstance(spec.get("content"), str)
    ]
    if bad:
        raise CheckpointError(
            f"{folder / 'tokenizer_config.json'}: malformed added_tokens_decoder entry {bad[0]!r}",
            hint='each entry must be \'<id>\': {"content": "<token>", ...}',
        )
    return added
