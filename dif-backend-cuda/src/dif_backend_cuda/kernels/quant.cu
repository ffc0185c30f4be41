// Quantized ops (dif.ops.quant), made by the format passes: per-row quantization fused into the producer of a
// W8A8 GEMM's input (norm_modulate_quant), the epilogue of the cuBLASLt int8 GEMM, and portable tile GEMMs
// (gemm_tile.cuh) for scaled_linear without cuBLASLt and for int4_linear, which dequantizes its weights inside
// the GEMM's tile loads (never in a separate pass over the weights).
// Quantized storage: f8e4m3 (common.cuh) or i8 (signed char). Arithmetic in fp32, as the references.
typedef signed char i8;

__device__ __forceinline__ float qmax_of(const f8e4m3*) { return 448.0f; }
__device__ __forceinline__ float qmax_of(const i8*) { return 127.0f; }
__device__ __forceinline__ float to_f(i8 v) { return (float)v; }

// q = saturate(round_even(v / scale)), as dif.ops.quant.quantize_with (scale a row's: common.cuh Divisor)
__device__ __forceinline__ void qstore(f8e4m3* q, i64 j, float v, Divisor scale) { q[j] = e4m3_at(v, scale); }
__device__ __forceinline__ void qstore(i8* q, i64 j, float v, Divisor scale) {
  q[j] = (i8)__float2int_rn(fminf(fmaxf(v / scale, -127.0f), 127.0f));
}

__device__ __forceinline__ float row_scale(float amax, float qmax) { return amax > 0.0f ? amax / qmax : 1.0f; }

// The end of a block-per-row kernel that staged its row in shared memory (buf, each thread its own entries): the
// row's scale from the threads' amax, then the quantized row and the scale written.
template <class Q>
__device__ __forceinline__ void quantize_staged_row(const float* buf, Q* __restrict__ q, float* __restrict__ s,
                                                    i64 len, float amax) {
  const Divisor scale = divisor_of(row_scale(block_max(amax), qmax_of(q)));
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) qstore(q, j, buf[j], scale);
  if (threadIdx.x == 0) *s = scale.divisor();
}

// ---- quantize_rows: one block per row (the op table's standalone form; the passes never emit it) ----------
template <class T, class Q>
__device__ __forceinline__ void quantize_rows_impl(const T* __restrict__ x, Q* __restrict__ q, float* __restrict__ s,
                                                   i64 len) {
  const i64 row = blockIdx.x;
  const T* xr = x + row * len;
  float amax = 0.0f;
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) amax = fmaxf(amax, fabsf(to_f(xr[j])));
  const Divisor scale = divisor_of(row_scale(block_max(amax), qmax_of(q)));
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) qstore(q + row * len, j, to_f(xr[j]), scale);
  if (threadIdx.x == 0) s[row] = scale.divisor();
}
#define QUANTIZE_ROWS(TN, QN)                                                                              \
  KERNEL_ENTRY quantize_rows_##TN##_##QN(const TN* __restrict__ x, QN* __restrict__ q, float* __restrict__ s, \
                                         i64 len) {                                                        \
    quantize_rows_impl<TN, QN>(x, q, s, len);                                                              \
  }

// ---- norm_modulate_quant: one block per row, the row staged in dynamic shared memory (len floats) ---------
// meta = [r, lead shape[r], scale strides[r], shift strides[r]] as norm_modulate's (lower/fused.py).
__device__ __forceinline__ void quant_lead_offsets(i64 row, const i64* __restrict__ m, i64& so, i64& to) {
  const int r = (int)m[0];
  so = to = 0;
  for (int d = r - 1; d >= 0; --d) {
    const i64 idx = divmod(row, m[1 + d]);
    so += idx * m[1 + r + d];
    to += idx * m[1 + 2 * r + d];
  }
}

// rms_norm_modulate_quant runs these kernels with the norm's weight w (and its offset): the normalized value
// times (w + offset) before it is rounded, as rms_norm stores it; norm_modulate_quant passes no weight.
template <class T, class W, class Q>
__device__ __forceinline__ void norm_modulate_quant_impl(const T* __restrict__ x, const T* __restrict__ sc,
                                                         const T* __restrict__ sh, Q* __restrict__ q,
                                                         float* __restrict__ s, const i64* __restrict__ meta,
                                                         i64 len, i64 s_last, i64 t_last, float eps, int is_rms,
                                                         const W* __restrict__ w, float w_offset) {
  extern __shared__ float buf[];
  const i64 row = blockIdx.x;
  const T* xr = x + row * len;
  i64 so, to;
  quant_lead_offsets(row, meta, so, to);
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) buf[j] = to_f(xr[j]);  // each thread its own entries
  const auto each = [&](auto&& f) {
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) f(buf[j]);
  };
  const RowStats st = row_stats(each, BLOCK_SUM, len, eps, is_rms);
  const float mu = st.mu;
  const Divisor denom = st.denom;
  float amax = 0.0f;
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
    const float d = (buf[j] - mu) / denom;
    const float n = round_to<T>(w ? d * (to_f(w[j]) + w_offset) : d);  // the norm's value as the unfused pair stores it
    const float y = round_to<T>(n * (1.0f + to_f(sc[so + j * s_last])) + to_f(sh[to + j * t_last]));
    buf[j] = y;  // each thread rereads only its own entries: no barrier needed before the next loop
    amax = fmaxf(amax, fabsf(y));
  }
  quantize_staged_row(buf, q + row * len, s + row, len, amax);
}
#define NORM_MODULATE_QUANT(TN, QN)                                                                        \
  KERNEL_ENTRY norm_modulate_quant_##TN##_##QN(const TN* __restrict__ x, const TN* __restrict__ sc,        \
                                               const TN* __restrict__ sh, QN* __restrict__ q,              \
                                               float* __restrict__ s, const i64* __restrict__ meta, i64 len, \
                                               i64 s_last, i64 t_last, float eps, int is_rms) {             \
    norm_modulate_quant_impl<TN, TN, QN>(x, sc, sh, q, s, meta, len, s_last, t_last, eps, is_rms, nullptr, 0.0f); \
  }
