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
from attrs import define

from dif.errors import CheckpointError, DifError
from dif.text.chat import ChatTemplate, Message, find_chat_template, missing_template_error, token_text
from dif.text.prefetch import EncodeInChild, PrefetchedIds

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
        """`backend`: the library's tokenizer, or a `SerializedTokenizer` parsed on first use (`prefetch`
        may have a child process parse it instead). `chat_template` may be a finder, called on first use:
        a frontend that never renders the template (Krea 2) loads a folder whose template entries are
        broken, as the reference does."""
        self._backend = None if isinstance(backend, SerializedTokenizer) else backend
        self._serialized = backend if isinstance(backend, SerializedTokenizer) else None
        self.source = source
        self._chat_template = chat_template
        self.pad_token = pad_token
        self._pad_id: int | None = None
        self._child: EncodeInChild | None = None
        self._prefetched = PrefetchedIds({}, {})

    @property
    def backend(self) -> Any:
        """The library's tokenizer, parsed now if it has not been."""
        if self._backend is None:
            assert self._serialized is not None
            self._backend = self._serialized.parse()
        return self._backend

    @property
    def pad_id(self) -> int | None:
        """The pad token's id; None when the tokenizer has no pad token."""
        if self.pad_token is None or self._pad_id is not None:
            return self._pad_id
        known = self._from_child().token_ids
        found = known[self.pad_token] if self.pad_token in known else self.token_to_id(self.pad_token)
        if found is None:
            raise CheckpointError(f"{self.source}: pad token {self.pad_token!r} is not in the vocabulary")
        self._pad_id = found
        return found

    # -- loading -------------------------------------------------------------------------------
    @classmethod
    def from_folder(cls, folder: str | Path) -> TextTokenizer:
        """Load from a tokenizer folder (tokenizer.json preferred over vocab.json + merges.txt)."""
        from dif.checkpoint import read_json_object

        folder = Path(folder)
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: tokenizer folder does not exist")
        config_file = folder / "tokenizer_config.json"
        config = read_json_object(config_file) if config_file.is_file() else {}
        if (folder / "tokenizer.json").is_file():
            backend: Any = SerializedTokenizer.read(folder / "tokenizer.json")
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

    def prefetch(self, texts: Sequence[str]) -> None:
        """Start encoding `texts` (and looking up the pad token) in a child process, for a caller with other
        work to do before it encodes them (`dif.text.prefetch` says why). Nothing to do when the tokenizer
        is parsed already: a long-lived pipeline encodes in-process from its second prompt on."""
        if self._backend is None and self._serialized is not None and self._child is None:
            tokens = () if self.pad_token is None else (self.pad_token,)
            self._child = EncodeInChild.start(self._serialized.text, texts, tokens)

    def _from_child(self) -> PrefetchedIds:
        """What the prefetching child answered (waited for here); empty when there was none or it failed."""
        if self._child is not None:
            self._prefetched = self._child.result() or self._prefetched
            self._child = None
        return self._prefetched

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, special-token strings in it recognised, nothing added around it."""
        prefetched = self._from_child().ids.get(text)
        if prefetched is not None:
            return list(prefetched)
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


@define(frozen=True)
class SerializedTokenizer:
    """A tokenizer in the library's JSON form, not parsed yet: the text of a tokenizer.json, or of dif's cache
    entry for a BPE built from vocab.json + merges.txt (`rebuild` makes it anew when the library cannot
    parse the entry; a tokenizer.json it cannot parse is a `CheckpointError` naming `file`)."""

    text: str
    file: Path
    rebuild: Callable[[], Any] | None = None

    @classmethod
    def read(cls, file: Path) -> SerializedTokenizer:
        try:
            return cls(file.read_bytes().decode("utf-8"), file)
        except OSError as exc:
            raise CheckpointError(f"{file}: cannot read: {exc.strerror or exc}") from None
        except UnicodeDecodeError as exc:
            raise CheckpointError(f"{file}: cannot load: not UTF-8 text (byte {exc.start})") from None

    def parse(self) -> Any:
        """The library's tokenizer, without padding or truncation (a tokenizer.json may carry either)."""
        from tokenizers import Tokenizer

        try:
            backend = Tokenizer.from_str(self.text)
        except Exception as exc:  # the library raises plain Exception subclasses
            if self.rebuild is not None:
                return self.rebuild()
            raise CheckpointError(f"{self.file}: cannot load: {exc}") from None
        except BaseException as exc:
            _reraise_unless_panic(exc)
            if self.rebuild is not None:
                return self.rebuild()
            raise CheckpointError(f"{self.file}: cannot load: tokenizers panicked: {exc}") from None
        backend.no_padding()
        backend.no_truncation()
        return backend


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
    times as long as reading the serialized form, on every fresh process. A cached one comes back as its
    `SerializedTokenizer`, parsed on first use."""
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

    def build() -> Any:
        backend = _byte_level_bpe(folder, config)
        if (folder / "vocab.json").stat().st_size < CACHED_VOCAB_BYTES or backend.get_vocab_size() > MAX_CACHED_ID:
            return backend  # small ones build in milliseconds; ids far beyond any real vocabulary serialize slowly
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            write_entry(path, backend.to_str().encode(), key)
        except OSError:  # a read-only cache costs the next process the build, nothing else
            pass
        return backend

    if stored is None:
        return build()
    try:
        text = stored.decode("utf-8")
    except UnicodeDecodeError:  # sealed, yet not what this library writes: build it again
        return build()
    return SerializedTokenizer(text, path, rebuild=build)  # built again if this library cannot parse it


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
