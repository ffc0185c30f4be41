"""`dif serve` for a video model over loopback: a real uvicorn server on a thread in front of the embedded tiny
MiniMax-H3 on the CPU backend. An MP4 answer decodes with PyAV (H.264 + AAC, the frames asked for, stereo
32 kHz), b64_json and url forms, fl2va keyframes, 400 naming the field for bad bodies, the image route refused
for a video model (and the video route for an image model), 429 and 504 on the shared queue, `GET /v1/models`
with the kind, a short load test, `dif serve --model h3` as a command and two Ray replicas. Sizes are the
smallest the model takes (32x32, 22 frames: one decode chunk) with 2 grid points."""

from __future__ import annotations

import base64
import io
import threading
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

httpx = pytest.importorskip("httpx", reason="the serve tests talk HTTP through httpx")
pytest.importorskip("uvicorn", reason="dif serve runs on uvicorn")
pytest.importorskip("av", reason="the MP4 is written and read through PyAV")

import dif  # noqa: E402
from dif.media.mp4 import read_mp4  # noqa: E402
from dif_tools.serve.app import ServeSettings, build_app  # noqa: E402
from dif_tools.serve.load import decode_mp4, run_load  # noqa: E402
from dif_tools.serve.server import ServerThread  # noqa: E402
from dif_tools.serve.video_requests import frames_for_seconds  # noqa: E402
from dif_tools.serve.worker import PipelineWorker  # noqa: E402

SMALL = {"size": "32x32", "frames": 22, "steps": 2}
VIDEOS = "/v1/videos/generations"


def png_b64(width: int, height: int, seed: int = 0) -> str:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(pixels).save(buf, format="PNG")
    return base64.b64encode(buf.getvalue()).decode("ascii")


@pytest.fixture(scope="module")
def h3() -> Any:
    return dif.load(family="h3", backend="cpu")


@pytest.fixture(scope="module")
def server(h3: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, PipelineWorker]]:
    worker = PipelineWorker(lambda: h3, tmp_path_factory.mktemp("serve-video"), queue_size=16)
    worker.start()
    assert worker.kind == "video"
    srv = ServerThread(build_app(worker, ServeSettings("h3-embedded", 120.0, worker.kind))).start()
    yield srv.url, worker
    srv.stop()
    worker.stop()


def test_url_answer_is_an_mp4_with_both_streams(server: tuple[str, PipelineWorker], tmp_path: Path) -> None:
    url, _ = server
    r = httpx.post(f"{url}{VIDEOS}", json={"prompt": "waves on a beach", "seed": 4, **SMALL}, timeout=120)
    assert r.status_code == 200, r.text
    (entry,) = r.json()["data"]
    assert entry["seed"] == 4 and entry["frames"] == 22 and entry["size"] == "32x32" and entry["fps"] == 24
    assert entry["url"].endswith(f"/v1/videos/files/{r.json()['dif']['id']}.mp4")
    got = httpx.get(entry["url"], timeout=30)
    assert got.status_code == 200 and got.headers["content-type"] == "video/mp4"
    facts = decode_mp4(got.content)
    assert facts["video_codec"] == "h264" and facts["audio_codec"] == "aac"
    assert (facts["frames"], facts["width"], facts["height"]) == (22, 32, 32)
    assert (facts["channels"], facts["sample_rate"]) == (2, 32000)
    path = tmp_path / "got.mp4"
    path.write_bytes(got.content)
    video = read_mp4(path)  # dif's reader: the audio trimmed to the length the metadata states
    assert video["frames"].shape == (22, 32, 32, 3) and video["audio"].shape == (2, round(22 * 32000 / 24))
    assert video["dif"]["dif"]["seed"] == 4 and "Frames: 22" in video["parameters"]


