"""The starlette application of `dif serve`: OpenAI-style image and video routes over one `PipelineWorker`.

    POST /v1/images/generations   {"prompt", "n", "size": "WxH", "response_format": "url"|"b64_json",
                                   dif's "seed", "steps", "guidance", "negative_prompt", "sampler",
                                   "scheduler", "lora": [{"name", "scale"}]}
    GET  /v1/images/files/{name}  a PNG a "url" response points at
    POST /v1/videos/generations   {"prompt", "size": "WxH", "seconds" | dif's "frames", "seed", "steps",
                                   "response_format", "first_frame" / "last_frame": base64 PNG}
    GET  /v1/videos/files/{name}  an MP4 a "url" response points at
    GET  /v1/models               the one model served, with its kind ("image" | "video")
    GET  /health                  ok, the queue's depth and bound, counts

The served model makes images or videos; the route of the other kind answers 400 naming the right one. Both
generation routes are one handler over the same queue, timeout and error mapping. Errors are OpenAI-shaped
`{"error": {"message", "type", "code"}}`: 400 for a body that cannot run (the message names the field), 429
when the queue is full, 504 past the per-request timeout, 500 otherwise.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from collections.abc import Awaitable, Callable
from typing import Any

from attrs import frozen
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Route

from dif.errors import DifError
from dif_tools.serve.generate import JobRequest
from dif_tools.serve.requests import BadRequest, parse_request
from dif_tools.serve.video_requests import FPS, VideoJobRequest, parse_video_request
from dif_tools.serve.worker import JobResult, PipelineWorker, QueueFull, WrongKind


@frozen
class MediaRoute:
    """What differs between the image and the video route: the body's parser, file names, media type."""

    kind: str
    parse: Callable[[Any], JobRequest]
    file_name: re.Pattern[str]
    media_type: str
    file_route: str


ROUTES = {
    "image": MediaRoute("image", parse_request, re.compile(r"^[0-9a-f]{32}-\d{1,2}\.png$"), "image/png", "image_file"),
    "video": MediaRoute("video", parse_video_request, re.compile(r"^[0-9a-f]{32}\.mp4$"), "video/mp4", "video_file"),
}
GENERATIONS = {"image": "/v1/images/generations", "video": "/v1/videos/generations"}


@frozen
class ServeSettings:
    model_id: str
    timeout_s: float = 300.0
    kind: str = "image"  # what the model makes: the route of the other kind is refused with a message


def error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status_code=status)


def _entry(request: Request, route: MediaRoute, result: JobResult, index: int, job: JobRequest) -> dict[str, Any]:
    f = result.files[index]
    entry: dict[str, Any] = {"seed": f.seed}
    if isinstance(job, VideoJobRequest):  # what was made: the frames, their size and length at 24 fps
        frames = int(f.settings["frames"])
        size = f"{f.settings['width']}x{f.settings['height']}"
        entry |= {"frames": frames, "fps": FPS, "seconds": round(frames / FPS, 4), "size": size}
    if job.response_format == "b64_json":
        entry["b64_json"] = base64.b64encode(f.path.read_bytes()).decode("ascii")
    else:
        entry["url"] = str(request.url_for(route.file_route, name=f.name))
    return entry


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())


def build_app(worker: PipelineWorker, settings: ServeSettings) -> Starlette:
    """The app serving `worker`'s pipeline as `settings.model_id`."""
    started = time.time()

    def generations(route: MediaRoute) -> Callable[[Request], Awaitable[JSONResponse]]:
        async def handle(request: Request) -> JSONResponse:
            if route.kind != settings.kind:  # before the body: it is not read for a model that cannot run it
                message = (f"{settings.model_id!r} is a {settings.kind} model: this server answers "
                           f"POST {GENERATIONS[settings.kind]}, not {GENERATIONS[route.kind]}")  # fmt: skip
                return error(400, message, "invalid_request_error", "wrong_model_kind")
            try:
                body = json.loads(await request.body())
            except (json.JSONDecodeError, UnicodeDecodeError) as exc:
                return error(400, f"the body is not JSON: {exc}", "invalid_request_error")
            try:
                job = route.parse(body)
                model = body.get("model")
                if model is not None and model != settings.model_id:
                    served = f"this server serves {settings.model_id!r}"
                    raise BadRequest(f"model {model!r} is not served here", hint=served)
                future = worker.submit(job)
            except QueueFull as exc:
                return error(429, f"too many requests: {exc}; retry later", "rate_limit_error", "queue_full")
            except WrongKind as exc:
                return error(400, _one_line(exc), "invalid_request_error", "wrong_model_kind")
            except DifError as exc:
                return error(400, _one_line(exc), "invalid_request_error")
            try:
                result = await asyncio.wait_for(asyncio.wrap_future(future), settings.timeout_s)
            except TimeoutError:
                message = f"the request took longer than {settings.timeout_s:g} s"
                return error(504, message, "timeout_error", "timeout")
            except DifError as exc:  # settings the model refuses (a size off its grid, too many steps ...)
                return error(400, _one_line(exc), "invalid_request_error")
            except Exception as exc:
                return error(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")
            data = [_entry(request, route, result, i, job) for i in range(len(result.files))]
            timing = {"queued_s": round(result.queued_s, 4), "run_s": round(result.run_s, 4), "worker": result.worker}
            extra: dict[str, Any] = {}
            if isinstance(job, VideoJobRequest) and (note := job.frames_note()) is not None:
                extra["frames_from_seconds"] = note  # say which count 'seconds' became
            answer = {"created": int(time.time()), "data": data, "dif": {"id": result.id, **timing, **extra}}
            return JSONResponse(answer)

        return handle

    def files(route: MediaRoute) -> Callable[[Request], Awaitable[Any]]:
        async def handle(request: Request) -> Any:
            name = request.path_params["name"]
            path = worker.out_dir / name
            if not route.file_name.match(name) or not path.is_file():
                return error(404, f"no {route.kind} {name!r}", "invalid_request_error", "not_found")
            return FileResponse(path, media_type=route.media_type)

        return handle

    async def models(request: Request) -> JSONResponse:
        entry = {"id": settings.model_id, "object": "model", "created": int(started), "owned_by": "dif",
                 "kind": settings.kind, "endpoint": GENERATIONS[settings.kind]}  # fmt: skip
        return JSONResponse({"object": "list", "data": [entry]})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({
            "status": "ok" if worker.ready else "loading",
            "model": settings.model_id,
            "kind": settings.kind,
            "queue": worker.waiting,
            "queue_limit": worker.queue_size,
            "served": worker.served,
            "failed": worker.failed,
        })  # fmt: skip

    image, video = ROUTES["image"], ROUTES["video"]
    routes = [
        Route(GENERATIONS["image"], generations(image), methods=["POST"]),
        Route("/v1/images/files/{name}", files(image), methods=["GET"], name=image.file_route),
        Route(GENERATIONS["video"], generations(video), methods=["POST"]),
        Route("/v1/videos/files/{name}", files(video), methods=["GET"], name=video.file_route),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes)