#define RMS_NORM_MODULATE_QUANT(TN, WN, QN)                                                                \
  KERNEL_ENTRY rms_norm_modulate_quant_##TN##_##WN##_##QN(                                                 \
      const TN* __restrict__ x, const WN* __restrict__ w, const TN* __restrict__ sc, const TN* __restrict__ sh, \
      QN* __restrict__ q, float* __restrict__ s, const i64* __restrict__ meta, i64 len, i64 s_last, i64 t_last, \
      float eps, float w_offset) {                                                                          \
    norm_modulate_quant_impl<TN, WN, QN>(x, sc, sh, q, s, meta, len, s_last, t_last, eps, 1, w, w_offset);  \
  }

// ---- the same two ops with each row in registers: 16-byte loads of 8 half-precision values, one read of the row,
// 8-byte stores of the quantized values. One block per row, each thread owning up to ROW_CHUNKS chunks of 8
// (chunk c = threadIdx.x + i * blockDim.x); the row must be a multiple of 8 long and 16-byte aligned (the
// lowering checks, else the kernels above run). The arithmetic is theirs, value for value.
#define ROW_CHUNKS 4
template <class T>
__device__ __forceinline__ void load8(const T* __restrict__ p, float* v) {
  const uint4 raw = *reinterpret_cast<const uint4*>(p);
  const unsigned w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    T lo, hi;
    lo.x = (unsigned short)(w[e] & 0xffffu);
    hi.x = (unsigned short)(w[e] >> 16);
    v[2 * e] = to_f(lo);
    v[2 * e + 1] = to_f(hi);
  }
}
__device__ __forceinline__ void load8(const float* __restrict__ p, float* v) {  // 8 floats, 16-byte aligned
  const float4 lo = reinterpret_cast<const float4*>(p)[0], hi = reinterpret_cast<const float4*>(p)[1];
  v[0] = lo.x, v[1] = lo.y, v[2] = lo.z, v[3] = lo.w, v[4] = hi.x, v[5] = hi.y, v[6] = hi.z, v[7] = hi.w;
}
__device__ __forceinline__ unsigned char qbits(const f8e4m3*, float v, Divisor scale) { return e4m3_at(v, scale).x; }
__device__ __forceinline__ unsigned char qbits(const i8*, float v, Divisor scale) {
  return (unsigned char)(i8)__float2int_rn(fminf(fmaxf(v / scale, -127.0f), 127.0f));
}
template <class Q>
__device__ __forceinline__ void store8(Q* __restrict__ q, const float* v, Divisor scale) {
  unsigned w[2] = {0u, 0u};
#pragma unroll
  for (int e = 0; e < 8; ++e) w[e >> 2] |= (unsigned)qbits(q, v[e], scale) << (8 * (e & 3));
  *reinterpret_cast<uint2*>(q) = make_uint2(w[0], w[1]);
}
#define ROW_CHUNK_FOR(i, c, nch)                                                                           \
  _Pragma("unroll") for (int i = 0, c = threadIdx.x; i < ROW_CHUNKS; ++i, c += blockDim.x) if (c < (nch))

template <class T, class Q>
__device__ __forceinline__ void quantize_rows_vec_impl(const T* __restrict__ x, Q* __restrict__ q,
                                                       float* __restrict__ s, i64 len) {
  const i64 row = blockIdx.x;
  const int nch = (int)(len >> 3);
  float v[ROW_CHUNKS][8];
  float amax = 0.0f;
  ROW_CHUNK_FOR(i, c, nch) {
    load8(x + row * len + 8 * c, v[i]);
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[i][e]));
  }
  const Divisor scale = divisor_of(row_scale(block_max(amax), qmax_of(q)));
  ROW_CHUNK_FOR(i, c, nch) store8(q + row * len + 8 * c, v[i], scale);
  if (threadIdx.x == 0) s[row] = scale.divisor();
}

template <class T, class W, class Q>
__device__ __forceinline__ void norm_modulate_quant_vec_impl(const T* __restrict__ x, const T* __restrict__ sc,
                                                             const T* __restrict__ sh, Q* __restrict__ q,
                                                             float* __restrict__ s, const i64* __restrict__ meta,
                                                             i64 len, float eps, int is_rms,
                                                             const W* __restrict__ w, float w_offset) {
  const i64 row = blockIdx.x;
  const int nch = (int)(len >> 3);
  i64 so, to;
  quant_lead_offsets(row, meta, so, to);
  float v[ROW_CHUNKS][8];
  ROW_CHUNK_FOR(i, c, nch) load8(x + row * len + 8 * c, v[i]);
  const auto each = [&](auto&& f) {
    ROW_CHUNK_FOR(i, c, nch) {
#pragma unroll
      for (int e = 0; e < 8; ++e) f(v[i][e]);
    }
  };
  const RowStats st = row_stats(each, BLOCK_SUM, len, eps, is_rms);
  const float mu = st.mu;
  const Divisor denom = st.denom;
  float amax = 0.0f;
  ROW_CHUNK_FOR(i, c, nch) {
    float a[8], b[8], g[8];
    load8(sc + so + 8 * c, a);
    load8(sh + to + 8 * c, b);
    if (w) load8(w + 8 * c, g);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float d = (v[i][e] - mu) / denom;
      const float n = round_to<T>(w ? d * (g[e] + w_offset) : d);  // the norm's value as the unfused pair stores it
      v[i][e] = round_to<T>(n * (1.0f + a[e]) + b[e]);
      amax = fmaxf(amax, fabsf(v[i][e]));
    }
  }
  const Divisor scale = divisor_of(row_scale(block_max(amax), qmax_of(q)));
  ROW_CHUNK_FOR(i, c, nch) store8(q + row * len + 8 * c, v[i], scale);
  if (threadIdx.x == 0) s[row] = scale.divisor();
}
// norm_modulate_quant with one warp per row (as norm_modulate_warp<N> in fused.cu): rows of len = 256 * N
// half-precision values, N 16-byte chunks per lane, lane-interleaved so every warp load covers 512 contiguous
// bytes. Every statistic, the amax included, is a warp reduction: no shared memory and no block barrier, so a
// block holds independent rows, one a warp (the block-per-row kernel above waits on three block reductions a
// row, and at 79 registers a thread few of its blocks fit an SM). The modulated row is kept in storage precision, which
// is exact: the unfused pair rounds it there. x, scale, shift 16-byte aligned and contiguous in the row, q 8-.
template <class T, class Q, int N>
__device__ __forceinline__ void norm_modulate_quant_warp_impl(const T* __restrict__ x, const T* __restrict__ sc,
                                                              const T* __restrict__ sh, Q* __restrict__ q,
                                                              float* __restrict__ s, const i64* __restrict__ meta,
                                                              i64 rows, float eps, int is_rms) {
  static_assert(sizeof(T) == 2, "a chunk is 8 half-precision values");
  constexpr i64 len = 256 * N;
  const int lane = threadIdx.x & 31;
  const i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warps leave together: the shuffles below stay warp-uniform
  C16<T> a[N];
  const RowStats st = warp_row_stats(x + row * len, a, eps, is_rms);
  const float mu = st.mu;
  const Divisor denom = st.denom;
  i64 so, to;
  quant_lead_offsets(row, meta, so, to);
  const C16<T>* sr = reinterpret_cast<const C16<T>*>(sc + so);
  const C16<T>* tr = reinterpret_cast<const C16<T>*>(sh + to);
  float amax = 0.0f;
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const C16<T> ks = sr[k * 32 + lane], kt = tr[k * 32 + lane];
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const float n = round_to<T>((to_f(a[k].v[e]) - mu) / denom);  // the norm's value as the unfused pair stores it
      a[k].v[e] = from_f<T>(n * (1.0f + to_f(ks.v[e])) + to_f(kt.v[e]));
      amax = fmaxf(amax, fabsf(to_f(a[k].v[e])));
    }
  }
  const Divisor scale = divisor_of(row_scale(warp_max(amax), qmax_of(q)));