def test_b64_answer_and_seconds(server: tuple[str, PipelineWorker]) -> None:
    url, _ = server
    body = {"prompt": "a drum", "size": "64x32", "seconds": "1", "steps": 2, "response_format": "b64_json"}
    r = httpx.post(f"{url}{VIDEOS}", json=body, timeout=120)
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["dif"]["frames_from_seconds"]["frames"] == 22  # 24 frames: 22 is the nearest 17n + 5
    facts = decode_mp4(base64.b64decode(answer["data"][0]["b64_json"]))
    assert (facts["frames"], facts["width"], facts["height"], facts["channels"]) == (22, 64, 32, 2)
    assert "url" not in answer["data"][0]


def test_seconds_convert_to_the_nearest_valid_count() -> None:
    # x 24 fps: 2.4 -> 5; 21.6, 24, 28.8 -> 22; 31.2 -> 39; 30.5, halfway between 22 and 39 -> 39; 124.08 -> 124
    seconds = (0.1, 0.9, 1.0, 1.2, 1.3, 30.5 / 24, 5.17)
    assert [frames_for_seconds(s) for s in seconds] == [5, 22, 22, 22, 39, 39, 124]


def test_keyframes_condition_the_video(server: tuple[str, PipelineWorker]) -> None:
    url, _ = server
    body = {"prompt": "the kite lifts off", "seed": 1, **SMALL, "response_format": "b64_json"}
    plain = httpx.post(f"{url}{VIDEOS}", json=body, timeout=120)
    framed = httpx.post(f"{url}{VIDEOS}", json={**body, "first_frame": png_b64(32, 32)}, timeout=120)
    both = {**body, "first_frame": png_b64(32, 32), "last_frame": "data:image/png;base64," + png_b64(32, 32, 1)}
    ends = httpx.post(f"{url}{VIDEOS}", json=both, timeout=120)
    assert [a.status_code for a in (plain, framed, ends)] == [200, 200, 200], [plain.text, framed.text, ends.text]
    blobs = [base64.b64decode(a.json()["data"][0]["b64_json"]) for a in (plain, framed, ends)]
    assert all(decode_mp4(b)["frames"] == 22 for b in blobs)
    assert blobs[0] != blobs[1] != blobs[2]  # the keyframe rows change the video


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"frames": 22}, "'prompt'"),
        ({"prompt": "x", "frames": 23}, "'frames' is 23"),
        ({"prompt": "x", "frames": 23}, "22 or 39"),
        ({"prompt": "x", "frames": 5, "size": "32x32", "steps": 2}, "fewest frames it decodes is 22"),  # the frontend
        ({"prompt": "x", "frames": 22, "seconds": 1}, "'seconds' or 'frames'"),
        ({"prompt": "x", "seconds": "soon"}, "'seconds'"),
        ({"prompt": "x", "seconds": 0}, "'seconds'"),
        ({"prompt": "x", "size": "33x32"}, "'size' 33x32"),
        ({"prompt": "x", "size": "48x32"}, "multiple of 32"),
        ({"prompt": "x", "size": "wide"}, "'size'"),
        ({"prompt": "x", "steps": 1}, "'steps'"),
        ({"prompt": "x", "n": 2}, "'n'"),
        ({"prompt": "x", "response_format": "mp4"}, "'response_format'"),
        ({"prompt": "x", "first_frame": "not base64!"}, "'first_frame' is not base64"),
        ({"prompt": "x", "last_frame": base64.b64encode(b"GIF89a...").decode()}, "'last_frame'"),
        ({"prompt": "x", "first_frame": 7}, "'first_frame' must be a base64 PNG"),
        ({"prompt": "x", **SMALL, "first_frame": png_b64(64, 32)}, "'first_frame' is 64x32"),
        ({"prompt": "x", "frames": 22, "steps": 2, "last_frame": png_b64(64, 32)}, "last_frame is 64x32"),  # frontend
        ({"prompt": "x", "model": "sora-2"}, "sora-2"),
        ({"prompt": "x", "guidance": 3}, "'guidance'"),
        ([1, 2], "JSON object"),
    ],
)
def test_bad_bodies_get_400_with_a_message(server: tuple[str, PipelineWorker], body: Any, names: str) -> None:
    url, _ = server
    r = httpx.post(f"{url}{VIDEOS}", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert names in r.json()["error"]["message"]


def test_jpeg_keyframe_is_refused(server: tuple[str, PipelineWorker]) -> None:
    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (32, 32)).save(buf, format="JPEG")
    body = {"prompt": "x", **SMALL, "first_frame": base64.b64encode(buf.getvalue()).decode()}
    r = httpx.post(f"{server[0]}{VIDEOS}", json=body, timeout=60)
    assert r.status_code == 400 and "send a PNG" in r.json()["error"]["message"]


