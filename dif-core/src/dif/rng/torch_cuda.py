"""torch's CUDA generator stream in numpy: `torch.Generator("cuda").manual_seed(seed)` + `torch.randn`
on the device, without torch or a GPU (Philox4x32-10 with torch's thread layout).

Where it sits: under `dif.rng.standard_normal(..., rng="torch-cuda")`. What torch does (ATen's CUDA
`distribution_nullary_kernel`, `calc_execution_policy`; cuRAND's Philox state and Box-Muller):

- a launch of `grid` blocks of 256 threads, grid = min(ceil(n / 256), SMs * (max threads per SM / 256)):
  the result depends on the GPU's SM count (132 and 2048 threads per SM on H100 / H200);
- thread `idx` starts a Philox4x32-10 stream at counter (offset / 4, idx) [low 64 bits, high 64 bits],
  key = the 64-bit seed; a fresh generator has offset 0;
- each round of the grid-stride loop takes one 128-bit Philox output (4 words), turns words (0, 1) and
  (2, 3) into two normals each by Box-Muller (u = w0 2^-32 + 2^-33, v = w1 2^-32 2 pi + 2^-32 pi,
  r = sqrt(-2 log u): r sin v, r cos v) and writes element idx + (4 k + i) * threads for output i of
  round k;
- bf16 / f16 outputs are the float32 values rounded.

The float32 functions on the device (logf, sincosf) are within an ulp or two of the float64 values
rounded here, so the noise agrees to ~1e-6, not bit for bit (tests/test_rng_torch.py compares on a GPU).
"""

from __future__ import annotations

import math

import numpy as np

M0, M1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
W0, W1 = np.uint32(0x9E3779B9), np.uint32(0xBB67AE85)
BLOCK = 256
H200_SMS, H200_THREADS_PER_SM = 132, 2048
TWO_POW32_INV = np.float32(2.3283064e-10)
TWO_POW32_INV_2PI = np.float32(2.3283064e-10) * np.float32(6.2831855)


def philox4x32_10(counter: np.ndarray, key: tuple[int, int]) -> np.ndarray:
    """Philox4x32-10 of counters (n, 4) uint32 under `key` (k0, k1): (n, 4) uint32 (Random123's)."""
    c = [counter[:, i].astype(np.uint64) for i in range(4)]
    k0, k1 = np.uint32(key[0] & 0xFFFFFFFF), np.uint32(key[1] & 0xFFFFFFFF)
    lo32 = np.uint64(0xFFFFFFFF)
    for rnd in range(10):
        if rnd:
            k0, k1 = np.uint32((int(k0) + int(W0)) & 0xFFFFFFFF), np.uint32((int(k1) + int(W1)) & 0xFFFFFFFF)
        p0, p1 = M0 * c[0], M1 * c[2]
        c = [
            (p1 >> np.uint64(32)) ^ c[1] ^ np.uint64(k0),
            p1 & lo32,
            (p0 >> np.uint64(32)) ^ c[3] ^ np.uint64(k1),
            p0 & lo32,
        ]
    return np.stack(c, axis=1).astype(np.uint32)


def _box_muller(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cuRAND's float Box-Muller of two word arrays: (r sin v, r cos v)."""
    # w * A + B is one fused multiply-add on the device: exact product in float64, one rounding
    half, half_2pi = np.float64(TWO_POW32_INV / np.float32(2)), np.float64(TWO_POW32_INV_2PI / np.float32(2))
    u = (x.astype(np.float64) * np.float64(TWO_POW32_INV) + half).astype(np.float32)
    v = (y.astype(np.float64) * np.float64(TWO_POW32_INV_2PI) + half_2pi).astype(np.float32)
    r = np.sqrt(np.float32(-2) * np.log(u.astype(np.float64)).astype(np.float32))
    vv = v.astype(np.float64)
    return r * np.sin(vv).astype(np.float32), r * np.cos(vv).astype(np.float32)


def launch_threads(numel: int, sms: int = H200_SMS, threads_per_sm: int = H200_THREADS_PER_SM) -> int:
    """Threads of torch's normal-distribution launch for `numel` elements on a GPU with `sms` SMs."""
    grid = min(-(-numel // BLOCK), sms * (threads_per_sm // BLOCK))
    return max(grid, 1) * BLOCK


def offset_advance(numel: int, sms: int = H200_SMS, threads_per_sm: int = H200_THREADS_PER_SM) -> int:
    """How far one `torch.randn` of `numel` elements moves the generator's Philox offset: 4 words for each
    round of the grid-stride loop (ATen's `counter_offset`), so the next draw starts on fresh counters."""
    threads = launch_threads(numel, sms, threads_per_sm)
    return ((numel - 1) // (threads * 4) + 1) * 4


def torch_cuda_randn(
    shape: tuple[int, ...],
    seed: int,
    dtype: np.dtype,
    *,
    sms: int = H200_SMS,
    threads_per_sm: int = H200_THREADS_PER_SM,
    offset: int = 0,
) -> np.ndarray:
    """`torch.randn(shape, generator=torch.Generator("cuda").manual_seed(seed), device="cuda", dtype=dtype)`
    as numpy for a GPU of `sms` SMs and `threads_per_sm` (default: H100 / H200); `offset` is the
    generator's Philox offset before the call (0 after manual_seed). float32, bfloat16 or float16."""
    dtype = np.dtype(dtype)
    numel = math.prod(shape)
    threads = launch_threads(numel, sms, threads_per_sm)
    element = np.arange(numel, dtype=np.int64)
    rnd, rem = np.divmod(element, 4 * threads)
    which, idx = np.divmod(rem, threads)  # output `which` of round `rnd` of thread `idx`
    pairs = np.unique(rnd * threads + idx)  # one Philox call per (round, thread) used
    p_rnd, p_idx = np.divmod(pairs, threads)
    ctr = (p_rnd + offset // 4).astype(np.uint64)
    sub = p_idx.astype(np.uint64)  # the thread's subsequence: the counter's high 64 bits
    low = np.uint64(0xFFFFFFFF)
    counter = np.stack([ctr & low, ctr >> np.uint64(32), sub & low, sub >> np.uint64(32)], axis=1).astype(np.uint32)
    words = philox4x32_10(counter, (seed & 0xFFFFFFFF, seed >> 32))
    s0, c0 = _box_muller(words[:, 0], words[:, 1])
    s1, c1 = _box_muller(words[:, 2], words[:, 3])
    normals = np.stack([s0, c0, s1, c1], axis=1)  # (calls, 4)
    row = np.searchsorted(pairs, rnd * threads + idx)
    return normals[row, which].astype(dtype).reshape(shape)
