"""The starlette application of `dif serve`: OpenAI's image routes over one `PipelineWorker`.

    POST /v1/images/generations   {"prompt", "n", "size": "WxH", "response_format": "url"|"b64_json",
                                   dif's "seed", "steps", "guidance", "negative_prompt", "sampler",
                                   "scheduler", "lora": [{"name", "scale"}]}
    GET  /v1/images/files/{name}  a PNG a "url" response points at
    GET  /v1/models               the one model served
    GET  /health                  ok, the queue's depth and bound, counts

Errors are OpenAI-shaped `{"error": {"message", "type", "code"}}`: 400 for a body that cannot run (the
message names the field), 429 when the queue is full, 504 past the per-request timeout, 500 otherwise.
"""

from __future__ import annotations

import asyncio
import base64
import json
import re
import time
from typing import Any

from attrs import frozen
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import FileResponse, JSONResponse
from starlette.routing import Route

from dif.errors import DifError
from dif_tools.serve.requests import BadRequest, parse_request
from dif_tools.serve.worker import JobResult, PipelineWorker, QueueFull

FILE_NAME = re.compile(r"^[0-9a-f]{32}-\d{1,2}\.png$")


@frozen
class ServeSettings:
    model_id: str
    timeout_s: float = 300.0


def error(status: int, message: str, kind: str, code: str | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "code": code}}, status_code=status)


def _image_entry(request: Request, result: JobResult, index: int, fmt: str) -> dict[str, Any]:
    f = result.files[index]
    entry: dict[str, Any] = {"seed": f.seed}
    if fmt == "b64_json":
        entry["b64_json"] = base64.b64encode(f.path.read_bytes()).decode("ascii")
    else:
        entry["url"] = str(request.url_for("image_file", name=f.name))
    return entry


def build_app(worker: PipelineWorker, settings: ServeSettings) -> Starlette:
    """The app serving `worker`'s pipeline as `settings.model_id`."""
    started = time.time()

    async def generations(request: Request) -> JSONResponse:
        try:
            body = json.loads(await request.body())
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            return error(400, f"the body is not JSON: {exc}", "invalid_request_error")
        try:
            job = parse_request(body)
            model = body.get("model")
            if model is not None and model != settings.model_id:
                served = f"this server serves {settings.model_id!r}"
                raise BadRequest(f"model {model!r} is not served here", hint=served)
            future = worker.submit(job)
        except QueueFull as exc:
            return error(429, f"too many requests: {exc}; retry later", "rate_limit_error", "queue_full")
        except DifError as exc:
            return error(400, " ".join(str(exc).split()), "invalid_request_error")
        try:
            result = await asyncio.wait_for(asyncio.wrap_future(future), settings.timeout_s)
        except TimeoutError:
            return error(504, f"the request took longer than {settings.timeout_s:g} s", "timeout_error", "timeout")
        except DifError as exc:  # settings the model refuses (a size off its grid, too many steps ...)
            return error(400, " ".join(str(exc).split()), "invalid_request_error")
        except Exception as exc:
            return error(500, f"generation failed: {type(exc).__name__}: {exc}", "server_error")
        data = [_image_entry(request, result, i, job.response_format) for i in range(len(result.files))]
        timing = {"queued_s": round(result.queued_s, 4), "run_s": round(result.run_s, 4), "worker": result.worker}
        return JSONResponse({"created": int(time.time()), "data": data, "dif": {"id": result.id, **timing}})

    async def image_file(request: Request) -> Any:
        name = request.path_params["name"]
        path = worker.out_dir / name
        if not FILE_NAME.match(name) or not path.is_file():
            return error(404, f"no image {name!r}", "invalid_request_error", "not_found")
        return FileResponse(path, media_type="image/png")

    async def models(request: Request) -> JSONResponse:
        entry = {"id": settings.model_id, "object": "model", "created": int(started), "owned_by": "dif"}
        return JSONResponse({"object": "list", "data": [entry]})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({
            "status": "ok" if worker.ready else "loading",
            "model": settings.model_id,
            "queue": worker.waiting,
            "queue_limit": worker.queue_size,
            "served": worker.served,
            "failed": worker.failed,
        })  # fmt: skip

    routes = [
        Route("/v1/images/generations", generations, methods=["POST"]),
        Route("/v1/images/files/{name}", image_file, methods=["GET"], name="image_file"),
        Route("/v1/models", models, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    return Starlette(routes=routes)
