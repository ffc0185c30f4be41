"""A one-step run without CFG runs as one program (`dif_frontend_sdturbo.one_step`): the same latents and
pixels as the three stage programs apart, on the embedded checkpoint with the KL VAE and with TAESD, f32
and f16; other requests keep the stages apart; a stage that goes non-finite inside the one program is
still refused by its name. (Oracle parity of the one-step path itself: test_oracle_pipeline.py.)"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

from dif.errors import NonFiniteError
from dif.image_pipeline import ImageRequest
from dif.kit.finite import run_checks
from dif_frontend_sdturbo import DEFAULT_CHECKPOINT
from dif_frontend_sdturbo.plugin import INFO

PROMPT = "a red fox in the snow"
SIZE = dict(width=128, height=64)  # non-square


def _run(one_program: bool, *, dtype: str = "f32", fast_vae: bool = False, root: Path = DEFAULT_CHECKPOINT, **req):  # type: ignore[no-untyped-def]
    pipe = INFO.pipeline(root, dtype=dtype, backend="cpu", fast_vae=fast_vae)
    pipe.one_program = one_program
    runs = pipe.generate_batch(ImageRequest(PROMPT, seed=3, **{**SIZE, **req}))
    return pipe, runs[0]


def _path(pipe) -> set[str]:  # type: ignore[no-untyped-def]
    """The kinds of program the run registered (`ProgramCache.keys`: a set, not a dict)."""
    registered = pipe._programs.keys()
    return {key[0] for key in registered}


@pytest.mark.parametrize("dtype", ["f32", "f16"])
@pytest.mark.parametrize("fast_vae", [False, True])
def test_one_program_equals_the_stages_apart(dtype: str, fast_vae: bool) -> None:
    one, run = _run(True, dtype=dtype, fast_vae=fast_vae)
    apart, want = _run(False, dtype=dtype, fast_vae=fast_vae)
    assert _path(one) == {"one_step"}
    assert _path(apart) == {"text_encoder", "unet", "taesd" if fast_vae else "vae"}
    a, b = run.latents.astype(np.float32), want.latents.astype(np.float32)
    tol = 1e-6 if dtype == "f32" else 1e-5  # measured 4.3e-7 / 2.7e-6: reciprocals instead of divisions
    assert np.linalg.norm(a - b) <= tol * np.linalg.norm(b)
    assert np.abs(run.pixels.astype(int) - want.pixels.astype(int)).max() <= 1
    assert run.pixels.shape == (64, 128, 3) and run.settings == want.settings


def test_the_one_program_reports_progress_and_its_stages() -> None:
    seen = []
    pipe = INFO.pipeline(DEFAULT_CHECKPOINT, dtype="f32", backend="cpu")
    pipe.on_step = lambda i, n, latents: seen.append((i, n, latents.shape))
    run = pipe.generate(ImageRequest(PROMPT, seed=3, **SIZE))
    assert seen == [(1, 1, (1, 128, 4))]
    assert {"encode", "denoise", "decode"} <= set(run.timings)


@pytest.mark.parametrize(
    ("req", "why"),
    [(dict(steps=2), "two steps"), (dict(guidance=2.0), "CFG"), (dict(batch=2), "a batch of two")],
)
def test_other_requests_keep_the_stages_apart(req: dict, why: str) -> None:
    pipe, _ = _run(True, **req)
    assert "one_step" not in _path(pipe), why


def _poisoned(tmp_path: Path, component: str, tensor: str) -> Path:
    root = tmp_path / "poisoned"
    shutil.copytree(DEFAULT_CHECKPOINT, root)
    (path,) = (root / component).glob("*.safetensors")
    tensors = load_file(path)
    tensors[tensor] = np.full_like(tensors[tensor], np.nan)
    save_file(tensors, path)
    return root


@pytest.mark.parametrize(
    ("component", "tensor", "stage"),
    [
        ("text_encoder", "text_model.final_layer_norm.bias", "text features"),
        ("unet", "conv_out.bias", "UNet output at step 1 of 1"),
        ("vae", "decoder.conv_out.bias", "decoded image"),
    ],
)
def test_a_nonfinite_stage_inside_the_one_program_is_named(
    tmp_path: Path, component: str, tensor: str, stage: str
) -> None:
    root = _poisoned(tmp_path, component, tensor)
    with run_checks(allow_nonfinite_weights=True), pytest.warns(UserWarning), pytest.raises(NonFiniteError) as err:
        _run(True, root=root)
    assert str(err.value).startswith(f"{stage} has non-finite values")
