"""dif.rng: torch's CPU (MT19937) and CUDA (Philox4x32-10) randn streams reproduced in numpy, against
real torch: bit-exact on the CPU for torch's AVX2 / AVX-512 kernels in float32, bf16 and f16 (float64 to
1e-15), both normal-sampling
layouts (< 16 elements and >= 16, with and without a tail), the latent shapes FLUX.2 klein and Krea 2
draw; the CUDA stream against torch.Generator("cuda") on a GPU (skipped without one)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import ml_dtypes
import numpy as np
import pytest

from dif.errors import UsageError
from dif.noise import gaussian_noise
from dif.rng import NoiseStream, standard_normal
from dif.rng.torch_cpu import MT19937, torch_cpu_randn
from dif.rng.torch_cuda import launch_threads, philox4x32_10, torch_cuda_randn

SHAPES = [
    (1,),
    (5,),
    (15,),  # the scalar double path
    (16,),
    (17,),  # one block and a recomputed tail
    (2, 3, 5, 7),
    (1, 128, 2, 3),  # FLUX.2 klein's tiny test checkpoint (unpacked: 128 channels, grid 2x3)
    (1, 16, 8, 12),  # Krea 2's (16 latent channels, 2x2 patches)
    (1, 128, 64, 64),  # klein at 1024x1024: (1, 4 * 32, H/16, W/16)
    (1, 16, 128, 128),  # Krea 2 at 1024x1024: (1, 16, H/8, W/8)
]
SEEDS = (0, 7, 123456789, 2**32 - 1, 2**40 + 3)


def _torch_capability(torch) -> str:  # noqa: ANN001
    return str(torch.backends.cpu.get_cpu_capability())


def _torch_before_2_13(torch: Any) -> bool:
    major, minor = (int(part) for part in torch.__version__.split("+")[0].split(".")[:2])
    return (major, minor) < (2, 13)


@pytest.mark.oracle
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_torch_cpu_randn_is_bit_exact(shape: tuple[int, ...], dtype: str) -> None:
    torch = pytest.importorskip("torch")
    if _torch_capability(torch) not in ("AVX2", "AVX512"):
        pytest.skip(f"torch runs its {_torch_capability(torch)} kernels here; dif's default models the AVX2 one")
    if dtype in ("bfloat16", "float16") and _torch_before_2_13(torch):
        pytest.skip(f"torch {torch.__version__} draws half-precision normals from another stream; dif's torch-cpu "
                    "reproduces torch 2.13 (the pinned oracle; seen on the H200's torch 2.11)")  # fmt: skip
    seeds = SEEDS if np.prod(shape) < 100_000 else SEEDS[:2]
    for seed in seeds:
        theirs = torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=getattr(torch, dtype))
        ours = standard_normal(shape, seed, "torch-cpu", dtype)
        assert ours.dtype == np.dtype(getattr(ml_dtypes, dtype, dtype)) and ours.shape == shape
        if dtype == "float64":  # numpy's and libm's double log / sin / cos differ in the last bit at times
            np.testing.assert_allclose(ours, theirs.numpy(), rtol=0, atol=1e-15, err_msg=f"seed {seed}")
        else:
            np.testing.assert_array_equal(ours.astype(np.float64), theirs.double().numpy(), err_msg=f"seed {seed}")


@pytest.mark.oracle
@pytest.mark.parametrize("seed", (0, 2024))
def test_torch_cpu_stream_continues_torchs_generator(seed: int) -> None:
    """Draws one after another from one `NoiseStream`: each is torch's next draw from one generator, including
    the double normal a small draw leaves over for the next small one (5 then 3 elements: the 3 start with
    the cached value)."""
    torch = pytest.importorskip("torch")
    if _torch_capability(torch) not in ("AVX2", "AVX512"):
        pytest.skip(f"torch runs its {_torch_capability(torch)} kernels here; dif's default models the AVX2 one")
    draws = [((5,), "float32"), ((3,), "float64"), ((1, 16, 2, 3, 5), "float32"), ((7,), "float32"),
             ((40, 17), "float32"), ((2, 33), "float64"), ((1, 32, 3, 4, 4), "float32")]  # fmt: skip
    theirs_gen = torch.Generator("cpu").manual_seed(seed)
    stream = NoiseStream(seed, "torch-cpu")
    for shape, dtype in draws:
        theirs = torch.randn(shape, generator=theirs_gen, dtype=getattr(torch, dtype)).numpy()
        ours = stream.standard_normal(shape, dtype)
        assert ours.shape == shape and ours.dtype == np.dtype(dtype)
        if dtype == "float64":  # numpy's and libm's double log / sin / cos differ in the last bit at times
            np.testing.assert_allclose(ours, theirs, rtol=0, atol=1e-15, err_msg=f"{shape} {dtype}")
        else:
            np.testing.assert_array_equal(ours, theirs, err_msg=f"{shape} {dtype}")


@pytest.mark.oracle
def test_torch_cpu_scalar_build_within_an_ulp() -> None:
    """torch's DEFAULT build (ARM, or ATEN_CPU_CAPABILITY=default) calls libm: variant "scalar" agrees to
    an ulp (max abs <= 1e-6; most values bit-equal)."""
    pytest.importorskip("torch")
    code = (
        "import json, torch; t = torch.randn((1, 128, 16, 16), generator=torch.Generator('cpu').manual_seed(7)); "
        "print(json.dumps([torch.backends.cpu.get_cpu_capability(), t.flatten().tolist()]))"
    )
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    capability, values = json.loads(out.stdout)
    assert capability == "DEFAULT"
    theirs = np.array(values, np.float32)
    ours = torch_cpu_randn((1, 128, 16, 16), 7, np.dtype(np.float32), variant="scalar").reshape(-1)
    assert np.abs(ours - theirs).max() <= 1e-6
    assert np.mean(ours == theirs) > 0.95


@pytest.mark.oracle
def test_mt19937_matches_numpy_legacy_seeding() -> None:
    """The engine alone: numpy's RandomState(seed) seeds MT19937 the same way (init_genrand)."""
    legacy = np.random.RandomState(2024)
    np.testing.assert_array_equal(MT19937(2024).draw(2000), legacy.randint(0, 2**32, size=2000, dtype=np.uint64))