#pragma unroll
  for (int k = 0; k < N; ++k) {
    float v[8];
#pragma unroll
    for (int e = 0; e < 8; ++e) v[e] = to_f(a[k].v[e]);
    store8(q + row * len + 8 * (k * 32 + lane), v, scale);
  }
  if (lane == 0) s[row] = scale.divisor();
}
#define NORM_MODULATE_QUANT_WARP(TN, QN, N)                                                                \
  KERNEL_ENTRY norm_modulate_quant_warp##N##_##TN##_##QN(const TN* __restrict__ x, const TN* __restrict__ sc, \
                                                         const TN* __restrict__ sh, QN* __restrict__ q,    \
                                                         float* __restrict__ s, const i64* __restrict__ meta, \
                                                         i64 rows, float eps, int is_rms) {                \
    norm_modulate_quant_warp_impl<TN, QN, N>(x, sc, sh, q, s, meta, rows, eps, is_rms);                    \
  }
#define NORM_MODULATE_QUANT_WARPS(TN, QN)                                                                  \
  NORM_MODULATE_QUANT_WARP(TN, QN, 4) NORM_MODULATE_QUANT_WARP(TN, QN, 8) NORM_MODULATE_QUANT_WARP(TN, QN, 12) \
  NORM_MODULATE_QUANT_WARP(TN, QN, 16)
// rms_norm_modulate_quant over half-precision rows: its weight in the rows' dtype or in f32, either quantized type
#define RMS_NORM_MODULATE_QUANT_HALVES(M)                                                                  \
  M(f16, f16, f8e4m3) M(f16, f32, f8e4m3) M(bf16, bf16, f8e4m3) M(bf16, f32, f8e4m3)                       \
  M(f16, f16, i8) M(f16, f32, i8) M(bf16, bf16, i8) M(bf16, f32, i8)
#define ROW_QUANT_VEC(TN, QN)                                                                              \
  KERNEL_ENTRY quantize_rows_vec_##TN##_##QN(const TN* __restrict__ x, QN* __restrict__ q,                 \
                                             float* __restrict__ s, i64 len) {                             \
    quantize_rows_vec_impl<TN, QN>(x, q, s, len);                                                          \
  }                                                                                                        \
  KERNEL_ENTRY norm_modulate_quant_vec_##TN##_##QN(const TN* __restrict__ x, const TN* __restrict__ sc,    \
                                                   const TN* __restrict__ sh, QN* __restrict__ q,          \
                                                   float* __restrict__ s, const i64* __restrict__ meta,    \
                                                   i64 len, float eps, int is_rms) {                       \
    norm_modulate_quant_vec_impl<TN, TN, QN>(x, sc, sh, q, s, meta, len, eps, is_rms, nullptr, 0.0f);      \
  }
#define RMS_NORM_MODULATE_QUANT_VEC(TN, WN, QN)                                                            \
  KERNEL_ENTRY rms_norm_modulate_quant_vec_##TN##_##WN##_##QN(                                             \
      const TN* __restrict__ x, const WN* __restrict__ w, const TN* __restrict__ sc, const TN* __restrict__ sh, \
      QN* __restrict__ q, float* __restrict__ s, const i64* __restrict__ meta, i64 len, float eps,          \
      float w_offset) {                                                                                     \
    norm_modulate_quant_vec_impl<TN, WN, QN>(x, sc, sh, q, s, meta, len, eps, 1, w, w_offset);             \
  }

// ---- glu_quant / concat_glu_quant: one block per row of y[rows, p + h] = [prefix[rows, p], glu(x[rows, 2h])]
// (p = 0 for glu_quant), the row staged in dynamic shared memory (p + h floats). The prefix's and x's rows are
// pp and xp elements apart (pitched views: x a part of a fused projection's output, which then is not copied).
template <int ACT, class T>
__device__ __forceinline__ float quant_glu(float a, float b, int gate_first) {  // the value glu stores, as float
  return round_to<T>(gate_first ? gate_act<ACT>(a) * b : a * gate_act<ACT>(b));
}
template <int ACT, class T, class Q>
__device__ __forceinline__ void glu_quant_impl(const T* __restrict__ prefix, i64 p, const T* __restrict__ x,
                                               Q* __restrict__ q, float* __restrict__ s, i64 h, int gate_first,
                                               i64 pp, i64 xp) {
  extern __shared__ float buf[];
  const i64 row = blockIdx.x, len = p + h;
  const T* xr = x + row * xp;
  float amax = 0.0f;
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
    const float y =
        j < p ? to_f(prefix[row * pp + j]) : quant_glu<ACT, T>(to_f(xr[j - p]), to_f(xr[h + j - p]), gate_first);
    buf[j] = y;  // each thread rereads only its own entries
    amax = fmaxf(amax, fabsf(y));
  }
  quantize_staged_row(buf, q + row * len, s + row, len, amax);
}
// The same with the row in registers (as the *_vec_* kernels above: p and h multiples of 8, 16-byte aligned).
template <int ACT, class T, class Q>
__device__ __forceinline__ void glu_quant_vec_impl(const T* __restrict__ prefix, i64 p, const T* __restrict__ x,
                                                   Q* __restrict__ q, float* __restrict__ s, i64 h, int gate_first,
                                                   i64 pp, i64 xp) {
  const i64 row = blockIdx.x, len = p + h;
  const int nch = (int)(len >> 3), pch = (int)(p >> 3);
  const T* xr = x + row * xp;
  float v[ROW_CHUNKS][8];
  float amax = 0.0f;
  ROW_CHUNK_FOR(i, c, nch) {
    if (c < pch) {
      load8(prefix + row * pp + 8 * c, v[i]);
    } else {
      float a[8], b[8];
      load8(xr + 8 * (c - pch), a);
      load8(xr + h + 8 * (c - pch), b);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[i][e] = quant_glu<ACT, T>(a[e], b[e], gate_first);
    }
#pragma unroll
    for (int e = 0; e < 8; ++e) amax = fmaxf(amax, fabsf(v[i][e]));
  }
  const Divisor scale = divisor_of(row_scale(block_max(amax), qmax_of(q)));
  ROW_CHUNK_FOR(i, c, nch) store8(q + row * len + 8 * c, v[i], scale);
  if (threadIdx.x == 0) s[row] = scale.divisor();
}
#define GLU_QUANT(ACTN, ACT, TN, QN)                                                                       \
  KERNEL_ENTRY glu_quant_##ACTN##_##TN##_##QN(const TN* __restrict__ prefix, i64 p, const TN* __restrict__ x, \
                                              QN* __restrict__ q, float* __restrict__ s, i64 h, int gate_first, \
                                              i64 pp, i64 xp) {                                            \
    glu_quant_impl<ACT, TN, QN>(prefix, p, x, q, s, h, gate_first, pp, xp);                                \
  }
