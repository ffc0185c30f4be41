"""`--rng torch-cpu --seed 7` draws the initial noise diffusers' own pipelines draw with
`torch.Generator("cpu").manual_seed(7)`: FLUX.2 klein (Flux2KleinPipeline.prepare_latents) and Krea 2
(Krea2Pipeline.prepare_latents), called on the pipelines diffusers loads from the embedded checkpoints,
packed the way each pipeline packs, in float32 and bfloat16 (the pipelines draw in the transformer's
dtype). Also: the CLI records the sampler, schedule and generator, and `--seed -1` draws a seed."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from click.testing import CliRunner

import dif
from dif.media.png import read_png_metadata
from dif_tools.cli import build_cli

SEED = 7
WIDTH, HEIGHT = 64, 48  # non-square: catches h / w mix-ups in the noise layout


def _diffusers_pipeline(family: str) -> Any:
    torch = pytest.importorskip("torch")
    diffusers = pytest.importorskip("diffusers")
    if family == "flux2":
        from dif_frontend_flux2 import DEFAULT_CHECKPOINT

        cls = diffusers.Flux2KleinPipeline
    else:
        from dif_frontend_krea2 import DEFAULT_CHECKPOINT

        cls = diffusers.Krea2Pipeline
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return cls.from_pretrained(DEFAULT_CHECKPOINT, torch_dtype=torch.float32)


def _their_noise(family: str, pipe: Any, dtype: Any, device: str = "cpu") -> np.ndarray:
    """The packed latents `prepare_latents` returns, as the pipeline's __call__ asks for them."""
    import torch

    generator = torch.Generator(device).manual_seed(SEED)
    if family == "flux2":
        channels = pipe.transformer.config.in_channels // 4
        latents, _ids = pipe.prepare_latents(1, channels, HEIGHT, WIDTH, dtype, device, generator)
    else:
        channels = pipe.transformer.config.in_channels // (pipe.patch_size**2)
        latents = pipe.prepare_latents(1, channels, HEIGHT, WIDTH, dtype, device, generator)
    return latents.float().cpu().numpy()


