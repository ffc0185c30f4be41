// Shared prelude of every dif CUDA module (prepended by kernels/__init__.py; NVRTC needs no headers).
// Storage types are plain structs over their bits so no toolkit header is needed; arithmetic is fp32.

// Every kernel is declared `KERNEL_ENTRY name(...)`. By default that is an extern "C" entry point, so a whole
// module compiles every kernel of it. A program needs few of them, and NVRTC's time goes into generating
// code for each, so kernels/__init__.py compiles one kernel at a time under ONE_KERNEL_MODE: then every
// kernel is a function template, and only the one named to NVRTC (`name<0>`) is instantiated.
#ifdef ONE_KERNEL_MODE
#define KERNEL_ENTRY template <int> __global__ void
#else
#define KERNEL_ENTRY extern "C" __global__ void
#endif
typedef long long i64;
typedef unsigned long long u64;
struct bf16 { unsigned short x; };
struct f16 { unsigned short x; };
struct f8e4m3 { unsigned char x; };
struct f8e5m2 { unsigned char x; };
struct b8 { unsigned char x; };  // DiffIR bool: one byte, 0 or 1

#define DIF_INF __int_as_float(0x7f800000)
#define GRID_STRIDE(i, n) for (i64 i = (i64)blockIdx.x * blockDim.x + threadIdx.x; i < (n); i += (i64)gridDim.x * blockDim.x)

template <class T> struct is_flt { static const bool value = false; };
template <> struct is_flt<float> { static const bool value = true; };
template <> struct is_flt<f16> { static const bool value = true; };
template <> struct is_flt<bf16> { static const bool value = true; };
template <> struct is_flt<f8e4m3> { static const bool value = true; };
template <> struct is_flt<f8e5m2> { static const bool value = true; };
template <class A, class B> struct is_same_t { static const bool value = false; };
template <class A> struct is_same_t<A, A> { static const bool value = true; };

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) { return __uint_as_float(((unsigned)v.x) << 16); }
__device__ __forceinline__ float to_f(f16 v) {
  float f;
  asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(v.x));
  return f;
}
__device__ __forceinline__ float f8_to_f(unsigned char bits, bool e4m3) {
#if __CUDA_ARCH__ >= 890
  unsigned int pair;
  unsigned short in = bits;
  if (e4m3) asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(pair) : "h"(in));
  else asm("cvt.rn.f16x2.e5m2x2 %0, %1;" : "=r"(pair) : "h"(in));
  f16 h;
  h.x = (unsigned short)(pair & 0xffff);
  return to_f(h);
#else
  __trap();
  return 0.0f;
#endif
}
__device__ __forceinline__ float to_f(f8e4m3 v) { return f8_to_f(v.x, true); }
__device__ __forceinline__ float to_f(f8e5m2 v) { return f8_to_f(v.x, false); }

template <class T> __device__ __forceinline__ T from_f(float f);
template <> __device__ __forceinline__ float from_f<float>(float f) { return f; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float f) {
  bf16 r;
  asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(r.x) : "f"(f));
  return r;
}
template <> __device__ __forceinline__ f16 from_f<f16>(float f) {
  f16 r;
  asm("cvt.rn.f16.f32 %0, %1;" : "=h"(r.x) : "f"(f));
  return r;
}
__device__ __forceinline__ unsigned char f_to_f8(float f, bool e4m3) {
#if __CUDA_ARCH__ >= 890
  unsigned short pair;
  float zero = 0.0f;
  if (e4m3) asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(zero), "f"(f));
  else asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;" : "=h"(pair) : "f"(zero), "f"(f));
  return (unsigned char)(pair & 0xff);
#else
  __trap();
  return 0;
#endif
}
template <> __device__ __forceinline__ f8e4m3 from_f<f8e4m3>(float f) {
  f8e4m3 r;
  r.x = f_to_f8(f, true);
  return r;
}
template <> __device__ __forceinline__ f8e5m2 from_f<f8e5m2>(float f) {
  f8e5m2 r;
  r.x = f_to_f8(f, false);
  return r;
}

// Round a fp32 value to T's precision and back (what storing then reloading does).
template <class T> __device__ __forceinline__ float round_to(float f) { return to_f(from_f<T>(f)); }

// Quotient (left in i) and remainder of i >= 0 by n > 0; 32-bit arithmetic whenever both fit.
__device__ __forceinline__ i64 divmod(i64& i, i64 n) {
  if (((u64)i | (u64)n) <= 0xffffffffull) {
    const unsigned q = (unsigned)i / (unsigned)n;
    const i64 c = (i64)((unsigned)i - q * (unsigned)n);
    i = q;
    return c;
  }
  const i64 q = i / n, c = i - q * n;
  i = q;
  return c;
}

// Offsets of K strided operands for flat output index i. meta = [rank, shape[rank], strides_0[rank], ...].
template <int K>
__device__ __forceinline__ void bcast_offsets(i64 i, const i64* __restrict__ meta, i64* off) {
  const int r = (int)meta[0];
  if (r == 1) {  // the common case after collapsing: one contiguous or broadcast run
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] = i * meta[2 + k];
    return;
  }