#define GLU_QUANT_VEC(ACTN, ACT, TN, QN)                                                                   \
  KERNEL_ENTRY glu_quant_vec_##ACTN##_##TN##_##QN(const TN* __restrict__ prefix, i64 p,                    \
                                                  const TN* __restrict__ x, QN* __restrict__ q,            \
                                                  float* __restrict__ s, i64 h, int gate_first, i64 pp,    \
                                                  i64 xp) {                                                \
    glu_quant_vec_impl<ACT, TN, QN>(prefix, p, x, q, s, h, gate_first, pp, xp);                            \
  }
// ---- act_mul_quant: y[rows, len] = rnd(rnd(act(g)) * u), quantized per row; the activation and the product
// rounded to the storage type where the unfused act and mul store them. One block per row, the row staged in
// dynamic shared memory (len floats), or (the _vec_ kernels, as glu_quant's) held in registers.
template <int ACT, class T>
__device__ __forceinline__ float quant_act_mul(float g, float u) {
  return round_to<T>(round_to<T>(gate_act<ACT>(g)) * u);
}
template <int ACT, class T, class Q>
__device__ __forceinline__ void act_mul_quant_impl(const T* __restrict__ g, const T* __restrict__ u,
                                                   Q* __restrict__ q, float* __restrict__ s, i64 len) {
  extern __shared__ float buf[];
  const i64 row = blockIdx.x;
  float amax = 0.0f;
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
    const float y = quant_act_mul<ACT, T>(to_f(g[row * len + j]), to_f(u[row * len + j]));
    buf[j] = y;  // each thread rereads only its own entries
    amax = fmaxf(amax, fabsf(y));
  }
  quantize_staged_row(buf, q + row * len, s + row, len, amax);
}
template <int ACT, class T, class Q>
__device__ __forceinline__ void act_mul_quant_vec_impl(const T* __restrict__ g, const T* __restrict__ u,
                                                       Q* __restrict__ q, float* __restrict__ s, i64 len) {
  const i64 row = blockIdx.x;
  const int nch = (int)(len >> 3);
  float v[ROW_CHUNKS][8];
  float amax = 0.0f;
  ROW_CHUNK_FOR(i, c, nch) {
    float a[8];
    load8(g + row * len + 8 * c, a);
    load8(u + row * len + 8 * c, v[i]);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      v[i][e] = quant_act_mul<ACT, T>(a[e], v[i][e]);
      amax = fmaxf(amax, fabsf(v[i][e]));
    }
  }
  const Divisor scale = divisor_of(row_scale(block_max(amax), qmax_of(q)));
  ROW_CHUNK_FOR(i, c, nch) store8(q + row * len + 8 * c, v[i], scale);
  if (threadIdx.x == 0) s[row] = scale.divisor();
}
#define ACT_MUL_QUANT(ACTN, ACT, TN, QN)                                                                   \
  KERNEL_ENTRY act_mul_quant_##ACTN##_##TN##_##QN(const TN* __restrict__ g, const TN* __restrict__ u,      \
                                                  QN* __restrict__ q, float* __restrict__ s, i64 len) {    \
    act_mul_quant_impl<ACT, TN, QN>(g, u, q, s, len);                                                      \
  }
#define ACT_MUL_QUANT_VEC(ACTN, ACT, TN, QN)                                                               \
  KERNEL_ENTRY act_mul_quant_vec_##ACTN##_##TN##_##QN(const TN* __restrict__ g, const TN* __restrict__ u,  \
                                                      QN* __restrict__ q, float* __restrict__ s, i64 len) { \
    act_mul_quant_vec_impl<ACT, TN, QN>(g, u, q, s, len);                                                  \
  }
#define ACT_MUL_QUANT_ALL(TN, QN) ACT_MUL_QUANT(silu, 0, TN, QN) ACT_MUL_QUANT(sigmoid, 3, TN, QN)
#define ACT_MUL_QUANT_VEC_ALL(TN, QN) ACT_MUL_QUANT_VEC(silu, 0, TN, QN) ACT_MUL_QUANT_VEC(sigmoid, 3, TN, QN)
#define GLU_QUANT_ALL(TN, QN) GLU_QUANT(silu, 0, TN, QN) GLU_QUANT(gelu, 1, TN, QN) GLU_QUANT(gelu_tanh, 2, TN, QN)
#define GLU_QUANT_VEC_ALL(TN, QN)                                                                          \
  GLU_QUANT_VEC(silu, 0, TN, QN) GLU_QUANT_VEC(gelu, 1, TN, QN) GLU_QUANT_VEC(gelu_tanh, 2, TN, QN)

