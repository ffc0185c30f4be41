"""Token ids worked out in a child process while this one does something else (a pipeline loading weights).

Parsing a serialized tokenizer is the slow part of tokenizing one prompt: Qwen3's 151k-token vocabulary and
merges take 0.3-0.6 s in `Tokenizer.from_str`, and the library holds the GIL throughout, so a thread would only
take that time from the lowering beside it. A child process parses the same serialized text and encodes the
given texts; `TextTokenizer` reads its answer at the first `encode`. The child imports nothing but the
standard library and `tokenizers`; anything that goes wrong in it (no such library, a text it cannot
parse, an exit) is reported as no answer, and the parent does the work itself as it would have anyway.
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from collections.abc import Sequence

from attrs import define, field

# Request on stdin: one JSON line {"texts": [...], "tokens": [...]}, then the serialized tokenizer (UTF-8).
# Answer on stdout: {"ids": [[...] per text], "token_ids": {token: id or null}}. `no_padding` and
# `no_truncation`, as the parent does after parsing: a tokenizer.json may carry either.
_CHILD = """
import json, sys
from tokenizers import Tokenizer
request = json.loads(sys.stdin.buffer.readline())
tokenizer = Tokenizer.from_str(sys.stdin.buffer.read().decode("utf-8"))
tokenizer.no_padding()
tokenizer.no_truncation()
answer = {
    "ids": [tokenizer.encode(text, add_special_tokens=False).ids for text in request["texts"]],
    "token_ids": {token: tokenizer.token_to_id(token) for token in request["tokens"]},
}
sys.stdout.write(json.dumps(answer))
"""


@define(frozen=True)
class PrefetchedIds:
    """The child's answer: token ids per text (nothing added around them) and the ids of the named tokens."""

    ids: dict[str, list[int]]
    token_ids: dict[str, int | None]


@define
class EncodeInChild:
    """One child process encoding `texts` with a serialized tokenizer; `result()` takes its answer if it is
    there, and otherwise stops it (the caller then encodes in-process: never later than without it)."""

    texts: tuple[str, ...]
    tokens: tuple[str, ...]
    _process: subprocess.Popen[bytes] | None = field(init=False, default=None)
    _thread: threading.Thread | None = field(init=False, default=None)
    _answer: PrefetchedIds | None = field(init=False, default=None)

    @classmethod
    def start(cls, serialized: str, texts: Sequence[str], tokens: Sequence[str] = ()) -> EncodeInChild:
        job = cls(tuple(texts), tuple(tokens))
        if not sys.executable:  # an embedded interpreter: no program to start
            return job
        try:
            job._process = subprocess.Popen(
                [sys.executable, "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
            )
        except OSError:
            return job
        request = json.dumps({"texts": list(job.texts), "tokens": list(job.tokens)}).encode() + b"\n"
        # the pipe holds 64 KiB: a thread feeds it the serialized tokenizer while the caller goes on
        job._thread = threading.Thread(
            target=job._communicate, args=(request + serialized.encode("utf-8"),), name="dif-tokenize", daemon=True
        )
        job._thread.start()
        return job

    def _communicate(self, payload: bytes) -> None:
        assert self._process is not None
        try:
            out, _ = self._process.communicate(payload)
            if self._process.returncode != 0:
                return
            answer = json.loads(out)
            ids = [[int(i) for i in row] for row in answer["ids"]]
            token_ids = {str(k): None if v is None else int(v) for k, v in answer["token_ids"].items()}
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return
        if len(ids) == len(self.texts) and set(token_ids) == set(self.tokens):
            self._answer = PrefetchedIds(dict(zip(self.texts, ids, strict=True)), token_ids)

    def wait(self) -> PrefetchedIds | None:
        """The child's answer, waiting for it to finish (None when it failed)."""
        if self._thread is not None:
            self._thread.join()
        return self.result()

    def result(self) -> PrefetchedIds | None:
        """The child's answer when it has given it; None when it failed or is still working (then it is
        stopped: parsing in-process from here is no slower than waiting for it)."""
        if self._thread is not None:
            if self._thread.is_alive() and self._process is not None:
                self._process.kill()
            self._thread.join()
            self._thread = None
        return self._answer
