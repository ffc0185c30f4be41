"""torch's CPU generator stream in numpy: `torch.Generator("cpu").manual_seed(seed)` + `torch.randn`,
without torch (MT19937 and torch's two normal-sampling layouts).

Where it sits: under `dif.rng.standard_normal(..., rng="torch-cpu")`, the initial noise of a run that
should match diffusers / ComfyUI drawing with a CPU generator. What torch does, as written in its ATen
sources (`CPUGeneratorImpl`, `DistributionTemplates.h`, `TransformationHelper.h`):

- the engine is the standard 32-bit Mersenne Twister seeded by `init_genrand(seed & 0xffffffff)`;
- a float uniform is (u32 & 0xFFFFFF) * 2^-24 (24 bits); a double uniform takes two u32 draws,
  (first << 32 | second) & (2^53 - 1), times 2^-53;
- tensors of >= 16 elements (contiguous) use the vectorized Box-Muller: float32 / float64 fill the whole
  buffer with uniforms first, then each block of 16 turns (u[j], u[j+8]), j < 8, into
  r cos(theta), r sin(theta) with r = sqrt(-2 log(1 - u[j])), theta = 2 pi u[j+8]; when 16 does not
  divide the size, 16 more uniforms recompute the last 16 elements. bf16 / f16 run the same float
  arithmetic but draw 16 uniforms per block (so their tail differs) and round each value at the end;
- smaller tensors draw one double normal per element: pairs (u1, u2) give r cos, then r sin (cached
  for the next element), r = sqrt(-2 log1p(-u2)), theta = 2 pi u1, rounded to the dtype.

The float32 Box-Muller has two builds in torch. x86 CPUs with AVX2 (AVX-512 ones too: torch's AVX-512
kernels take the same branch) run a vectorized polynomial log and sincos (Cephes' single-precision
range reduction and minimax polynomials, compiled with fused multiply-adds); that is `variant="avx2"`,
the default, bit-exact here against torch. Other CPUs (ARM, torch's DEFAULT build) call libm's logf /
cosf / sinf: `variant="scalar"` evaluates those in float64 and rounds (correctly rounded values, which
glibc returns in all but rare cases; ~1% of values then differ from torch in the last bit).
"""

from __future__ import annotations

import math

import numpy as np

N, M = 624, 397
MATRIX_A, UPPER, LOWER = np.uint32(0x9908B0DF), np.uint32(0x80000000), np.uint32(0x7FFFFFFF)
TWO_PI = 2.0 * math.pi


class MT19937:
    """The 32-bit Mersenne Twister of `torch.Generator("cpu").manual_seed(seed)` (and of C++'s
    std::mt19937 seeded with one integer); `draw(n)` returns the next n tempered uint32 outputs."""

    def __init__(self, seed: int) -> None:
        state = [int(seed) & 0xFFFFFFFF]
        for j in range(1, N):
            prev = state[-1]
            state.append((1812433253 * (prev ^ (prev >> 30)) + j) & 0xFFFFFFFF)
        self._state = np.array(state, dtype=np.uint32)
        self._pos = N  # the first draw twists

    def _twist(self) -> None:
        mt = self._state
        # element i reads mt[i+1] (not yet rewritten) and mt[(i+M) % N] (rewritten once i+M >= N):
        # three slices of at most N-M elements keep that order
        for start, stop in ((0, N - M), (N - M, 2 * (N - M)), (2 * (N - M), N - 1)):
            y = (mt[start:stop] & UPPER) | (mt[start + 1 : stop + 1] & LOWER)
            ahead = np.arange(start, stop) + M
            mt[start:stop] = mt[ahead % N] ^ (y >> np.uint32(1)) ^ ((y & np.uint32(1)) * MATRIX_A)
        y = (mt[N - 1] & UPPER) | (mt[0] & LOWER)
        mt[N - 1] = mt[M - 1] ^ (y >> np.uint32(1)) ^ ((y & np.uint32(1)) * MATRIX_A)
        self._pos = 0

    def draw(self, count: int) -> np.ndarray:
        """The next `count` outputs, (count,) uint32."""
        out = np.empty(count, dtype=np.uint32)
        filled = 0
        while filled < count:
            if self._pos == N:
                self._twist()
            take = min(count - filled, N - self._pos)
            out[filled : filled + take] = self._state[self._pos : self._pos + take]
            self._pos += take
            filled += take
        y = out
        y ^= y >> np.uint32(11)
        y ^= (y << np.uint32(7)) & np.uint32(0x9D2C5680)
        y ^= (y << np.uint32(15)) & np.uint32(0xEFC60000)
        y ^= y >> np.uint32(18)
        return y


