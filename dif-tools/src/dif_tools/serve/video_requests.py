"""The body of `POST /v1/videos/generations`, checked: prompt, size "WxH", seconds or dif's frames, seed, steps,
response_format, first_frame / last_frame (base64 PNG, fl2va), model, user, n (1).

Where it sits: the HTTP edge of `dif serve` for a video model, beside `requests` (whose field readers it
uses). The rules checked here are the served video model's, MiniMax-H3's (docs/h3.md): frames 17n + 5 at
24 fps, sizes multiples of 32, at least 2 grid points. They are checked at the edge so that a bad body is
refused before it takes a place in the queue, with a message naming its field; the frontend's own `check`
judges the request again when it runs (and refuses what cannot be seen here, e.g. a frame count too short
for one decode chunk of the video VAE, or a keyframe of another size than the checkpoint's default canvas).
"""

from __future__ import annotations

import base64
import binascii
import io
import math
from typing import Any

import numpy as np
from attrs import field, frozen

from dif.media.frame_counts import nearest_frame_counts
from dif_tools.serve.requests import (
    BadRequest,
    check_body,
    int_field,
    parse_size,
    prompt_field,
    response_format_field,
    seed_field,
    str_field,
)

FPS = 24  # MiniMax-H3's only frame rate: 'seconds' converts at it
FRAME_CLIP, FRAME_KEEP = 17, 5  # frames are FRAME_CLIP n + FRAME_KEEP (the video VAE decodes 17-frame clips)
SIZE_MULTIPLE = 32  # VAE 16x, patch 2
MIN_STEPS = 2  # grid points of linspace(1, 0, n): n - 1 model evaluations
MAX_SECONDS = 60.0
MAX_KEYFRAME_CHARS = 64 * 2**20  # base64 characters of one keyframe (48 MiB of PNG)
VIDEO_FIELDS = (
    "prompt", "n", "size", "seconds", "frames", "seed", "steps", "response_format",
    "first_frame", "last_frame", "model", "user",
)  # fmt: skip
KEYFRAMES = ("first_frame", "last_frame")


@frozen
class VideoJobRequest:
    """A checked video request; None settings take the checkpoint's defaults. `frames` is the count asked for
    or the one `seconds` converted to (`seconds` keeps what was asked); keyframes are (H, W, 3) uint8."""

    prompt: str
    frames: int | None = None
    seconds: float | None = None
    width: int | None = None
    height: int | None = None
    steps: int | None = None
    seed: int | None = None
    response_format: str = "url"
    first_frame: np.ndarray | None = field(default=None, eq=False)
    last_frame: np.ndarray | None = field(default=None, eq=False)

    def frames_note(self) -> dict[str, Any] | None:
        """What 'seconds' became, for the answer (None when 'frames' was given or neither)."""
        if self.seconds is None:
            return None
        rule = f"the nearest {FRAME_CLIP}n + {FRAME_KEEP} to seconds x {FPS} fps"
        return {"seconds": self.seconds, "frames": self.frames, "rule": rule}


def check_frames(frames: int) -> int:
    near = nearest_frame_counts(frames, FRAME_CLIP, FRAME_KEEP)
    if near is not None:
        raise BadRequest(
            f"'frames' is {frames}: the model makes {FRAME_CLIP}n + {FRAME_KEEP} frames (the video VAE decodes "
            f"{FRAME_CLIP}-frame clips); try {near}"
        )
    return frames


def frames_for_seconds(seconds: float) -> int:
    """The `17n + 5` frame count nearest to `seconds` at 24 fps (a tie goes to the longer clip)."""
    n = max(0, math.floor((seconds * FPS - FRAME_KEEP) / FRAME_CLIP + 0.5))
    return FRAME_CLIP * n + FRAME_KEEP


def _seconds(body: dict[str, Any]) -> float | None:
    value = body.get("seconds")
    if value is None:
        return None
    # OpenAI's video API sends seconds as a string ("4"); a JSON number is taken too
    try:
        seconds = float(value) if not isinstance(value, bool) and isinstance(value, int | float | str) else math.nan
    except ValueError:
        seconds = math.nan
    if not 0 < seconds <= MAX_SECONDS:
        raise BadRequest(f"'seconds' must be a number of seconds in (0, {MAX_SECONDS:g}], got {value!r}")
    return seconds


