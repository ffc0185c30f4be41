"""Reference images with and without the K/V cache, img2img and a batch on the CUDA backend, against the
CPU backend (the reference) on the tiny random klein of test_edit_oracle (fp32). Skips with the reason
where the CUDA backend cannot run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dif.dtypes import DType
from dif.image_pipeline import image_request
from dif.testing.backends import backend_skip_reason
from dif_frontend_flux2.pipeline import Flux2Pipeline
from dif_frontend_flux2.weights import open_checkpoint

from .conftest import rel_l2
from .test_edit_oracle import PROMPT, STEPS, klein, klein_kv, write_image  # noqa: F401  (fixtures)

pytestmark = [pytest.mark.cuda, pytest.mark.oracle]
TOL = 1e-4  # CUDA fp32 kernels vs numpy; not measured in this session (no GPU here)


@pytest.fixture(autouse=True)
def _needs_cuda() -> None:
    if (why := backend_skip_reason("cuda")) is not None:
        pytest.skip(f"CUDA backend unavailable: {why}")


@pytest.mark.parametrize(
    "fixture, inputs",
    [
        ("klein", {"refs": 2, "batch": 1, "kv_cache": False}),
        ("klein_kv", {"refs": 2, "batch": 2, "kv_cache": None}),  # the KV checkpoint's default: cached
        ("klein", {"init": True, "batch": 1}),
        ("klein", {"batch": 3}),
    ],
)
def test_cuda_matches_the_cpu_backend(request, tmp_path: Path, fixture: str, inputs: dict[str, Any]) -> None:  # type: ignore[no-untyped-def]
    folder, _ = request.getfixturevalue(fixture)
    images: dict[str, Any] = {"batch": inputs["batch"]}
    if inputs.get("refs"):
        images["ref_images"] = [write_image(tmp_path / f"r{i}.png", 96 - 16 * i, 64, i) for i in range(inputs["refs"])]
        images["kv_cache"] = inputs["kv_cache"]
    if inputs.get("init"):
        images["init_image"] = write_image(tmp_path / "src.png", 100, 70, 9)
        images["strength"] = 0.6
    noise = np.random.default_rng(1).standard_normal((inputs["batch"], 128, 4, 6)).astype(np.float32)
    settings = {"steps": STEPS, "seed": 0, **({} if inputs.get("init") else {"width": 96, "height": 64})}
    req = image_request(PROMPT, settings, init_noise=noise, **images)
    runs = {
        backend: Flux2Pipeline(open_checkpoint(folder), dtype=DType.F32, backend=backend).generate_batch(req)
        for backend in ("cpu", "cuda")
    }
    for ours, ref in zip(runs["cuda"], runs["cpu"], strict=True):
        assert rel_l2(ours.latents, ref.latents) <= TOL
        assert np.abs(ours.pixels.astype(int) - ref.pixels.astype(int)).max() <= 2