def _uniform_f32(gen: MT19937, count: int) -> np.ndarray:
    return (gen.draw(count) & np.uint32(0xFFFFFF)).astype(np.float32) * np.float32(2.0**-24)


def _uniform_f64(gen: MT19937, count: int) -> np.ndarray:
    words = gen.draw(2 * count).astype(np.uint64)
    bits = ((words[0::2] << np.uint64(32)) | words[1::2]) & np.uint64((1 << 53) - 1)
    return bits.astype(np.float64) * 2.0**-53


def _fma(a: np.ndarray, b: np.ndarray | np.float32, c: np.ndarray | np.float32) -> np.ndarray:
    """a * b + c rounded once to float32 (the product of two float32 values is exact in float64)."""
    return (np.asarray(a, np.float64) * np.float64(b) + np.asarray(c, np.float64)).astype(np.float32)


F = np.float32
LOG_POLY: tuple[float, ...] = (7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1)
LOG_POLY += (1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1, 3.3333331174e-1)
LN2_HI, LN2_LO = 0.693359375, -2.12194440e-4  # ln 2 split so e * LN2_HI is exact
SQRT_HALF = 0.707106781186547524
FOUR_OVER_PI = 1.27323954473516
PI4_PARTS = (-0.78515625, -2.4187564849853515625e-4, -3.77489497744594108e-8)  # -pi/4 in three parts
COS_POLY = (2.443315711809948e-5, -1.388731625493765e-3, 4.166664568298827e-2)
SIN_POLY = (-1.9515295891e-4, 8.3321608736e-3, -1.6666654611e-1)


def _log_avx2(x: np.ndarray) -> np.ndarray:
    """log of positive normal float32 `x` as torch's AVX2 kernel computes it: x = m 2^e, m in
    [sqrt(1/2), sqrt(2)), log(m) by a degree-9 polynomial in m - 1, plus e ln 2 in two parts."""
    bits = x.view(np.int32)
    e = ((bits >> 23) - 0x7F).astype(F) + F(1)
    m = ((bits & ~0x7F800000) | 0x3F000000).view(F)  # mantissa in [0.5, 1)
    small = m < F(SQRT_HALF)
    e = e - np.where(small, F(1), F(0))
    r = (m - F(1)) + np.where(small, m, F(0))
    z = r * r
    y = np.full_like(r, F(LOG_POLY[0]))
    for coeff in LOG_POLY[1:]:
        y = _fma(y, r, F(coeff))
    y = _fma(y * r, z, e * F(LN2_LO))  # the compiler fuses these two (measured: the other pairing is off)
    y = y - z * F(0.5)
    return _fma(e, F(LN2_HI), r + y)