// ---- the scaled epilogue: y[r, c] = acc[r, c] * xs[r] * ws[c] (+ bias[c]), rows of `out`; acc int32 or fp32 ------
template <class A, class O>
__device__ __forceinline__ void scaled_epilogue_impl(const A* __restrict__ acc, const float* __restrict__ xs,
                                                     const float* __restrict__ ws, const O* __restrict__ bias,
                                                     O* __restrict__ y, i64 rows, i64 out) {
  const i64 n = rows * out;
  GRID_STRIDE(i, n) {
    const i64 r = i / out, c = i - r * out;
    float v = (float)acc[i] * xs[r] * ws[c];
    if (bias != nullptr) v += to_f(bias[c]);
    y[i] = from_f<O>(v);
  }
}
#define SCALED_EPILOGUE(AN, AT, ON)                                                                        \
  KERNEL_ENTRY scaled_epilogue_##AN##_##ON(const AT* __restrict__ acc, const float* __restrict__ xs,       \
                                           const float* __restrict__ ws, const ON* __restrict__ bias,       \
                                           ON* __restrict__ y, i64 rows, i64 out) {                         \
    scaled_epilogue_impl<AT, ON>(acc, xs, ws, bias, y, rows, out);                                         \
  }

// ---- scaled_linear_gated_residual: the gate (one for every row) into the fp8 GEMM's output-channel scales and
// bias, whose C is the residual: wsg[c] = ws[c] * gate[c], bg[c] = bias[c] * gate[c] in the output dtype
// (cuBLASLt's bias type), written each run before the GEMM reads them ------------------------------------------
template <class T>
__device__ __forceinline__ void gate_channels_impl(const float* __restrict__ ws, const T* __restrict__ gate,
                                                   const T* __restrict__ bias, float* __restrict__ wsg,
                                                   T* __restrict__ bg, i64 out) {
  GRID_STRIDE(c, out) {
    const float g = to_f(gate[c]);
    wsg[c] = ws[c] * g;
    if (bias != nullptr) bg[c] = from_f<T>(to_f(bias[c]) * g);
  }
}
#define GATE_CHANNELS(TN)                                                                                  \
  KERNEL_ENTRY gate_channels_##TN(const float* __restrict__ ws, const TN* __restrict__ gate,               \
                                  const TN* __restrict__ bias, float* __restrict__ wsg, TN* __restrict__ bg, \
                                  i64 out) {                                                               \
    gate_channels_impl<TN>(ws, gate, bias, wsg, bg, out);                                                  \
  }

// ---- sdpa_fp8: q, k, v quantized per tensor around cuDNN's fp8 attention (lower/attention.py) --------------
// Each of the three tensors is rows x width elements, rows `stride` apart (a view in a wider buffer). Pass 1
// writes per-block maxima, partial[t * gridDim.x + block]; pass 2 reduces them in every block (a few hundred
// floats: cheaper than a grid barrier or zeroed atomics), writes the dense e4m3 copy and block 0 the scales.
// The views are passed as three (pointer, rows, width, stride) quadruples; tensor t = t0 + blockIdx.y: t0 = 0
// with three rows of blocks for all three, t0 = 2 with one for v alone, when q and k come quantized
// (sdpa_fp8_qk: their producers wrote them and their scales, at q_scale and k_scale, which block 0 copies).
// VEC (the `_vec` kernels): every width and stride a multiple of 8 and every base 16-byte aligned, 8 values a
// load and ILP loads in flight a thread; one element a thread otherwise, which keeps too few bytes in flight to
// approach the memory's bandwidth.
#define FP8_VIEWS_ARGS(T)                                                                                  \
  const T *__restrict__ x0, const T *__restrict__ x1, const T *__restrict__ x2, i64 r0, i64 r1, i64 r2,    \
      i64 w0, i64 w1, i64 w2, i64 s0, i64 s1, i64 s2, int t0
#define FP8_VIEWS x0, x1, x2, r0, r1, r2, w0, w1, w2, s0, s1, s2, t0
#define FP8_VIEW_OF(t)                                                                                     \
  const T* x = t == 0 ? x0 : (t == 1 ? x1 : x2);                                                           \
  const i64 rows = t == 0 ? r0 : (t == 1 ? r1 : r2), w = t == 0 ? w0 : (t == 1 ? w1 : w2),                 \
            stride = t == 0 ? s0 : (t == 1 ? s1 : s2)