#pragma unroll
  for (int k = 0; k < K; ++k) off[k] = 0;
  for (int d = r - 1; d >= 0; --d) {
    const i64 c = divmod(i, meta[1 + d]);
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] += c * meta[1 + r * (1 + k) + d];
  }
}

// Broadcast indexing with the metadata held in registers: up to MAXR (right-aligned) dims are read once per
// thread; the outermost dim takes the remaining quotient, so rank 2 costs one division per element and
// rank 1 none. Higher ranks fall back to bcast_offsets over the metadata in global memory.
#define MAXR 4
template <int K>
struct BIdx {
  int r;
  i64 shape[MAXR];
  i64 st[K][MAXR];
  const i64* meta;
  __device__ __forceinline__ explicit BIdx(const i64* __restrict__ m) : meta(m) {
    r = (int)m[0];
#pragma unroll
    for (int d = 0; d < MAXR; ++d) {
      const int src = d - (MAXR - r);
      const bool ok = r <= MAXR && src >= 0;
      shape[d] = ok ? m[1 + src] : 1;
#pragma unroll
      for (int k = 0; k < K; ++k) st[k][d] = ok ? m[1 + r * (1 + k) + src] : 0;
    }
  }
  __device__ __forceinline__ void offsets(i64 i, i64* off) const {
    if (r > MAXR) {
      bcast_offsets<K>(i, meta, off);
      return;
    }
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] = 0;
#pragma unroll
    for (int d = MAXR - 1; d >= 0; --d) {
      if (d < MAXR - r) break;
      const i64 c = d == MAXR - r ? i : divmod(i, shape[d]);
#pragma unroll
      for (int k = 0; k < K; ++k) off[k] += c * st[k][d];
    }
  }
};

// The offsets of the indices one thread visits (i0, i0 + step, i0 + 2 step, ...): for rank <= 2 the
// (row, col) position advances by a precomputed quotient/remainder, so no division per element;
// higher ranks divide as BIdx does. Call offsets() then advance() once per visited index, in order.
template <int K>
struct BWalk {
  BIdx<K> idx;
  bool simple;
  i64 row, col, ncols, dq, dr;
  __device__ __forceinline__ BWalk(const i64* __restrict__ m, i64 i0, i64 step) : idx(m) {
    simple = idx.r <= 2;
    row = col = ncols = dq = dr = 0;
    if (simple) {
      ncols = idx.shape[MAXR - 1];
      row = i0;
      col = divmod(row, ncols);
      dq = step;
      dr = divmod(dq, ncols);
    }
  }
  __device__ __forceinline__ void offsets(i64 i, i64* off) const {
    if (!simple) {
      idx.offsets(i, off);
      return;
    }
#pragma unroll
    for (int k = 0; k < K; ++k) off[k] = row * idx.st[k][MAXR - 2] + col * idx.st[k][MAXR - 1];
  }
  __device__ __forceinline__ void advance() {
    col += dr;
    row += dq;
    if (col >= ncols) {
      col -= ncols;
      ++row;
    }
  }
};
#define THREAD_FIRST ((i64)blockIdx.x * blockDim.x + threadIdx.x)
#define THREAD_STEP ((i64)gridDim.x * blockDim.x)

// Grid-stride loop handling ILP items per thread per trip, each a full coalesced stride apart:
// inside, items base + e * step for e < ILP are this thread's (check `< n` per item).
#define ILP 4
#define GRID_STRIDE_ILP(base, step, n)                                                                     \
  for (i64 step = (i64)gridDim.x * blockDim.x, base = (i64)blockIdx.x * blockDim.x + threadIdx.x; base < (n); \
       base += ILP * step)
#define ILP_FOR(e) _Pragma("unroll") for (int e = 0; e < ILP; ++e)

// 16 bytes of T (8 bf16/f16, 4 f32): the unit of the vector fast paths, one load/store instruction each.
template <class T>
struct alignas(16) C16 {
  T v[16 / sizeof(T)];
};

