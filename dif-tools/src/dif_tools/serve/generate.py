"""One request on one loaded pipeline, its files written: what every `dif serve` runner calls.

Where it sits: under the queue (`dif_tools.serve.worker`), in this process or in a Ray actor
(`dif_tools.serve.batch.GenerateWorker`, which `--replicas` and `dif batch` use), so an image or a video is
made and saved by one piece of code wherever it runs. A pipeline is `dif.load`'s: an image model is called
(`pipe(prompt, **settings)` -> `GeneratedImage`s, saved as the PNG `dif NAME generate` writes); a video model
is one whose frontend pipeline has `video_request` (MiniMax-H3: `pipe.pipeline`, an `H3Pipeline`), run with
`generate` and saved with its `save_mp4`, the MP4 `dif h3 generate` writes. dif-tools reaches the frontend
only through these methods (it imports no frontend).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from attrs import frozen

from dif_tools.serve.requests import ImageJobRequest
from dif_tools.serve.video_requests import VideoJobRequest

JobRequest = ImageJobRequest | VideoJobRequest
KINDS = ("image", "video")


@frozen
class GeneratedFile:
    """One file a job wrote: its name under the output folder and the settings it ran with."""

    name: str
    path: Path
    seed: int
    settings: dict[str, Any]


def model_kind(pipe: Any) -> str:
    """ "video" for a pipeline whose frontend makes videos (it has `video_request`), else "image"."""
    return "video" if callable(getattr(getattr(pipe, "pipeline", None), "video_request", None)) else "image"


def request_kind(request: JobRequest) -> str:
    return "video" if isinstance(request, VideoJobRequest) else "image"


def generate_files(pipe: Any, request: JobRequest, folder: Path, stem: str) -> tuple[GeneratedFile, ...]:
    """Run `request` on `pipe` and write its files into `folder`: `<stem>-<i>.png` per image, `<stem>.mp4`."""
    if isinstance(request, VideoJobRequest):
        return (_video(pipe, request, folder / f"{stem}.mp4"),)
    batch = request.n if request.n > 1 else None
    made = pipe(request.prompt, negative_prompt=request.negative_prompt, batch=batch, **request.settings())
    images = made if isinstance(made, list) else [made]
    out = []
    for i, image in enumerate(images):
        path = folder / f"{stem}-{i}.png"
        image.save(path)  # PNG with the parameters chunk, written atomically
        out.append(GeneratedFile(path.name, path, int(image.settings["seed"]), image.settings))
    return tuple(out)


def _video(pipe: Any, request: VideoJobRequest, path: Path) -> GeneratedFile:
    from dif.noise import random_seed

    frontend = pipe.pipeline
    seed = random_seed() if request.seed is None else request.seed
    req = frontend.video_request(
        request.prompt, frames=request.frames, width=request.width, height=request.height, steps=request.steps,
        seed=seed, first_frame=request.first_frame, last_frame=request.last_frame,
    )  # fmt: skip
    result = frontend.generate(req)  # checks the request first (the frontend's refusals are UsageErrors: 400)
    frontend.save_mp4(result, path, version=pipe.info.revision)  # by temp + rename
    return GeneratedFile(path.name, path, seed, dict(result.settings))


def warmup_request(kind: str) -> JobRequest:
    """One short generation at the model's default size, so the programs of that size are prepared before
    requests: an image of one step, or a video of the fewest grid points (2: one model evaluation)."""
    if kind == "video":
        return VideoJobRequest("warm-up", steps=2, seed=0)
    return ImageJobRequest("warm-up", seed=0, steps=1)


def warmup(pipe: Any) -> None:
    """`warmup_request` run on `pipe`, its file thrown away."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="dif-serve-warmup-") as tmp:
        generate_files(pipe, warmup_request(model_kind(pipe)), Path(tmp), "warm-up")
