// Quantized ops (dif.ops.quant), made by the format passes: per-row quantization fused into the producer of a
// W8A8 GEMM's input (norm_modulate_quant), the epilogue of the cuBLASLt int8 GEMM, and portable tile GEMMs
// (gemm_tile.cuh) for scaled_linear without cuBLASLt and for int4_linear, which dequantizes its weights inside
// the GEMM's tile loads (never in a separate pass over the weights).
// Quantized storage: f8e4m3 (common.cuh) or i8 (signed char). Arithmetic in fp32, as the references.
typedef signed char i8;

__device__ __forceinline__ float qmax_of(const f8e4m3*) { return 448.0f; }
__device__ __forceinline__ float qmax_of(const i8*) { return 127.0f; }
__device__ __forceinline__ float to_f(i8 v) { return (float)v; }

// q = saturate(round_even(v / scale)), as dif.ops.quant.quantize_with
__device__ __forceinline__ void qstore(f8e4m3* q, i64 j, float v, float scale) {
  q[j] = from_f<f8e4m3>(fminf(fmaxf(v / scale, -448.0f), 448.0f));
}
__device__ __forceinline__ void qstore(i8* q, i64 j, float v, float scale) {
  q[j] = (i8)__float2int_rn(fminf(fmaxf(v / scale, -127.0f), 127.0f));
}

__device__ __forceinline__ float row_scale(float amax, float qmax) { return amax > 0.0f ? amax / qmax : 1.0f; }

// ---- quantize_rows: one block per row (the op table's standalone form; the passes never emit it) ----------
template <class T, class Q>
__device__ __forceinline__ void quantize_rows_impl(const T* __restrict__ x, Q* __restrict__ q, float* __restrict__ s,
                                                   i64 len) {
  const i64 row = blockIdx.x;
  const T* xr = x + row * len;
  float amax = 0.0f;
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) amax = fmaxf(amax, fabsf(to_f(xr[j])));
  const float scale = row_scale(block_max(amax), qmax_of(q));
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) qstore(q + row * len, j, to_f(xr[j]), scale);
  if (threadIdx.x == 0) s[row] = scale;
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

template <class T, class Q>
__device__ __forceinline__ void norm_modulate_quant_impl(const T* __restrict__ x, const T* __restrict__ sc,
                                                         const T* __restrict__ sh, Q* __restrict__ q,
                                                         float* __restrict__ s, const i64* __restrict__ meta,
                                                         i64 len, i64 s_last, i64 t_last, float eps, int is_rms) {
  extern __shared__ float buf[];
  const i64 row = blockIdx.x;
  const T* xr = x + row * len;
  i64 so, to;
  quant_lead_offsets(row, meta, so, to);
  float acc = 0.0f;
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
    const float e = to_f(xr[j]);
    buf[j] = e;
    acc += is_rms ? e * e : e;
  }
  float mu = 0.0f, var;
  if (is_rms) {
    var = block_sum(acc) / (float)len;
  } else {
    mu = block_sum(acc) / (float)len;
    float d2 = 0.0f;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
      const float d = buf[j] - mu;
      d2 += d * d;
    }
    var = block_sum(d2) / (float)len;
  }
  const float denom = sqrtf(var + eps);
  float amax = 0.0f;
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
    const float n = round_to<T>((buf[j] - mu) / denom);  // the norm's value as the unfused pair stores it
    const float y = round_to<T>(n * (1.0f + to_f(sc[so + j * s_last])) + to_f(sh[to + j * t_last]));
    buf[j] = y;  // each thread rereads only its own entries: no barrier needed before the next loop
    amax = fmaxf(amax, fabsf(y));
  }
  const float scale = row_scale(block_max(amax), qmax_of(q));
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) qstore(q + row * len, j, buf[j], scale);
  if (threadIdx.x == 0) s[row] = scale;
}
#define NORM_MODULATE_QUANT(TN, QN)                                                                        \
  KERNEL_ENTRY norm_modulate_quant_##TN##_##QN(const TN* __restrict__ x, const TN* __restrict__ sc,        \
                                               const TN* __restrict__ sh, QN* __restrict__ q,              \
                                               float* __restrict__ s, const i64* __restrict__ meta, i64 len, \
                                               i64 s_last, i64 t_last, float eps, int is_rms) {             \
    norm_modulate_quant_impl<TN, QN>(x, sc, sh, q, s, meta, len, s_last, t_last, eps, is_rms);             \
  }

// ---- glu_quant: one block per row of y[rows, h] from x[rows, 2h], the row staged in dynamic shared memory --
template <int ACT>
__device__ __forceinline__ float quant_glu_act(float v) {  // 0 silu, 1 gelu (erf), 2 gelu tanh: as glu's
  return ACT == 0 ? v * sigmoid_f(v) : (ACT == 1 ? gelu_erf_f(v) : gelu_tanh_f(v));
}
template <int ACT, class T, class Q>
__device__ __forceinline__ void glu_quant_impl(const T* __restrict__ x, Q* __restrict__ q, float* __restrict__ s,
                                               i64 h, int gate_first) {
  extern __shared__ float buf[];
  const i64 row = blockIdx.x;
  const T* xr = x + row * 2 * h;
  float amax = 0.0f;
  for (i64 j = threadIdx.x; j < h; j += blockDim.x) {
    const float a = to_f(xr[j]), b = to_f(xr[h + j]);
    const float y = round_to<T>(gate_first ? quant_glu_act<ACT>(a) * b : a * quant_glu_act<ACT>(b));
    buf[j] = y;  // each thread rereads only its own entries
    amax = fmaxf(amax, fabsf(y));
  }
  const float scale = row_scale(block_max(amax), qmax_of(q));
  for (i64 j = threadIdx.x; j < h; j += blockDim.x) qstore(q + row * h, j, buf[j], scale);
  if (threadIdx.x == 0) s[row] = scale;
}
#define GLU_QUANT(ACTN, ACT, TN, QN)                                                                       \
  KERNEL_ENTRY glu_quant_##ACTN##_##TN##_##QN(const TN* __restrict__ x, QN* __restrict__ q,                \
                                              float* __restrict__ s, i64 h, int gate_first) {              \
    glu_quant_impl<ACT, TN, QN>(x, q, s, h, gate_first);                                                   \
  }
#define GLU_QUANT_ALL(TN, QN) GLU_QUANT(silu, 0, TN, QN) GLU_QUANT(gelu, 1, TN, QN) GLU_QUANT(gelu_tanh, 2, TN, QN)

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
GLU_QUANT_ALL(f32, f8e4m3)
GLU_QUANT_ALL(f16, f8e4m3)
GLU_QUANT_ALL(bf16, f8e4m3)
GLU_QUANT_ALL(f32, i8)
GLU_QUANT_ALL(f16, i8)
GLU_QUANT_ALL(bf16, i8)
SCALED_EPILOGUE(i32, int, f32)
SCALED_EPILOGUE(i32, int, f16)
SCALED_EPILOGUE(i32, int, bf16)
SCALED_EPILOGUE(f32, float, f32)
SCALED_EPILOGUE(f32, float, f16)
SCALED_EPILOGUE(f32, float, bf16)
SCALED_GEMM(f8e4m3, f32)
SCALED_GEMM(f8e4m3, f16)
SCALED_GEMM(f8e4m3, bf16)
SCALED_GEMM(i8, f32)
SCALED_GEMM(i8, f16)
SCALED_GEMM(i8, bf16)
INT4_GEMM(f32)
INT4_GEMM(f16)
INT4_GEMM(bf16)
