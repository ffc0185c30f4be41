"""A bounded load test of a running `dif serve`: N requests, C at a time, every image (or video) decoded.

Used by the tests and by perf/serve_load.py (which records the result in perf/results/). Latency is per
request, from send to the decoded images; p50/p99 are nearest-rank percentiles.
"""

from __future__ import annotations

import asyncio
import base64
import io
import math
import time
from collections.abc import Mapping, Sequence
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """The nearest-rank q-th percentile (0 < q <= 100) of `values`."""
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q / 100 * len(ordered)) - 1)]


def decode_png(data: bytes) -> tuple[int, int]:
    """(width, height) of PNG bytes, fully decoded (a truncated file raises)."""
    from PIL import Image

    with Image.open(io.BytesIO(data)) as im:
        im.load()
        return im.size


def decode_mp4(data: bytes) -> dict[str, Any]:
    """What an MP4's bytes hold, every packet decoded (a truncated file raises): {"frames", "width", "height",
    "video_codec", "audio_codec", "channels", "sample_rate", "samples"} (the audio keys None without sound)."""
    import av  # PyAV, as dif.media.mp4

    out: dict[str, Any] = {"audio_codec": None, "channels": None, "sample_rate": None, "samples": None}
    with av.open(io.BytesIO(data), mode="r") as src:
        video = src.streams.video[0]
        frames = sum(1 for _ in src.decode(video))
        out |= {"frames": frames, "width": video.codec_context.width, "height": video.codec_context.height,
                "video_codec": video.codec_context.name}  # fmt: skip
        if src.streams.audio:
            src.seek(0)
            audio = src.streams.audio[0]
            samples = sum(f.samples for f in src.decode(audio))
            out |= {"audio_codec": audio.codec_context.name, "channels": audio.codec_context.channels,
                    "sample_rate": audio.codec_context.sample_rate, "samples": samples}  # fmt: skip
    if not out["frames"]:
        raise ValueError("no video frame decodes")
    return out


ROUTES = {"image": ("/v1/images/generations", decode_png), "video": ("/v1/videos/generations", decode_mp4)}


async def _one(
    client: Any, url: str, body: Mapping[str, Any], errors: list[str], kind: str = "image"
) -> tuple[float, int]:
    path, decode = ROUTES[kind]
    started = time.perf_counter()
    r = await client.post(f"{url}{path}", json=dict(body))
    if r.status_code != 200:
        errors.append(f"{r.status_code}: {r.text[:200]}")
        return time.perf_counter() - started, 0
    decoded = 0
    for entry in r.json()["data"]:
        if "b64_json" in entry:
            data = base64.b64decode(entry["b64_json"])
        else:
            got = await client.get(entry["url"])
            if got.status_code != 200:
                errors.append(f"GET {entry['url']}: {got.status_code}")
                continue
            data = got.content
        try:
            decode(data)
            decoded += 1
        except Exception as exc:
            errors.append(f"undecodable {kind}: {exc}")
    return time.perf_counter() - started, decoded


async def _load(url: str, body: Mapping[str, Any], requests: int, concurrency: int, kind: str) -> dict[str, Any]:
    import httpx

    errors: list[str] = []
    latencies: list[float] = []
    images = 0
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:

        async def task(i: int) -> None:
            nonlocal images
            async with gate:
                seconds, decoded = await _one(client, url, {**body, "seed": i}, errors, kind)
                latencies.append(seconds)
                images += decoded

        started = time.perf_counter()
        await asyncio.gather(*(task(i) for i in range(requests)))
        wall = time.perf_counter() - started
    return {
        "requests": requests,
        "concurrency": concurrency,
        "kind": kind,
        "body": dict(body),
        "errors": len(errors),
        "error_samples": errors[:5],
        "images_decoded": images,
        "wall_s": round(wall, 3),
        "throughput_rps": round(requests / wall, 3),
        "latency_s": {
            "p50": round(percentile(latencies, 50), 4),
            "p90": round(percentile(latencies, 90), 4),
            "p99": round(percentile(latencies, 99), 4),
            "max": round(max(latencies), 4),
            "mean": round(sum(latencies) / len(latencies), 4),
        },
    }


def run_load(
    url: str, body: Mapping[str, Any], *, requests: int = 200, concurrency: int = 8, kind: str = "image"
) -> dict[str, Any]:
    """`requests` POSTs of `body` (seed = the request's index) to the `kind` ("image" | "video") route of the
    server at `url`, `concurrency` at a time; errors, files decoded ("images_decoded"), wall time and
    latency percentiles."""
    return asyncio.run(_load(url, body, requests, concurrency, kind))
