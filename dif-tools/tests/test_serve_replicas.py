"""`dif serve --replicas 2` in-process: the HTTP app and queue in front of two Ray actors on a local cluster
(CPU backend, the embedded tiny klein), each with its own warm pipeline. Concurrent requests are all
answered, every image decodes, both replicas serve, and a replica's image equals the Python API's."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

httpx = pytest.importorskip("httpx", reason="the serve tests talk HTTP through httpx")
ray = pytest.importorskip("ray", reason="--replicas runs its pipelines in Ray actors")

from dif_tools.serve.app import ServeSettings, build_app  # noqa: E402
from dif_tools.serve.batch import LoadSpec, init_ray  # noqa: E402
from dif_tools.serve.load import decode_png  # noqa: E402
from dif_tools.serve.replicas import RayReplicas  # noqa: E402
from dif_tools.serve.server import ServerThread  # noqa: E402


def test_two_replicas_share_the_queue(tmp_path: Path) -> None:
    init_ray("local", 2)
    worker = RayReplicas(lambda: None, tmp_path, queue_size=32, spec=LoadSpec(backend="cpu"), replicas=2, ray=ray)
    try:
        worker.start()
        assert len(set(worker.names)) == 2
        srv = ServerThread(build_app(worker, ServeSettings("flux2-embedded", 120.0))).start()
        body = {"prompt": "a fox", "size": "32x32", "steps": 1}

        def post(seed: int) -> httpx.Response:
            return httpx.post(f"{srv.url}/v1/images/generations", json={**body, "seed": seed}, timeout=120)

        with ThreadPoolExecutor(4) as pool:
            answers = list(pool.map(post, range(16)))
        assert [a.status_code for a in answers] == [200] * 16, [a.text for a in answers if a.status_code != 200]
        served_by = {a.json()["dif"]["worker"] for a in answers}
        assert served_by == set(worker.names)  # both replicas took requests
        for a in answers:
            assert decode_png(httpx.get(a.json()["data"][0]["url"]).content) == (32, 32)
        bad = httpx.post(f"{srv.url}/v1/images/generations", json={**body, "size": "40x40"}, timeout=120)
        assert bad.status_code == 400 and "40" in bad.json()["error"]["message"]  # the replica's error, as in-process
        from PIL import Image

        # the same request run directly, on one BLAS thread as Ray's workers run (OMP_NUM_THREADS=1), as
        # test_batch.py does: on another thread count a BLAS sums in another order (one value moves by 1)
        code = ("import sys, numpy as np, dif; np.save(sys.argv[1], dif.load(backend='cpu')('a fox', seed=3, "
                "steps=1, width=32, height=32).run.pixels)")  # fmt: skip
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
        subprocess.run([sys.executable, "-c", code, str(tmp_path / "direct.npy")], env=env, check=True, timeout=240)
        got = httpx.get(answers[3].json()["data"][0]["url"]).content
        assert np.array_equal(np.asarray(Image.open(io.BytesIO(got)).convert("RGB")), np.load(tmp_path / "direct.npy"))
        srv.stop()
    finally:
        worker.stop()
        ray.shutdown()