// f(offset of the first of 8 values in the view, their index in the dense copy) over the view's 8-value chunks,
// ILP chunks a thread in flight (fewer than 2^31 chunks: the lowering checks)
template <class F>
__device__ __forceinline__ void fp8_chunks(i64 rows, i64 w, i64 stride, F&& f) {
  const unsigned per_row = (unsigned)(w >> 3), chunks = (unsigned)(rows * per_row);
  GRID_STRIDE_ILP(base, step, (i64)chunks) {
    ILP_FOR(e) {
      const unsigned i = (unsigned)(base + e * step);
      if (i < chunks) {
        const unsigned r = i / per_row;
        f((i64)r * stride + 8 * (i64)(i - r * per_row), (i64)i * 8);
      }
    }
  }
}
template <class T, bool VEC>
__device__ __forceinline__ void fp8_amax3_impl(FP8_VIEWS_ARGS(T), float* __restrict__ partial) {
  const int t = t0 + blockIdx.y;
  FP8_VIEW_OF(t);
  float amax = 0.0f;
  if (VEC) {
    fp8_chunks(rows, w, stride, [&](i64 at, i64) {
      float v[8];
      load8(x + at, v);
#pragma unroll
      for (int k = 0; k < 8; ++k) amax = fmaxf(amax, fabsf(v[k]));
    });
  } else {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x)
      for (i64 c = threadIdx.x; c < w; c += blockDim.x) amax = fmaxf(amax, fabsf(to_f(x[r * stride + c])));
  }
  amax = block_max(amax);
  if (threadIdx.x == 0) partial[t * gridDim.x + blockIdx.x] = amax;
}
// scales = [descale_q, descale_k, descale_v, scale_o, descale_s, scale_s, amax_s, amax_o] (sdpa.py FP8_SCALES):
// s = amax / 448 (1 for an all-zero tensor) as dif.ops.quant.tensor_scale; the output at v's scale (an average
// of v's rows never exceeds its amax); the softmax numerators, in [0, 1], at 1/448
template <class T, bool VEC>
__device__ __forceinline__ void fp8_quantize3_impl(FP8_VIEWS_ARGS(T), const float* __restrict__ partial, int parts,
                                                   f8e4m3* __restrict__ q0, f8e4m3* __restrict__ q1,
                                                   f8e4m3* __restrict__ q2, float* __restrict__ scales,
                                                   const float* __restrict__ q_scale,
                                                   const float* __restrict__ k_scale) {
  const int t = t0 + blockIdx.y;
  float amax = 0.0f;
  for (int i = threadIdx.x; i < parts; i += blockDim.x) amax = fmaxf(amax, partial[t * parts + i]);
  const float s = row_scale(block_max(amax), 448.0f);
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    scales[t] = s;
    if (t == 2) {
      scales[3] = 1.0f / s;
      scales[4] = 1.0f / 448.0f;
      scales[5] = 448.0f;
      if (q_scale != nullptr) scales[0] = *q_scale, scales[1] = *k_scale;
    }
  }
  FP8_VIEW_OF(t);
  f8e4m3* q = t == 0 ? q0 : (t == 1 ? q1 : q2);
  const Divisor ds = divisor_of(s);
  if (VEC) {
    fp8_chunks(rows, w, stride, [&](i64 at, i64 dense) {
      float v[8];
      load8(x + at, v);
      store8(q + dense, v, ds);
    });
  } else {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x)
      for (i64 c = threadIdx.x; c < w; c += blockDim.x) qstore(q, r * w + c, to_f(x[r * stride + c]), ds);
  }
}
// o[r * stride + c] = o8[r * width + c] * *scale: cuDNN's e4m3 output at v's scale (scales + 2) into the node's
// output, or q and k quantized by their producers back into the run dtype (where cuDNN's fp8 attention cannot run)
template <class T, bool VEC>
__device__ __forceinline__ void fp8_dequantize_impl(const f8e4m3* __restrict__ o8, const float* __restrict__ scale,
                                                    T* __restrict__ o, i64 rows, i64 width, i64 stride) {
  const float s = *scale;
  if (VEC) {
    fp8_chunks(rows, width, stride, [&](i64 at, i64 dense) {
      const uint2 raw = *reinterpret_cast<const uint2*>(o8 + dense);
      C16<T> out;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        f8e4m3 b;
        b.x = (unsigned char)(((k < 4 ? raw.x : raw.y) >> (8 * (k & 3))) & 0xffu);
        out.v[k] = from_f<T>(to_f(b) * s);
      }
      *reinterpret_cast<C16<T>*>(o + at) = out;
    });
  } else {
    for (i64 r = blockIdx.x; r < rows; r += gridDim.x)
      for (i64 c = threadIdx.x; c < width; c += blockDim.x) o[r * stride + c] = from_f<T>(to_f(o8[r * width + c]) * s);
  }
}
#define SDPA_FP8_FORM(TN, SUFFIX, VEC)                                                                     \
  KERNEL_ENTRY fp8_amax3##SUFFIX##_##TN(FP8_VIEWS_ARGS(TN), float* __restrict__ partial) {                \
    fp8_amax3_impl<TN, VEC>(FP8_VIEWS, partial);                                                           \
  }                                                                                                        \
  KERNEL_ENTRY fp8_quantize3##SUFFIX##_##TN(FP8_VIEWS_ARGS(TN), const float* __restrict__ partial, int parts, \
                                            f8e4m3* __restrict__ q0, f8e4m3* __restrict__ q1,              \
                                            f8e4m3* __restrict__ q2, float* __restrict__ scales,           \
                                            const float* __restrict__ q_scale, const float* __restrict__ k_scale) { \
    fp8_quantize3_impl<TN, VEC>(FP8_VIEWS, partial, parts, q0, q1, q2, scales, q_scale, k_scale);          \
  }                                                                                                        \
  KERNEL_ENTRY fp8_dequantize##SUFFIX##_##TN(const f8e4m3* __restrict__ o8, const float* __restrict__ scale, \
                                             TN* __restrict__ o, i64 rows, i64 width, i64 stride) {         \
    fp8_dequantize_impl<TN, VEC>(o8, scale, o, rows, width, stride);                                        \
  }
#define SDPA_FP8(TN) SDPA_FP8_FORM(TN, , false) SDPA_FP8_FORM(TN, _vec, true)

// ---- portable GEMMs over gemm_tile: m = rows of x, n = output channels ------------------------------------
template <class T>
struct RowLoad {  // x[m, k], rows ld apart
  const T* p;
  i64 ld;
  __device__ __forceinline__ float operator()(i64 m, i64 k) const { return to_f(p[m * ld + k]); }
};
template <class T>
struct WeightLoad {  // (k, n) of w[n, k]
  const T* p;
  i64 ld;
  __device__ __forceinline__ float operator()(i64 k, i64 n) const { return to_f(p[n * ld + k]); }
};
// (k, n) of an int4-group weight: nibble k of row n (even k: low half of byte k/2), minus 8, times the group's
// f16 scale, rounded to x's dtype T (dif.ops.quant.int4_linear)
template <class T>
struct Int4Load {
  const unsigned char* p;
  const f16* s;
  i64 half_k, groups, group;
  __device__ __forceinline__ float operator()(i64 k, i64 n) const {
    const unsigned b = p[n * half_k + (k >> 1)];
    const int nib = (k & 1) ? (int)(b >> 4) : (int)(b & 15u);
    return round_to<T>((float)(nib - 8) * to_f(s[n * groups + k / group]));
  }
};
template <class O>
struct ScaledStore {  // y[m, n] = v * xs[m] * ws[n] (+ bias[n]); xs / ws null: 1
  O* y;
  const float* xs;
  const float* ws;
  const O* bias;
  i64 ldy;
  __device__ __forceinline__ void operator()(i64 m, i64 n, float v) const {
    if (xs != nullptr) v = v * xs[m] * ws[n];
    if (bias != nullptr) v += to_f(bias[n]);
    y[m * ldy + n] = from_f<O>(v);
  }
};

#define SCALED_GEMM(QN, ON)                                                                                \
  KERNEL_ENTRY scaled_gemm_##QN##_##ON(const QN* __restrict__ xq, const float* __restrict__ xs,             \
                                       const QN* __restrict__ wq, const float* __restrict__ ws,             \
                                       const ON* __restrict__ bias, ON* __restrict__ y, i64 m, i64 n, i64 k) { \
    RowLoad<QN> la{xq, k};                                                                                 \
    WeightLoad<QN> lb{wq, k};                                                                              \
    ScaledStore<ON> st{y, xs, ws, bias, n};                                                                \
    gemm_tile(la, lb, st, m, n, k);                                                                        \
  }