def test_philox_known_answers() -> None:
    """Random123's published Philox4x32-10 known-answer vectors."""
    cases = [
        ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
        ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
        (
            (0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344),
            (0xA4093822, 0x299F31D0),
            (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1),
        ),
    ]
    for counter, key, expected in cases:
        got = philox4x32_10(np.array([counter], np.uint32), key)[0]
        assert tuple(int(w) for w in got) == expected


def test_torch_cuda_layout_and_statistics() -> None:
    """The launch: 256-thread blocks up to 8 per SM (H200: 1056 blocks); a grid-stride round of 4 outputs
    per thread. Small tensors use element i = thread i, output 0 (r sin v of words 0, 1)."""
    assert launch_threads(100) == 256 and launch_threads(10**7) == 132 * 8 * 256
    big = torch_cuda_randn((1, 128, 64, 64), 7, np.dtype(np.float32))
    assert abs(float(big.mean())) < 5e-3 and abs(float(big.std()) - 1) < 5e-3
    small = torch_cuda_randn((300,), 7, np.dtype(np.float32))
    flat, threads = big.reshape(-1), launch_threads(big.size)
    # thread i's first output does not depend on the launch: element i of both (i < 300 threads)
    np.testing.assert_array_equal(flat[:300], small)
    # element threads + i is thread i's second output: r cos v beside r sin v of the same pair
    radius2 = flat[:300].astype(np.float64) ** 2 + flat[threads : threads + 300].astype(np.float64) ** 2
    u = (philox4x32_10(np.array([[0, 0, i, 0] for i in range(300)], np.uint32), (7, 0))[:, 0] + 0.5) * 2.0**-32
    np.testing.assert_allclose(radius2, -2 * np.log(u), rtol=1e-5, atol=1e-6)