def _sincos_avx2(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(sin, cos) of non-negative float32 `x` as torch's AVX2 kernel computes them: reduced by the
    nearest even multiple j of pi/4 (in three parts), a cosine and a sine polynomial on the remainder,
    chosen and signed by j."""
    j = (x * F(FOUR_OVER_PI)).astype(np.int32)
    j = (j + 1) & ~1
    y = j.astype(F)
    r = x
    for part in PI4_PARTS:
        r = _fma(y, F(part), r)
    z = r * r
    yc = np.full_like(r, F(COS_POLY[0]))
    for coeff in COS_POLY[1:]:
        yc = _fma(yc, z, F(coeff))
    yc = yc * z
    yc = (np.asarray(yc, np.float64) * z.astype(np.float64) - (z * F(0.5)).astype(np.float64)).astype(F)
    yc = yc + F(1)
    ys = np.full_like(r, F(SIN_POLY[0]))
    for coeff in SIN_POLY[1:]:
        ys = _fma(ys, z, F(coeff))
    ys = _fma(ys * z, r, r)
    first = (j & 2) == 0
    sin, cos = np.where(first, ys, yc), np.where(first, yc, ys)
    sin = np.where((j & 4) != 0, -sin, sin)
    cos = np.where((~(j - 2) & 4) != 0, -cos, cos)
    return sin, cos


def _box_muller_16(u: np.ndarray, variant: str) -> np.ndarray:
    """Blocks (k, 16) of uniforms -> normals, torch's `NormalFill16` in u's dtype."""
    ct = u.dtype.type
    u1, u2 = ct(1) - u[:, :8], u[:, 8:]
    if ct is np.float32 and variant == "avx2":
        radius = np.sqrt(F(-2) * _log_avx2(u1))
        sin, cos = _sincos_avx2(F(TWO_PI) * u2)
    elif ct is np.float32:
        radius = np.sqrt(F(-2) * np.log(u1.astype(np.float64)).astype(F))
        theta = (TWO_PI * u2.astype(np.float64)).astype(F).astype(np.float64)
        sin, cos = np.sin(theta).astype(F), np.cos(theta).astype(F)
    else:
        radius = np.sqrt(-2.0 * np.log(u1))
        theta = TWO_PI * u2
        sin, cos = np.sin(theta), np.cos(theta)
    return np.concatenate([radius * cos, radius * sin], axis=1)


VARIANTS = ("avx2", "scalar")


class TorchCpuGenerator:
    """One `torch.Generator("cpu").manual_seed(seed)` drawn from again and again: `randn(shape, dtype)` is
    the next `torch.randn(shape, generator=g, dtype=dtype)`, so a pipeline that draws several tensors from
    one generator (H3: conditioning, then video, then audio noise) gets torch's values for each. The engine
    advances exactly as torch's does, and the double normal a small draw leaves over is kept for the next
    small draw (torch's `next_double_normal_sample`); `variant` is the float32 build (`VARIANTS`)."""

    def __init__(self, seed: int, *, variant: str = "avx2") -> None:
        self._engine = MT19937(seed)
        self._variant = variant
        self._cached_normal: float | None = None

    def randn(self, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        dtype = np.dtype(dtype)
        size = math.prod(shape)
        flat = self._scalar_normals(size) if size < 16 else self._normal_fill(size, dtype)
        if size < 16 and dtype.itemsize < 4:
            flat = flat.astype(np.float32)
        return flat.astype(dtype).reshape(shape)

    def _scalar_normals(self, size: int) -> np.ndarray:
        """Tensors under 16 elements: one double normal each, the pair's second value kept for the next."""
        out = np.empty(size, dtype=np.float64)
        for i in range(size):
            if self._cached_normal is not None:
                out[i], self._cached_normal = self._cached_normal, None
                continue
            u1, u2 = _uniform_f64(self._engine, 2)
            radius = math.sqrt(-2.0 * math.log1p(-u2))
            theta = TWO_PI * u1
            out[i], self._cached_normal = radius * math.cos(theta), radius * math.sin(theta)
        return out

    def _normal_fill(self, size: int, dtype: np.dtype) -> np.ndarray:
        opmath = np.float64 if dtype == np.float64 else np.float32
        uniform = _uniform_f64 if opmath is np.float64 else _uniform_f32
        blocks = size // 16
        # float / double draw all uniforms first (into the output buffer); bf16 / f16 draw 16 per block
        data = uniform(self._engine, size if dtype.itemsize >= 4 else blocks * 16)
        out = np.empty(size, dtype=opmath)
        out[: blocks * 16] = _box_muller_16(data[: blocks * 16].reshape(blocks, 16), self._variant).reshape(-1)
        if size % 16:
            out[size - 16 :] = _box_muller_16(uniform(self._engine, 16).reshape(1, 16), self._variant).reshape(-1)
        return out


def torch_cpu_randn(shape: tuple[int, ...], seed: int, dtype: np.dtype, *, variant: str = "avx2") -> np.ndarray:
    """`torch.randn(shape, generator=torch.Generator("cpu").manual_seed(seed), dtype=dtype)` as numpy,
    `dtype` float32, float64, bfloat16 or float16 (ml_dtypes); `variant` the float32 build (`VARIANTS`)."""
    return TorchCpuGenerator(seed, variant=variant).randn(shape, dtype)