#define INT4_GEMM(TN)                                                                                      \
  KERNEL_ENTRY int4_gemm_##TN(const TN* __restrict__ x, const unsigned char* __restrict__ wq,              \
                              const f16* __restrict__ ws, const TN* __restrict__ bias, TN* __restrict__ y, \
                              i64 m, i64 n, i64 k, i64 group) {                                            \
    RowLoad<TN> la{x, k};                                                                                  \
    Int4Load<TN> lb{wq, ws, k / 2, k / group, group};                                                      \
    ScaledStore<TN> st{y, nullptr, nullptr, bias, n};                                                      \
    gemm_tile(la, lb, st, m, n, k);                                                                        \
  }

// ---- int4_linear on the tensor cores (sm_80+, bf16 / f16 activations) -------------------------------------
// The tile GEMM above multiplies in fp32 on the CUDA cores, some 15 TFLOP/s on a Hopper part: a DiT's linears
// ran 48x slower than bf16 there. Here a block of 8 warps computes a 128 x 128 output tile (2 x 4 warps of
// 64 x 32) on mma.sync m16n8k16 with f32 accumulation, over K in slices of 32 that lie in one scale group
// (group % 32 == 0). Each slice's activations are copied to shared memory as they are; its weights are
// unpacked there, 16 nibbles per thread, (n - 8) * scale rounded to T as the reference does: the weight is
// read from global memory at 4 bits a value and never stored wider outside shared memory. Two shared
// buffers: the next slice's global loads are in flight while this slice's products run.
#define I4_BM 128
#define I4_BN 128
#define I4_BK 32
#define I4_LD (I4_BK + 8)  // a padded shared row, in elements: a fragment load's 8 rows x 4 lanes hit 32 banks

struct alignas(16) u32x4 { unsigned x, y, z, w; };
struct alignas(8) u32x2 { unsigned x, y; };

template <class T> __device__ __forceinline__ void mma_16816(float* c, const unsigned* a, const unsigned* b);
#define MMA_16816(T, PTX_TYPE)                                                                               \
  template <> __device__ __forceinline__ void mma_16816<T>(float* c, const unsigned* a, const unsigned* b) {  \
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32." PTX_TYPE "." PTX_TYPE ".f32 "                    \
                 "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                                     \
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])                                            \
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));                       \
  }
#if __CUDA_ARCH__ >= 800
MMA_16816(bf16, "bf16")
MMA_16816(f16, "f16")
#else
template <> __device__ __forceinline__ void mma_16816<bf16>(float*, const unsigned*, const unsigned*) { __trap(); }
template <> __device__ __forceinline__ void mma_16816<f16>(float*, const unsigned*, const unsigned*) { __trap(); }
#endif

// One thread's share of a slice in flight: two 16-byte chunks of activation rows, 8 bytes of one weight row
// (16 nibbles) and that row's group scale.
struct Int4Slice {
  u32x4 a[2];
  u32x2 b;
  float scale;
};

template <class T>
__device__ __forceinline__ void int4_slice_load(Int4Slice& r, const T* x, const unsigned char* wq, const f16* ws,
                                                i64 m0, i64 n0, i64 m_total, i64 n_total, i64 k, i64 k0, i64 group) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 2; ++i) {  // rows tid / 4 and tid / 4 + 64, 8 elements at column (tid % 4) * 8
    const i64 m = m0 + (tid >> 2) + i * 64;
    r.a[i] = m < m_total ? *reinterpret_cast<const u32x4*>(x + m * k + k0 + (tid & 3) * 8) : u32x4{0, 0, 0, 0};
  }
  const i64 n = n0 + (tid >> 1);  // weight row tid / 2, nibbles (tid % 2) * 16 .. + 16
  if (n < n_total) {
    r.b = *reinterpret_cast<const u32x2*>(wq + n * (k >> 1) + (k0 >> 1) + (tid & 1) * 8);
    r.scale = to_f(ws[n * (k / group) + k0 / group]);
  } else {
    r.b = u32x2{0, 0};
    r.scale = 0.0f;
  }
}

template <class T>
__device__ __forceinline__ void int4_slice_store(const Int4Slice& r, unsigned short* as, unsigned short* bs) {
  const int tid = threadIdx.x;
#pragma unroll
  for (int i = 0; i < 2; ++i)
    *reinterpret_cast<u32x4*>(&as[((tid >> 2) + i * 64) * I4_LD + (tid & 3) * 8]) = r.a[i];
  unsigned pairs[8];
#pragma unroll
  for (int j = 0; j < 8; ++j) {  // byte j: nibble 2j in its low half, 2j + 1 in its high half
    const unsigned byte = ((j < 4 ? r.b.x : r.b.y) >> ((j & 3) * 8)) & 255u;
    const unsigned lo = from_f<T>((float)((int)(byte & 15u) - 8) * r.scale).x;
    const unsigned hi = from_f<T>((float)((int)(byte >> 4) - 8) * r.scale).x;
    pairs[j] = lo | (hi << 16);  // the lower k in the lower half, as the mma fragments hold pairs
  }
  u32x4* dst = reinterpret_cast<u32x4*>(&bs[(tid >> 1) * I4_LD + (tid & 1) * 16]);
  dst[0] = u32x4{pairs[0], pairs[1], pairs[2], pairs[3]};
  dst[1] = u32x4{pairs[4], pairs[5], pairs[6], pairs[7]};
}