@pytest.mark.cuda
@pytest.mark.oracle
@pytest.mark.parametrize("shape", [(7,), (300,), (1, 128, 2, 3), (1, 128, 64, 64), (1, 16, 128, 128)], ids=str)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_torch_cuda_randn_matches_the_gpu(shape: tuple[int, ...], dtype: str) -> None:
    """Against torch.Generator("cuda") on this machine's GPU (its SM count sets the launch): max abs <= 1e-5
    (float32; bf16: <= one bf16 ulp of the value, the rounding of a value within 1e-5)."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda is not available (the GPU comparison runs on the GPU machine)")
    props = torch.cuda.get_device_properties(0)
    for seed in (0, 7, 2**40 + 3):
        gen = torch.Generator("cuda").manual_seed(seed)
        theirs = torch.randn(shape, generator=gen, device="cuda", dtype=getattr(torch, dtype)).double().cpu().numpy()
        ours = torch_cuda_randn(
            shape,
            seed,
            np.dtype(getattr(ml_dtypes, dtype, dtype)),
            sms=props.multi_processor_count,
            threads_per_sm=props.max_threads_per_multi_processor,
        ).astype(np.float64)
        if dtype == "float32":
            assert np.abs(ours - theirs).max() <= 1e-5, f"seed {seed}"
        else:
            assert np.all(np.abs(ours - theirs) <= np.abs(theirs) * 2**-7 + 1e-5), f"seed {seed}"


@pytest.mark.cuda
@pytest.mark.oracle
def test_torch_cuda_stream_continues_the_gpu_generator(monkeypatch: pytest.MonkeyPatch) -> None:
    """Draws one after another from one `NoiseStream("torch-cuda")` against one torch.Generator("cuda"): the
    Philox offset advances as torch's does (a small draw, a large one spanning several grid-stride rounds,
    then a small one again): max abs <= 1e-5 each."""
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("torch.cuda is not available (the GPU comparison runs on the GPU machine)")
    props = torch.cuda.get_device_properties(0)
    monkeypatch.setenv("DIF_TORCH_CUDA_GPU", f"{props.multi_processor_count},{props.max_threads_per_multi_processor}")
    gen, stream = torch.Generator("cuda").manual_seed(11), NoiseStream(11, "torch-cuda")
    for shape in [(300,), (1, 128, 40, 40), (1, 16, 128, 128), (7,), (2, 3, 5, 7)]:
        theirs = torch.randn(shape, generator=gen, device="cuda").double().cpu().numpy()
        assert np.abs(stream.standard_normal(shape).astype(np.float64) - theirs).max() <= 1e-5, shape


def test_numpy_stream_goes_on_where_one_draw_stops() -> None:
    """NoiseStream("numpy") is one PCG64 stream: two draws are the first draw's values and the next ones."""
    whole = np.random.Generator(np.random.PCG64(5)).standard_normal(30, dtype=np.float32)
    stream = NoiseStream(5)
    np.testing.assert_array_equal(stream.standard_normal((4, 5)).reshape(-1), whole[:20])
    np.testing.assert_array_equal(stream.standard_normal((10,)), whole[20:])
    with pytest.raises(UsageError, match="unknown random generator 'mt'"):
        NoiseStream(0, "mt")


def test_numpy_stream_is_unchanged_and_bad_names_are_refused() -> None:
    expected = np.random.Generator(np.random.PCG64(3)).standard_normal((2, 5), dtype=np.float32)
    np.testing.assert_array_equal(gaussian_noise((2, 5), 3), expected)
    np.testing.assert_array_equal(standard_normal((2, 5), 3, "numpy"), expected)
    with pytest.raises(UsageError, match="(?s)unknown random generator 'mt'.*numpy, torch-cpu, torch-cuda"):
        standard_normal((4,), 0, "mt")
    with pytest.raises(UsageError, match="float64"):
        standard_normal((4,), 0, "torch-cuda", "float64")


def test_torch_cuda_gpu_shape_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """A smaller GPU launches fewer threads: a large tensor's stream changes, a small one's does not."""
    big, small = (1, 128, 64, 64), (300,)
    h200 = standard_normal(big, 7, "torch-cuda")
    monkeypatch.setenv("DIF_TORCH_CUDA_GPU", "128,1536")  # an RTX 4090
    np.testing.assert_array_equal(
        standard_normal(big, 7, "torch-cuda"),
        torch_cuda_randn(big, 7, np.dtype(np.float32), sms=128, threads_per_sm=1536),
    )
    assert not np.array_equal(standard_normal(big, 7, "torch-cuda"), h200)
    np.testing.assert_array_equal(standard_normal(small, 7, "torch-cuda"), h200.reshape(-1)[:300])
    monkeypatch.setenv("DIF_TORCH_CUDA_GPU", "lots")
    with pytest.raises(UsageError, match="DIF_TORCH_CUDA_GPU='lots'"):
        standard_normal(small, 7, "torch-cuda")