def check_size(width: int, height: int) -> None:
    bad = [f"{n} {v}" for n, v in (("width", width), ("height", height)) if v % SIZE_MULTIPLE]
    if bad:
        fit = "x".join(str(max(SIZE_MULTIPLE, -(-v // SIZE_MULTIPLE) * SIZE_MULTIPLE)) for v in (width, height))
        verb = "is not a multiple" if len(bad) == 1 else "are not multiples"
        raise BadRequest(f"'size' {width}x{height}: {' and '.join(bad)} {verb} of {SIZE_MULTIPLE}; try {fit!r}")


def decode_keyframe(name: str, value: Any, size: tuple[int, int] | None) -> np.ndarray:
    """A base64 PNG (bare, or a `data:image/png;base64,` URL) -> (H, W, 3) uint8; `BadRequest` naming `name`
    when it is not base64, not a PNG, does not decode, or is not `size` (width, height) when one was given."""
    from PIL import Image, UnidentifiedImageError

    if not isinstance(value, str):
        raise BadRequest(f"'{name}' must be a base64 PNG string, got {type(value).__name__}")
    if len(value) > MAX_KEYFRAME_CHARS:
        raise BadRequest(f"'{name}' has {len(value)} characters, more than {MAX_KEYFRAME_CHARS}")
    text = value.split(",", 1)[1] if value.startswith("data:") and "," in value else value
    try:
        data = base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise BadRequest(f"'{name}' is not base64: {exc}") from None
    try:
        with Image.open(io.BytesIO(data)) as im:
            if im.format != "PNG":
                raise BadRequest(f"'{name}' is a {im.format or 'unknown'} image; send a PNG")
            # the header's size first: a wrong or huge image is refused before its pixels are decoded
            if size is not None and im.size != size:
                raise BadRequest(
                    f"'{name}' is {im.size[0]}x{im.size[1]}: a keyframe must be the video's size, {size[0]}x{size[1]}"
                )
            if max(im.size) > 8192:
                raise BadRequest(f"'{name}' is {im.size[0]}x{im.size[1]}, more than 8192 on a side")
            return np.asarray(im.convert("RGB"), dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError) as exc:
        raise BadRequest(f"'{name}' does not decode as an image: {exc}") from None


def parse_video_request(body: Any) -> VideoJobRequest:
    """A JSON body (already decoded) -> `VideoJobRequest`; `BadRequest` naming the first bad field."""
    body = check_body(body, VIDEO_FIELDS)
    prompt = prompt_field(body)
    fmt = response_format_field(body)
    n = body.get("n", 1)
    if n != 1 or isinstance(n, bool):
        raise BadRequest(f"'n' must be 1 (one video per request), got {n!r}")
    size = str_field(body, "size")
    width, height = parse_size(size) if size is not None else (None, None)
    if width is not None and height is not None:
        check_size(width, height)
    seconds = _seconds(body)
    frames = int_field(body, "frames", 1, 100000)
    if seconds is not None and frames is not None:
        raise BadRequest("give 'seconds' or 'frames', not both")
    frames = frames_for_seconds(seconds) if seconds is not None else frames
    if frames is not None:
        check_frames(frames)
    steps = body.get("steps")
    if isinstance(steps, int) and not isinstance(steps, bool) and steps < MIN_STEPS:
        raise BadRequest(
            f"'steps' is {steps}: the model needs at least {MIN_STEPS} grid points (steps - 1 evaluations)"
        )
    wanted = (width, height) if width is not None and height is not None else None
    keyframes = {k: decode_keyframe(k, body[k], wanted) for k in KEYFRAMES if body.get(k) is not None}
    return VideoJobRequest(
        prompt=prompt,
        frames=frames,
        seconds=seconds,
        width=width,
        height=height,
        steps=int_field(body, "steps", MIN_STEPS, 1000),
        seed=seed_field(body),
        response_format=fmt,
        first_frame=keyframes.get("first_frame"),
        last_frame=keyframes.get("last_frame"),
    )
