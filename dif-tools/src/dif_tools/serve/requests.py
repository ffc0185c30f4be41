"""The body of `POST /v1/images/generations`, checked: OpenAI's fields (prompt, n, size, response_format)
plus dif's own (seed, steps, guidance, negative_prompt, sampler, scheduler, lora).

Where it sits: the HTTP edge of `dif serve`; what it returns is what the worker hands to `dif.load`'s
pipeline. Every problem is a `BadRequest` whose message names the field (the app answers 400 with it). The
field readers here (`check_body`, `int_field`, `str_field`, `prompt_field`, ...) are shared with the video
route's body (`dif_tools.serve.video_requests`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from attrs import frozen

from dif.errors import UsageError

MAX_N = 8
"""The most images one request asks for (OpenAI allows up to 10; each is a row of one denoiser batch)."""
MAX_PROMPT = 4000
RESPONSE_FORMATS = ("url", "b64_json")
FIELDS = (
    "prompt", "n", "size", "response_format", "model", "user",
    "seed", "steps", "guidance", "negative_prompt", "sampler", "scheduler", "lora",
)  # fmt: skip
_SIZE = re.compile(r"^(\d{1,5})x(\d{1,5})$")


class BadRequest(UsageError):
    """A request body `dif serve` cannot run; the message names the field and says what is allowed."""


@frozen
class LoraChoice:
    """One adapter a request selects: a file stem in the server's --lora-dir and its scale."""

    name: str
    scale: float = 1.0


@frozen
class ImageJobRequest:
    """A checked generation request; None settings take the model's defaults."""

    prompt: str
    n: int = 1
    width: int | None = None
    height: int | None = None
    response_format: str = "url"
    seed: int | None = None
    steps: int | None = None
    guidance: float | None = None
    negative_prompt: str = ""
    sampler: str | None = None
    scheduler: str | None = None
    lora: tuple[LoraChoice, ...] = ()

    def settings(self) -> dict[str, Any]:
        """The frontend settings this request sets (`dif.load(...)(prompt, **settings)`)."""
        out = {k: getattr(self, k) for k in ("seed", "steps", "guidance", "width", "height", "sampler", "scheduler")}
        return {k: v for k, v in out.items() if v is not None}


def int_field(body: Mapping[str, Any], key: str, lo: int, hi: int) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{key}' must be an integer, got {value!r}")
    if not lo <= value <= hi:
        raise BadRequest(f"'{key}' is {value}, outside {lo}..{hi}")
    return value


def str_field(body: Mapping[str, Any], key: str, *, default: str | None = None) -> str | None:
    value = body.get(key, default)
    if value is not None and not isinstance(value, str):
        raise BadRequest(f"'{key}' must be a string, got {type(value).__name__}")
    return value


def parse_size(size: str) -> tuple[int, int]:
    """'WxH' -> (width, height)."""
    m = _SIZE.match(size.strip())
    if m is None:
        raise BadRequest(f"'size' must be 'WIDTHxHEIGHT' (e.g. '512x512'), got {size!r}")
    w, h = int(m.group(1)), int(m.group(2))
    if not (1 <= w <= 8192 and 1 <= h <= 8192):
        raise BadRequest(f"'size' {size!r} is outside 1..8192 on a side")
    return w, h


def _loras(value: Any) -> tuple[LoraChoice, ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise BadRequest('\'lora\' must be a list of {"name": ..., "scale": ...}')
    out = []
    for i, item in enumerate(value):
        if not isinstance(item, dict) or not isinstance(item.get("name"), str):
            raise BadRequest(f"'lora[{i}]' must be an object with a string 'name'")
        name, scale = item["name"], item.get("scale", 1.0)
        if not re.fullmatch(r"[A-Za-z0-9_.-]{1,128}", name) or name.startswith("."):
            raise BadRequest(f"'lora[{i}].name' {name!r} is not a plain file stem (letters, digits, _ . -)")
        if isinstance(scale, bool) or not isinstance(scale, int | float):
            raise BadRequest(f"'lora[{i}].scale' must be a number, got {scale!r}")
        out.append(LoraChoice(name, float(scale)))
    return tuple(out)


def check_body(body: Any, fields: tuple[str, ...]) -> dict[str, Any]:
    """`body` when it is a JSON object of known `fields` only; `BadRequest` otherwise."""
    if not isinstance(body, dict):
        raise BadRequest(f"the body must be a JSON object, got {type(body).__name__}")
    unknown = sorted(set(body) - set(fields))
    if unknown:
        raise BadRequest(f"unknown field(s) {', '.join(map(repr, unknown))}", hint=f"fields: {', '.join(fields)}")
    return body


def prompt_field(body: Mapping[str, Any]) -> str:
    prompt = str_field(body, "prompt")
    if not prompt or not prompt.strip():
        raise BadRequest("'prompt' is required and must be a non-empty string")
    if len(prompt) > MAX_PROMPT:
        raise BadRequest(f"'prompt' has {len(prompt)} characters, more than {MAX_PROMPT}")
    return prompt


def response_format_field(body: Mapping[str, Any]) -> str:
    fmt = str_field(body, "response_format", default="url")
    if fmt not in RESPONSE_FORMATS:
        raise BadRequest(f"'response_format' must be one of {', '.join(RESPONSE_FORMATS)}, got {fmt!r}")
    return fmt


def seed_field(body: Mapping[str, Any]) -> int | None:
    """'seed' (-1 or left out: None, a fresh random one at run time)."""
    seed = int_field(body, "seed", -1, 2**32 - 1)
    return None if seed == -1 else seed


def parse_request(body: Any) -> ImageJobRequest:
    """A JSON body (already decoded) -> `ImageJobRequest`; `BadRequest` naming the first bad field."""
    body = check_body(body, FIELDS)
    prompt = prompt_field(body)
    fmt = response_format_field(body)
    size = str_field(body, "size")
    width, height = parse_size(size) if size is not None else (None, None)
    guidance = body.get("guidance")
    if guidance is not None and (isinstance(guidance, bool) or not isinstance(guidance, int | float)):
        raise BadRequest(f"'guidance' must be a number, got {guidance!r}")
    return ImageJobRequest(
        prompt=prompt,
        n=int_field(body, "n", 1, MAX_N) or 1,
        width=width,
        height=height,
        response_format=fmt,
        seed=seed_field(body),
        steps=int_field(body, "steps", 1, 1000),
        guidance=None if guidance is None else float(guidance),
        negative_prompt=str_field(body, "negative_prompt", default="") or "",
        sampler=str_field(body, "sampler"),
        scheduler=str_field(body, "scheduler"),
        lora=_loras(body.get("lora")),
    )
