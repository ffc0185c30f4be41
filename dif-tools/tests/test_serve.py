"""`dif serve` over loopback: a real uvicorn server on a thread in front of the embedded tiny FLUX.2 klein
on the CPU backend. A bounded load test (every image decoded, no errors), OpenAI's response shapes, 400 for
bad bodies (the message names the field), 429 when the queue is full, 504 past the timeout."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

httpx = pytest.importorskip("httpx", reason="the serve tests talk HTTP through httpx")
pytest.importorskip("uvicorn", reason="dif serve runs on uvicorn")

import dif  # noqa: E402
from dif_tools.serve.app import ServeSettings, build_app  # noqa: E402
from dif_tools.serve.load import decode_png, percentile, run_load  # noqa: E402
from dif_tools.serve.server import ServerThread  # noqa: E402
from dif_tools.serve.worker import PipelineWorker  # noqa: E402

SMALL = {"size": "32x32", "steps": 1}


class Gated:
    """The real pipeline behind a gate the test opens: holds a job in the worker to fill the queue."""

    def __init__(self, pipe: Any) -> None:
        self.pipe, self.gate, self.entered = pipe, threading.Event(), threading.Event()
        self.family = pipe.family

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        self.gate.wait(30)
        return self.pipe(*args, **kwargs)


@pytest.fixture(scope="module")
def pipe() -> Any:
    return dif.load(backend="cpu")


def serving(worker: PipelineWorker, timeout_s: float = 120.0) -> ServerThread:
    worker.start()
    return ServerThread(build_app(worker, ServeSettings("flux2-embedded", timeout_s))).start()


@pytest.fixture(scope="module")
def server(pipe: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, PipelineWorker]]:
    worker = PipelineWorker(lambda: pipe, tmp_path_factory.mktemp("serve"), queue_size=64)
    srv = serving(worker)
    yield srv.url, worker
    srv.stop()
    worker.stop()


def test_load_200_requests_8_concurrent(server: tuple[str, PipelineWorker]) -> None:
    url, worker = server
    before = worker.served
    report = run_load(url, {"prompt": "a red fox", **SMALL, "response_format": "b64_json"}, requests=200, concurrency=8)
    assert report["errors"] == 0, report["error_samples"]
    assert report["images_decoded"] == 200
    assert worker.served - before == 200
    lat = report["latency_s"]
    assert 0 < lat["p50"] <= lat["p99"] <= lat["max"]
    print(f"\nserve load: p50 {lat['p50']} s, p99 {lat['p99']} s, {report['throughput_rps']} req/s")


def test_url_response_serves_the_png_and_matches_the_api(server: tuple[str, PipelineWorker], pipe: Any) -> None:
    url, _ = server
    r = httpx.post(f"{url}/v1/images/generations", json={"prompt": "a fox", "n": 2, "seed": 7, **SMALL}, timeout=120)
    assert r.status_code == 200, r.text
    data = r.json()["data"]
    assert [d["seed"] for d in data] == [7, 8]
    pngs = [httpx.get(d["url"]).content for d in data]
    assert [decode_png(p) for p in pngs] == [(32, 32), (32, 32)]
    # the server's image is the Python API's image for the same settings (batch row 0 = seed 7)
    import io

    from PIL import Image

    direct = pipe("a fox", seed=7, steps=1, width=32, height=32, batch=2)[0].run.pixels
    served = np.asarray(Image.open(io.BytesIO(pngs[0])).convert("RGB"))
    assert np.array_equal(served, direct)


def test_models_and_health(server: tuple[str, PipelineWorker]) -> None:
    url, _ = server
    models = httpx.get(f"{url}/v1/models").json()
    assert models["object"] == "list" and models["data"][0]["id"] == "flux2-embedded"
    health = httpx.get(f"{url}/health").json()
    assert health["status"] == "ok" and health["queue_limit"] == 64


@pytest.mark.parametrize(
    ("body", "names"),
    [
        ({"n": 1}, "'prompt'"),
        ({"prompt": "x", "size": "big"}, "'size'"),
        ({"prompt": "x", "n": 0}, "'n'"),
        ({"prompt": "x", "response_format": "png"}, "'response_format'"),
        ({"prompt": "x", "steps": "four"}, "'steps'"),
        ({"prompt": "x", "colour": "red"}, "'colour'"),
        ({"prompt": "x", "model": "dall-e-3"}, "dall-e-3"),
        ({"prompt": "x", "lora": [{"name": "style"}]}, "LoRA"),
        ({"prompt": "x", "size": "33x32", "steps": 1}, "33"),  # off the model's 16-pixel grid: the frontend says so
        ([1, 2], "JSON object"),
    ],
)
def test_bad_bodies_get_400_with_a_message(server: tuple[str, PipelineWorker], body: Any, names: str) -> None:
    url, _ = server
    r = httpx.post(f"{url}/v1/images/generations", json=body, timeout=60)
    assert r.status_code == 400, r.text
    assert names in r.json()["error"]["message"]


def test_not_json_is_400(server: tuple[str, PipelineWorker]) -> None:
    r = httpx.post(f"{server[0]}/v1/images/generations", content=b"{nope", timeout=10)
    assert r.status_code == 400 and "not JSON" in r.json()["error"]["message"]


def test_full_queue_is_429_and_timeout_is_504(pipe: Any, tmp_path: Path) -> None:
    gated = Gated(pipe)
    worker = PipelineWorker(lambda: gated, tmp_path, queue_size=1)
    srv = serving(worker, timeout_s=3.0)
    try:
        body = {"prompt": "a fox", **SMALL}
        results: dict[str, httpx.Response] = {}

        def post(key: str) -> None:
            results[key] = httpx.post(f"{srv.url}/v1/images/generations", json=body, timeout=60)

        first = threading.Thread(target=post, args=("running",))
        first.start()
        assert gated.entered.wait(10)  # the worker holds job 1 at the gate
        second = threading.Thread(target=post, args=("waiting",))
        second.start()
        while worker.waiting < 1:  # job 2 fills the queue of 1
            threading.Event().wait(0.01)
        full = httpx.post(f"{srv.url}/v1/images/generations", json=body, timeout=10)
        assert full.status_code == 429 and full.json()["error"]["code"] == "queue_full"
        first.join()
        second.join()
        assert results["running"].status_code == 504  # held past the 3 s timeout
        assert "longer than 3 s" in results["running"].json()["error"]["message"]
        assert results["waiting"].status_code == 504 and worker.waiting == 0  # its place is free again
        gated.gate.set()
        while worker.served + worker.failed < 1:  # job 1 runs to its end (nobody waits for it any more)
            threading.Event().wait(0.01)
        ok = httpx.post(f"{srv.url}/v1/images/generations", json=body, timeout=60)
        assert ok.status_code == 200, ok.text
        assert decode_png(httpx.get(ok.json()["data"][0]["url"]).content) == (32, 32)
    finally:
        gated.gate.set()
        srv.stop()
        worker.stop()


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0 and percentile(values, 99) == 99.0 and percentile([3.0], 99) == 3.0