def _our_noise(family: str, dtype: str, rng: str) -> np.ndarray:
    pipe = dif.load(family=family, backend="interp", dtype=dtype).pipeline
    ppt = pipe.pixels_per_token
    module = __import__(type(pipe).__module__, fromlist=["GenerationRequest"])
    req = module.GenerationRequest("x", seed=SEED, width=WIDTH, height=HEIGHT, rng=rng)
    return pipe.initial_noise(req, HEIGHT // ppt, WIDTH // ppt)


@pytest.mark.cuda
@pytest.mark.oracle
@pytest.mark.parametrize("family", ["flux2", "krea2"])
def test_torch_cuda_seed_draws_the_diffusers_pipeline_noise_on_the_gpu(
    family: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--rng torch-cuda` against `prepare_latents(device="cuda", generator=torch.Generator("cuda"))`, with
    DIF_TORCH_CUDA_GPU set from this GPU: max abs <= 1e-5 (device logf / sincosf are not correctly rounded)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda is not available (the GPU comparison runs on the GPU machine)")
    props = torch.cuda.get_device_properties(0)
    monkeypatch.setenv("DIF_TORCH_CUDA_GPU", f"{props.multi_processor_count},{props.max_threads_per_multi_processor}")
    pipe = _diffusers_pipeline(family)
    theirs = _their_noise(family, pipe, torch.float32, device="cuda")
    ours = _our_noise(family, "f32", "torch-cuda")
    assert ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() <= 1e-5


@pytest.mark.oracle
@pytest.mark.parametrize("family", ["flux2", "krea2"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_torch_cpu_seed_draws_the_diffusers_pipeline_noise(family: str, dtype: str) -> None:
    torch = pytest.importorskip("torch")
    if torch.backends.cpu.get_cpu_capability() not in ("AVX2", "AVX512"):
        pytest.skip("dif's torch-cpu stream models torch's AVX2 kernels (this torch runs another build)")
    version = tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    if dtype == "bf16" and version < (2, 13):
        pytest.skip(f"torch {torch.__version__} draws bf16 normals from another stream; dif's torch-cpu "
                    "reproduces torch 2.13 (the pinned oracle; seen on the H200's torch 2.11)")  # fmt: skip
    theirs = _their_noise(family, _diffusers_pipeline(family), torch.float32 if dtype == "f32" else torch.bfloat16)
    loaded = dif.load(family=family, backend="interp", dtype=dtype)
    pipe = loaded.pipeline
    ppt = pipe.pixels_per_token
    request_type = type(pipe).__module__.rsplit(".", 1)[0] + ".pipeline"
    module = __import__(request_type, fromlist=["GenerationRequest"])
    req = module.GenerationRequest("x", seed=SEED, width=WIDTH, height=HEIGHT, rng="torch-cpu")
    ours = pipe.initial_noise(req, HEIGHT // ppt, WIDTH // ppt)
    assert ours.shape == theirs.shape, (ours.shape, theirs.shape)
    assert str(ours.dtype) == ("float32" if dtype == "f32" else "bfloat16")
    np.testing.assert_array_equal(ours.astype(np.float32), theirs)  # max abs 0: bit for bit
    numpy_req = module.GenerationRequest("x", seed=SEED, width=WIDTH, height=HEIGHT)
    assert not np.array_equal(pipe.initial_noise(numpy_req, HEIGHT // ppt, WIDTH // ppt), ours)  # PCG64


def test_cli_records_sampler_schedule_and_generator(tmp_path: Path) -> None:
    out = tmp_path / "fox.png"
    args = ["flux2", "generate", "-p", "a fox", "--steps", "3", "-W", "32", "-H", "32", "--backend", "cpu"]
    args += ["--sampling-method", "dpm++2m", "--scheduler", "karras", "--rng", "torch-cpu", "--seed", "-1"]
    result = CliRunner().invoke(build_cli(), [*args, "-o", str(out), "--json"])
    assert result.exit_code == 0, result.output
    settings = json.loads(result.stdout)["data"]["settings"]
    assert settings["sampler"] == "dpm++2m" and settings["scheduler"] == "karras" and settings["rng"] == "torch-cpu"
    assert isinstance(settings["seed"], int) and settings["seed"] >= 0  # -1 drew a seed, reported
    meta = read_png_metadata(out)
    assert meta["dif"]["sampler"] == "dpm++2m"
    assert "Sampler: DPM++ 2M, Schedule type: Karras," in meta["parameters"]
    assert f"Seed: {settings['seed']}," in meta["parameters"] and "RNG: CPU," in meta["parameters"]


def test_cli_refuses_unknown_sampler_names(tmp_path: Path) -> None:
    args = ["flux2", "generate", "-p", "a fox", "--sampling-method", "lms", "-o", str(tmp_path / "x.png")]
    result = CliRunner().invoke(build_cli(), args)
    assert result.exit_code != 0 and "euler" in result.output and "dpm++2m" in result.output
    assert not (tmp_path / "x.png").exists()


def test_api_takes_the_same_names() -> None:
    pipe = dif.load(backend="cpu")
    heun = pipe("a fox", steps=2, seed=3, width=32, height=32, sampler="heun", scheduler="beta", rng="torch-cpu")
    euler = pipe("a fox", steps=2, seed=3, width=32, height=32)
    assert heun.settings["sampler"] == "heun" and heun.settings["scheduler"] == "beta"
    assert euler.settings["sampler"] == "euler" and euler.settings["rng"] == "numpy"
    assert not np.array_equal(heun.run.noise, euler.run.noise)
    with pytest.raises(dif.errors.UsageError, match="sampler"):
        pipe("a fox", steps=2, seed=3, width=32, height=32, sampler="lms")
