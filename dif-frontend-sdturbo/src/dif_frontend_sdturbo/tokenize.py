"""Prompt -> CLIP token ids, from the checkpoint's tokenizer/ files (vocab.json + merges.txt, or tokenizer.json).

Frontend stage "encode", before the text encoder. CLIP's BPE differs from the byte-level BPE
`dif.text` builds for Qwen: words end in "</w>", text is whitespace-collapsed and lowercased, and
words split on CLIP's own pattern. The `tokenizers` objects are set up the way transformers'
CLIPTokenizer sets them up, so ids equal the reference's (tests compare). StableDiffusionPipeline
pads every prompt to max_length (77): [bos] + the first 75 tokens + [eos] + pad..., the pad token from
tokenizer_config.json / special_tokens_map.json ("!" = id 0 for SD 2.x, "<|endoftext|>" for SD 1.x).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from attrs import frozen

from dif.checkpoint import read_json_object
from dif.errors import CheckpointError

BOS, EOS = "<|startoftext|>", "<|endoftext|>"
CLIP_SPLIT = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _special(folder: Path, key: str, default: str) -> str:
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        file = folder / name
        if file.is_file():
            text = _token_text(read_json_object(file).get(key))
            if text is not None:
                return text
    return default


def _backend(folder: Path) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE

    if (folder / "tokenizer.json").is_file():
        try:
            tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as exc:  # the library raises plain Exceptions
            raise CheckpointError(f"{folder / 'tokenizer.json'}: cannot load: {exc}") from None
        tok.no_padding()
        tok.no_truncation()
        tok.post_processor = None
        return tok
    if not ((folder / "vocab.json").is_file() and (folder / "merges.txt").is_file()):
        raise CheckpointError(f"{folder}: no tokenizer.json and no vocab.json + merges.txt", hint="point at tokenizer/")
    try:
        vocab, merges = BPE.read_file(str(folder / "vocab.json"), str(folder / "merges.txt"))
        model = BPE(vocab, merges, continuing_subword_prefix="", end_of_word_suffix="</w>", fuse_unk=False,
                    unk_token=_special(folder, "unk_token", EOS))  # fmt: skip
    except Exception as exc:
        raise CheckpointError(f"{folder}: cannot read vocab.json / merges.txt: {exc}") from None
    tok = Tokenizer(model)
    tok.normalizer = normalizers.Sequence(
        [normalizers.NFC(), normalizers.Replace(Regex(r"\s+"), " "), normalizers.Lowercase()]
    )
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(CLIP_SPLIT), behavior="removed", invert=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


@frozen(eq=False)
class ClipTokenizer:
    """CLIP BPE over one tokenizer folder; `encode_padded` is the pipeline's call."""

    backend: Any
    bos_id: int
    eos_id: int
    pad_id: int
    source: str

    @classmethod
    def from_folder(cls, folder: str | Path) -> ClipTokenizer:
        folder = Path(folder)
        if not folder.is_dir():
            raise CheckpointError(f"{folder}: tokenizer folder does not exist")
        from tokenizers import AddedToken

        tok = _backend(folder)
        ids = {}
        for key, default in (("bos_token", BOS), ("eos_token", EOS), ("pad_token", EOS), ("unk_token", EOS)):
            text = _special(folder, key, default)
            # transformers registers the special tokens as added tokens: each occurrence in a prompt is
            # that token (SD 2.x's pad "!": "!!" is two id-0 tokens, not BPE's "!" + "!</w>")
            tok.add_special_tokens([AddedToken(text, special=True, normalized=False)])
            found = tok.token_to_id(text)
            if found is None:
                raise CheckpointError(f"{folder}: {key} {text!r} is not in the vocabulary")
            ids[key] = int(found)
        return cls(tok, ids["bos_token"], ids["eos_token"], ids["pad_token"], str(folder))

    def encode(self, text: str) -> list[int]:
        """Token ids of `text`, nothing added around them."""
        return list(self.backend.encode(text, add_special_tokens=False).ids)

    def encode_padded(self, text: str, max_length: int = 77) -> np.ndarray:
        """(1, max_length) int64: [bos] + tokens (truncated to max_length - 2) + [eos] + pad."""
        body = self.encode(text)[: max_length - 2]
        ids = np.full((1, max_length), self.pad_id, np.int64)
        row = [self.bos_id, *body, self.eos_id]
        ids[0, : len(row)] = row
        return ids

    @property
    def vocab_size(self) -> int:
        return int(self.backend.get_vocab_size(with_added_tokens=True))