def test_image_route_is_refused_for_a_video_model(server: tuple[str, PipelineWorker]) -> None:
    url, _ = server
    r = httpx.post(f"{url}/v1/images/generations", json={"prompt": "x"}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "wrong_model_kind"
    assert "video model" in r.json()["error"]["message"] and VIDEOS in r.json()["error"]["message"]
    assert httpx.get(f"{url}/v1/videos/files/{'0' * 32}.mp4").status_code == 404
    assert httpx.get(f"{url}/v1/videos/files/..%2Fx.mp4").status_code == 404


def test_models_lists_the_kind(server: tuple[str, PipelineWorker]) -> None:
    url, _ = server
    (entry,) = httpx.get(f"{url}/v1/models").json()["data"]
    assert entry["id"] == "h3-embedded" and entry["kind"] == "video" and entry["endpoint"] == VIDEOS
    assert httpx.get(f"{url}/health").json()["kind"] == "video"


def test_load_10_requests_2_concurrent(server: tuple[str, PipelineWorker]) -> None:
    url, worker = server
    before = worker.served
    report = run_load(url, {"prompt": "rain", **SMALL, "response_format": "b64_json"}, requests=10, concurrency=2,
                      kind="video")  # fmt: skip
    assert report["errors"] == 0, report["error_samples"]
    assert report["images_decoded"] == 10 and worker.served - before == 10
    lat = report["latency_s"]
    print(f"\nserve video load: p50 {lat['p50']} s, p99 {lat['p99']} s, {report['throughput_rps']} req/s")


class GatedFrontend:
    """The H3 pipeline behind a gate the test opens: holds a video job in the worker to fill the queue."""

    def __init__(self, frontend: Any) -> None:
        self.frontend, self.gate, self.entered = frontend, threading.Event(), threading.Event()
        self.video_request, self.save_mp4 = frontend.video_request, frontend.save_mp4

    def generate(self, req: Any) -> Any:
        self.entered.set()
        self.gate.wait(30)
        return self.frontend.generate(req)


def test_full_queue_is_429_and_timeout_is_504(h3: Any, tmp_path: Path) -> None:
    gated = GatedFrontend(h3.pipeline)
    pipe = SimpleNamespace(pipeline=gated, info=h3.info, family=h3.family)
    worker = PipelineWorker(lambda: pipe, tmp_path, queue_size=1)
    worker.start()
    srv = ServerThread(build_app(worker, ServeSettings("h3-embedded", 2.0, worker.kind))).start()
    try:
        body = {"prompt": "x", **SMALL}
        results: dict[str, httpx.Response] = {}

        def post(key: str) -> None:
            results[key] = httpx.post(f"{srv.url}{VIDEOS}", json=body, timeout=60)

        first = threading.Thread(target=post, args=("running",))
        first.start()
        assert gated.entered.wait(10)
        second = threading.Thread(target=post, args=("waiting",))
        second.start()
        while worker.waiting < 1:
            threading.Event().wait(0.01)
        full = httpx.post(f"{srv.url}{VIDEOS}", json=body, timeout=10)
        assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
        first.join()
        second.join()
        assert [results[k].status_code for k in ("running", "waiting")] == [504, 504]
        assert "longer than 2 s" in results["running"].json()["error"]["message"]
        gated.gate.set()
        while worker.served + worker.failed < 1:
            threading.Event().wait(0.01)
        ok = httpx.post(f"{srv.url}{VIDEOS}", json=body, timeout=60)
        assert ok.status_code == 200, ok.text
    finally:
        gated.gate.set()
        srv.stop()
        worker.stop()


def test_video_route_is_refused_for_an_image_model(tmp_path: Path) -> None:
    klein = dif.load(backend="cpu")
    worker = PipelineWorker(lambda: klein, tmp_path, queue_size=2)
    worker.start()
    srv = ServerThread(build_app(worker, ServeSettings("flux2-embedded", 30.0, worker.kind))).start()
    try:
        r = httpx.post(f"{srv.url}{VIDEOS}", json={"prompt": "x", **SMALL}, timeout=30)
        assert r.status_code == 400 and r.json()["error"]["code"] == "wrong_model_kind"
        message = r.json()["error"]["message"]
        assert "image model" in message and "/v1/images/generations" in message
        assert httpx.get(f"{srv.url}/v1/models").json()["data"][0]["kind"] == "image"
    finally:
        srv.stop()
        worker.stop()


def test_dif_serve_model_h3_serves_the_embedded_video_model() -> None:
    """`dif serve --model h3` end to end: the command loads and warms the embedded H3, prints its document,
    and answers a video request; SIGINT ends it."""
    import json
    import signal
    import subprocess
    import sys
    import time

    script = "from dif_tools.cli import build_cli; build_cli().main(prog_name='dif')"
    args = ["serve", "--model", "h3", "--backend", "cpu", "--port", "0", "--json"]
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        text, doc, deadline = "", None, time.monotonic() + 120
        while doc is None and time.monotonic() < deadline:  # the document is one indented JSON object
            line = proc.stdout.readline()
            assert line, f"dif serve ended (exit {proc.poll()})"
            text += line
            try:
                doc = json.loads(text)
            except json.JSONDecodeError:
                continue
        assert doc is not None
        data = doc["data"]
        assert data["model"] == "h3-embedded" and data["kind"] == "video" and data["endpoint"].endswith(VIDEOS)
        r = httpx.post(data["endpoint"], json={"prompt": "x", **SMALL, "response_format": "b64_json"}, timeout=120)
        assert r.status_code == 200, r.text
        assert decode_mp4(base64.b64decode(r.json()["data"][0]["b64_json"]))["frames"] == 22
    finally:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        finally:
            proc.kill()


def test_two_ray_replicas_serve_videos(tmp_path: Path) -> None:
    """`--replicas 2` with the video model: the MP4 bytes come back from the actors and are served here."""
    ray = pytest.importorskip("ray", reason="--replicas runs its pipelines in Ray actors")
    from dif_tools.serve.batch import LoadSpec, init_ray
    from dif_tools.serve.replicas import RayReplicas

    init_ray("local", 2)
    spec = LoadSpec(family="h3", backend="cpu")
    worker = RayReplicas(lambda: None, tmp_path, queue_size=8, spec=spec, replicas=2, ray=ray)
    try:
        worker.start()
        assert worker.kind == "video"
        srv = ServerThread(build_app(worker, ServeSettings("h3-embedded", 120.0, worker.kind))).start()
        report = run_load(srv.url, {"prompt": "rain", **SMALL}, requests=6, concurrency=2, kind="video")
        assert report["errors"] == 0, report["error_samples"]
        assert report["images_decoded"] == 6  # fetched through the url, every one decoded
        bad = httpx.post(f"{srv.url}{VIDEOS}", json={"prompt": "x", "frames": 5, "size": "32x32"}, timeout=60)
        assert bad.status_code == 400 and "fewest frames" in bad.json()["error"]["message"]  # the replica's refusal
        srv.stop()
    finally:
        worker.stop()
        ray.shutdown()