template <class T>
__device__ __forceinline__ void int4_mma_impl(const T* __restrict__ x, const unsigned char* __restrict__ wq,
                                              const f16* __restrict__ ws, const T* __restrict__ bias,
                                              T* __restrict__ y, i64 m_total, i64 n_total, i64 k, i64 group) {
  __shared__ alignas(16) unsigned short as[2][I4_BM * I4_LD];
  __shared__ alignas(16) unsigned short bs[2][I4_BN * I4_LD];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int wm = warp >> 2, wn = warp & 3, g = lane >> 2, t = lane & 3;
  const i64 m0 = (i64)blockIdx.y * I4_BM, n0 = (i64)blockIdx.x * I4_BN;
  float acc[4][4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[i][j][e] = 0.0f;
  Int4Slice r;
  int4_slice_load(r, x, wq, ws, m0, n0, m_total, n_total, k, 0, group);
  int4_slice_store<T>(r, as[0], bs[0]);
  __syncthreads();
  const i64 slices = k / I4_BK;
  for (i64 s = 0; s < slices; ++s) {
    const int buf = (int)(s & 1);
    if (s + 1 < slices) int4_slice_load(r, x, wq, ws, m0, n0, m_total, n_total, k, (s + 1) * I4_BK, group);
#pragma unroll
    for (int kk = 0; kk < I4_BK; kk += 16) {
      unsigned af[4][4], bf[4][2];
#pragma unroll
      for (int i = 0; i < 4; ++i) {  // A rows g and g + 8 of the fragment, columns 2t and 2t + 8 (PTX's layout)
        const unsigned short* p = &as[buf][(wm * 64 + i * 16 + g) * I4_LD + kk + 2 * t];
        af[i][0] = *reinterpret_cast<const unsigned*>(p);
        af[i][1] = *reinterpret_cast<const unsigned*>(p + 8 * I4_LD);
        af[i][2] = *reinterpret_cast<const unsigned*>(p + 8);
        af[i][3] = *reinterpret_cast<const unsigned*>(p + 8 * I4_LD + 8);
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {  // B column g of the fragment, rows 2t and 2t + 8
        const unsigned short* q = &bs[buf][(wn * 32 + j * 8 + g) * I4_LD + kk + 2 * t];
        bf[j][0] = *reinterpret_cast<const unsigned*>(q);
        bf[j][1] = *reinterpret_cast<const unsigned*>(q + 8);
      }
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) mma_16816<T>(acc[i][j], af[i], bf[j]);
    }
    if (s + 1 < slices) int4_slice_store<T>(r, as[buf ^ 1], bs[buf ^ 1]);
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int e = 0; e < 4; ++e) {  // accumulator e: row g (+ 8 for e >= 2), column 2t + e % 2
        const i64 m = m0 + wm * 64 + i * 16 + g + (e >> 1) * 8, n = n0 + wn * 32 + j * 8 + 2 * t + (e & 1);
        if (m < m_total && n < n_total)
          y[m * n_total + n] = from_f<T>(acc[i][j][e] + (bias != nullptr ? to_f(bias[n]) : 0.0f));
      }
}

#define INT4_MMA(TN)                                                                                       \
  KERNEL_ENTRY int4_mma_##TN(const TN* __restrict__ x, const unsigned char* __restrict__ wq,               \
                             const f16* __restrict__ ws, const TN* __restrict__ bias, TN* __restrict__ y,  \
                             i64 m, i64 n, i64 k, i64 group) {                                             \
    int4_mma_impl<TN>(x, wq, ws, bias, y, m, n, k, group);                                                 \
  }

QUANTIZE_ROWS(f32, f8e4m3)
QUANTIZE_ROWS(f16, f8e4m3)
QUANTIZE_ROWS(bf16, f8e4m3)
QUANTIZE_ROWS(f32, i8)
QUANTIZE_ROWS(f16, i8)
QUANTIZE_ROWS(bf16, i8)
NORM_MODULATE_QUANT(f32, f8e4m3)
NORM_MODULATE_QUANT(f16, f8e4m3)
NORM_MODULATE_QUANT(bf16, f8e4m3)
NORM_MODULATE_QUANT(f32, i8)
NORM_MODULATE_QUANT(f16, i8)
NORM_MODULATE_QUANT(bf16, i8)
RMS_NORM_MODULATE_QUANT(f32, f32, f8e4m3)
RMS_NORM_MODULATE_QUANT(f32, f32, i8)
RMS_NORM_MODULATE_QUANT_HALVES(RMS_NORM_MODULATE_QUANT)
NORM_MODULATE_QUANT_WARPS(f16, f8e4m3)
NORM_MODULATE_QUANT_WARPS(bf16, f8e4m3)
NORM_MODULATE_QUANT_WARPS(f16, i8)
NORM_MODULATE_QUANT_WARPS(bf16, i8)
ROW_QUANT_VEC(f16, f8e4m3)
ROW_QUANT_VEC(bf16, f8e4m3)
ROW_QUANT_VEC(f16, i8)
ROW_QUANT_VEC(bf16, i8)
RMS_NORM_MODULATE_QUANT_HALVES(RMS_NORM_MODULATE_QUANT_VEC)
GLU_QUANT_ALL(f32, f8e4m3)
GLU_QUANT_ALL(f16, f8e4m3)
GLU_QUANT_ALL(bf16, f8e4m3)
GLU_QUANT_ALL(f32, i8)
GLU_QUANT_ALL(f16, i8)
GLU_QUANT_ALL(bf16, i8)
GLU_QUANT_VEC_ALL(f16, f8e4m3)
GLU_QUANT_VEC_ALL(bf16, f8e4m3)
GLU_QUANT_VEC_ALL(f16, i8)
GLU_QUANT_VEC_ALL(bf16, i8)
ACT_MUL_QUANT_ALL(f32, f8e4m3)
ACT_MUL_QUANT_ALL(f16, f8e4m3)
ACT_MUL_QUANT_ALL(bf16, f8e4m3)
ACT_MUL_QUANT_ALL(f32, i8)
ACT_MUL_QUANT_ALL(f16, i8)
ACT_MUL_QUANT_ALL(bf16, i8)
ACT_MUL_QUANT_VEC_ALL(f16, f8e4m3)
ACT_MUL_QUANT_VEC_ALL(bf16, f8e4m3)
ACT_MUL_QUANT_VEC_ALL(f16, i8)
ACT_MUL_QUANT_VEC_ALL(bf16, i8)
SCALED_EPILOGUE(i32, int, f32)
SCALED_EPILOGUE(i32, int, f16)
SCALED_EPILOGUE(i32, int, bf16)
SCALED_EPILOGUE(f32, float, f32)
SCALED_EPILOGUE(f32, float, f16)
SCALED_EPILOGUE(f32, float, bf16)
GATE_CHANNELS(f32)
GATE_CHANNELS(f16)
GATE_CHANNELS(bf16)
SDPA_FP8(f16)
SDPA_FP8(bf16)
SCALED_GEMM(f8e4m3, f32)
SCALED_GEMM(f8e4m3, f16)
SCALED_GEMM(f8e4m3, bf16)
SCALED_GEMM(i8, f32)
SCALED_GEMM(i8, f16)
SCALED_GEMM(i8, bf16)
INT4_GEMM(f32)
INT4_GEMM(f16)
INT4_GEMM(bf16)
INT4_MMA(f16)
INT4_MMA(bf16)