// One operand's values of one output chunk in a chunked broadcast (lower/base.py `chunk_broadcast`): its
// 16-byte chunk at chunk offset `off`, or, for a `scalar` operand (innermost size 1), its element `off`
// repeated.
template <class T>
__device__ __forceinline__ void load_chunk(const T* __restrict__ base, i64 off, bool scalar,
                                           float (&out)[16 / sizeof(T)]) {
  if (scalar) {
    const float v = to_f(base[off]);
#pragma unroll
    for (int e = 0; e < (int)(16 / sizeof(T)); ++e) out[e] = v;
    return;
  }
  const C16<T> c = reinterpret_cast<const C16<T>*>(base)[off];
#pragma unroll
  for (int e = 0; e < (int)(16 / sizeof(T)); ++e) out[e] = to_f(c.v[e]);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Block-wide reductions (blockDim.x a multiple of 32, <= 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  __syncthreads();  // `part` may still be read by a previous call
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < nw ? part[lane] : 0.0f;
  return warp_sum(v);
}
__device__ __forceinline__ float block_max(float v) {
  __shared__ float part[32];
  __syncthreads();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_max(v);
  if (lane == 0) part[warp] = v;
  __syncthreads();
  v = lane < nw ? part[lane] : -DIF_INF;
  return warp_max(v);
}

// Division by a divisor shared by many dividends (a row's norm denominator, its quantization scale): the
// reciprocal once, then per value a product corrected by one fused multiply-add (Markstein's correction), which
// is the correctly rounded quotient `x / d` gives for finite normal quotients. The IEEE division costs a dozen
// instructions and a test that branches to its slow path per value: the row kernels were issue-bound on it.
// A subnormal d, whose reciprocal would overflow, divides as 2^64 x / 2^64 d: both scalings are exact.
struct Divisor {
  float d, r, k;
  __device__ __forceinline__ float divisor() const { return d / k; }  // the d given (k is a power of two)
};
__device__ __forceinline__ Divisor divisor_of(float d) {
  const float k = fabsf(d) < 1.17549435e-38f ? 18446744073709551616.0f : 1.0f;
  return Divisor{d * k, 1.0f / (d * k), k};
}
__device__ __forceinline__ float operator/(float x, Divisor v) {
  const float y = x * v.k, q = y * v.r;
  return fmaf(fmaf(-q, v.d, y), v.r, q);
}
// v / scale saturated to e4m3's range and rounded to nearest even, as dif.ops.quant.quantize_with: the quantizing
// row kernels' (kernels/quant.cu) and the q / k norm's (rms_norm_rope_quant, kernels/fused.cu)
__device__ __forceinline__ f8e4m3 e4m3_at(float v, Divisor scale) {
  return from_f<f8e4m3>(fminf(fmaxf(v / scale, -448.0f), 448.0f));
}

// The statistics of a row's norm: a layer norm's mean, then the mean of its squared deviations (two passes, as
// the references take them), or an RMS norm's mean square (mean 0); the denominator is sqrt(var + eps).
// `each(f)` hands f every value of the row this thread holds, once a pass; `sum` adds a value over the threads
// that share the row (block_sum, warp_sum).
struct RowStats {
  float mu;
  Divisor denom;
};
template <class Each, class Sum>
__device__ __forceinline__ RowStats row_stats(const Each& each, const Sum& sum, i64 len, float eps, int is_rms) {
  float acc = 0.0f;
  each([&](float f) { acc += is_rms ? f * f : f; });
  float mu = 0.0f, var;
  if (is_rms) {
    var = sum(acc) / (float)len;
  } else {
    mu = sum(acc) / (float)len;
    float q = 0.0f;
    each([&](float f) {
      const float d = f - mu;
      q += d * d;
    });
    var = sum(q) / (float)len;
  }
  return RowStats{mu, divisor_of(sqrtf(var + eps))};
}
#define BLOCK_SUM [](float v) { return block_sum(v); }
#define WARP_SUM [](float v) { return warp_sum(v); }
// A warp's row x of 32 * N 16-byte chunks read into a (lane l holds chunks k * 32 + l, so every warp load covers
// 512 contiguous bytes) and its norm statistics.
template <class T, int N>
__device__ __forceinline__ RowStats warp_row_stats(const T* __restrict__ x, C16<T> (&a)[N], float eps, int is_rms) {
  constexpr int P = 16 / sizeof(T);
  const int lane = threadIdx.x & 31;
  const C16<T>* xr = reinterpret_cast<const C16<T>*>(x);
#pragma unroll
  for (int k = 0; k < N; ++k) a[k] = xr[k * 32 + lane];
  const auto each = [&](auto&& f) {
#pragma unroll
    for (int k = 0; k < N; ++k)
#pragma unroll
      for (int e = 0; e < P; ++e) f(to_f(a[k].v[e]));
  };
  return row_stats(each, WARP_SUM, 32 * N * P, eps, is_rms);
}

__device__ __forceinline__ float sigmoid_f(float x) {
  // split by sign so exp never overflows (as the reference does). The denominator lies in [1, 2], where the
  // approximate reciprocal and one correction give the correctly rounded quotient but for rare near-ties,
  // without the IEEE division's range tests
  const float e = expf(-fabsf(x)), b = 1.0f + e, n = x >= 0.0f ? 1.0f : e;
  float r;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(b));
  const float q = n * r;
  return fmaf(fmaf(-q, b, n), r, q);
}
__device__ __forceinline__ float gelu_erf_f(float x) { return 0.5f * x * (1.0f + erff(x * 0.70710678118654752f)); }
__device__ __forceinline__ float gelu_tanh_f(float x) {
  return 0.5f * x * (1.0f + tanhf(0.79788456080286536f * (x + 0.044715f * x * x * x)));
}
// The activations of the gated ops (glu_quant, act_mul, act_mul_quant) by code, as the lowerings name them:
// 0 silu, 1 gelu (erf), 2 gelu tanh (glu's), 3 sigmoid
template <int ACT>
__device__ __forceinline__ float gate_act(float v) {
  return ACT == 0 ? v * sigmoid_f(v) : (ACT == 1 ? gelu_erf_f(v) : (ACT == 2 ? gelu_tanh_f(v) : sigmoid_f(v)));
}
