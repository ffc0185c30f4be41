// Fused ops made by dif's optimizer passes (dif.ops.fused): norm + modulate, gated residual, q/k rms norm +
// rotary embedding. Each saves a full read and write of the activation between the ops it replaces, and
// rounds the intermediate to storage precision exactly where the unfused pair stored it.
typedef float f32;

// Offsets of a broadcast operand for row `row` of x's leading dims. meta = [r, shape[r], s_str[r], t_str[r]].
__device__ __forceinline__ void lead_offsets(i64 row, const i64* __restrict__ m, i64& so, i64& to) {
  const int r = (int)m[0];
  so = to = 0;
  for (int d = r - 1; d >= 0; --d) {
    const i64 idx = divmod(row, m[1 + d]);
    so += idx * m[1 + r + d];
    to += idx * m[1 + 2 * r + d];
  }
}

// ---- norm_modulate: one block per row; layer (two-pass mean/var) or rms statistics in fp32 -----------
#define NM_VPT 8
template <class T>
__device__ __forceinline__ void norm_modulate_impl(const T* __restrict__ x, const T* __restrict__ s,
                                                   const T* __restrict__ t, T* __restrict__ y,
                                                   const i64* __restrict__ meta, i64 len, i64 s_last, i64 t_last,
                                                   float eps, int is_rms) {
  const i64 row = blockIdx.x;
  const T* xr = x + row * len;
  T* yr = y + row * len;
  i64 so, to;
  lead_offsets(row, meta, so, to);
  const bool cached = len <= NM_VPT * blockDim.x;
  float v[NM_VPT];
  float acc = 0.0f;
#pragma unroll
  for (int k = 0; k < NM_VPT; ++k) {
    const i64 j = threadIdx.x + (i64)k * blockDim.x;
    v[k] = (cached && j < len) ? to_f(xr[j]) : 0.0f;
    acc += is_rms ? v[k] * v[k] : v[k];
  }
  if (!cached) {
    acc = 0.0f;
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
      const float e = to_f(xr[j]);
      acc += is_rms ? e * e : e;
    }
  }
  float mu = 0.0f, var;
  if (is_rms) {
    var = block_sum(acc) / (float)len;
  } else {
    mu = block_sum(acc) / (float)len;
    float q = 0.0f;
    if (cached) {
#pragma unroll
      for (int k = 0; k < NM_VPT; ++k) {
        const i64 j = threadIdx.x + (i64)k * blockDim.x;
        const float d = v[k] - mu;
        q += j < len ? d * d : 0.0f;
      }
    } else {
      for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
        const float d = to_f(xr[j]) - mu;
        q += d * d;
      }
    }
    var = block_sum(q) / (float)len;
  }
  const float denom = sqrtf(var + eps);
  auto out = [&](i64 j, float e) {
    const float n = round_to<T>((e - mu) / denom);
    yr[j] = from_f<T>(n * (1.0f + to_f(s[so + j * s_last])) + to_f(t[to + j * t_last]));
  };
  if (cached) {
#pragma unroll
    for (int k = 0; k < NM_VPT; ++k) {
      const i64 j = threadIdx.x + (i64)k * blockDim.x;
      if (j < len) out(j, v[k]);
    }
  } else {
    for (i64 j = threadIdx.x; j < len; j += blockDim.x) out(j, to_f(xr[j]));
  }
}
#define NORM_MODULATE(TN)                                                                                  \
  extern "C" __global__ void norm_modulate_##TN(const TN* __restrict__ x, const TN* __restrict__ s,         \
                                                const TN* __restrict__ t, TN* __restrict__ y,               \
                                                const i64* __restrict__ meta, i64 len, i64 s_last,          \
                                                i64 t_last, float eps, int is_rms) {                        \
    norm_modulate_impl<TN>(x, s, t, y, meta, len, s_last, t_last, eps, is_rms);                             \
  }
NORM_MODULATE(f32)
NORM_MODULATE(f16)
NORM_MODULATE(bf16)

// ---- gated_residual: x + rnd(gate * y), all three broadcast to the output ---------------------------
#define GATED_RESIDUAL(TN)                                                                                 \
  extern "C" __global__ void gated_residual_##TN(const TN* __restrict__ x, const TN* __restrict__ g,        \
                                                 const TN* __restrict__ u, TN* __restrict__ y,              \
                                                 const i64* __restrict__ meta, i64 n) {                     \
    BWalk<3> walk(meta, THREAD_FIRST, THREAD_STEP);                                                        \
    GRID_STRIDE_ILP(base, step, n) {                                                                       \
      float v[ILP];                                                                                        \
      ILP_FOR(e) {                                                                                         \
        const i64 i = base + e * step;                                                                     \
        i64 off[3];                                                                                        \
        walk.offsets(i, off);                                                                              \
        walk.advance();                                                                                    \
        if (i < n) v[e] = to_f(x[off[0]]) + round_to<TN>(to_f(g[off[1]]) * to_f(u[off[2]]));               \
      }                                                                                                    \
      ILP_FOR(e) {                                                                                         \
        const i64 i = base + e * step;                                                                     \
        if (i < n) y[i] = from_f<TN>(v[e]);                                                                \
      }                                                                                                    \
    }                                                                                                      \
  }
GATED_RESIDUAL(f32)
GATED_RESIDUAL(f16)
GATED_RESIDUAL(bf16)

// ---- rms_norm_rope: x[B, S, H, D]; one warp per (b, s, h) row, the normalized row staged in shared memory
// so each lane can read the channel it rotates with. Dynamic shared memory: warps_per_block * D floats.
template <class T, class TW, class TC>
__device__ __forceinline__ void rms_norm_rope_impl(const T* __restrict__ x, const TW* __restrict__ w,
                                                   const TC* __restrict__ cs, const TC* __restrict__ sn,
                                                   T* __restrict__ y, i64 rows, i64 seq, i64 heads, i64 dim,
                                                   i64 rot, float eps, float offset, int round_first, int pairs) {
  extern __shared__ float stage[];
  const int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  const i64 row = (i64)blockIdx.x * warps + (threadIdx.x >> 5);
  float* buf = stage + (threadIdx.x >> 5) * dim;
  const bool valid = row < rows;
  const T* xr = x + (valid ? row : 0) * dim;
  float ss = 0.0f;
  for (i64 j = lane; j < dim; j += 32) {
    const float e = valid ? to_f(xr[j]) : 0.0f;
    buf[j] = e;
    ss += e * e;
  }
  ss = warp_sum(ss);
  if (!valid) return;
  const float denom = sqrtf(ss / (float)dim + eps);
  for (i64 j = lane; j < dim; j += 32) {
    float t = buf[j] / denom;
    if (round_first) t = round_to<T>(t);
    buf[j] = round_to<T>(t * (to_f(w[j]) + offset));
  }
  __syncwarp();
  i64 q = row / heads;
  const i64 s = q % seq;
  const TC* cr = cs + s * rot;
  const TC* sr = sn + s * rot;
  T* yr = y + row * dim;
  const i64 half = rot / 2;
  for (i64 j = lane; j < dim; j += 32) {
    float o = buf[j];
    if (j < rot) {
      const float r = pairs ? ((j & 1) ? buf[j - 1] : -buf[j + 1]) : (j < half ? -buf[j + half] : buf[j - half]);
      o = o * to_f(cr[j]) + r * to_f(sr[j]);
    }
    yr[j] = from_f<T>(o);
  }
}
#define NORM_ROPE(TN, WN, CN)                                                                              \
  extern "C" __global__ void rms_norm_rope_##TN##_##WN##_##CN(                                             \
      const TN* __restrict__ x, const WN* __restrict__ w, const CN* __restrict__ c, const CN* __restrict__ s, \
      TN* __restrict__ y, i64 rows, i64 seq, i64 heads, i64 dim, i64 rot, float eps, float offset,         \
      int round_first, int pairs) {                                                                        \
    rms_norm_rope_impl<TN, WN, CN>(x, w, c, s, y, rows, seq, heads, dim, rot, eps, offset, round_first, pairs); \
  }
#define NORM_ROPE_C(TN, WN) NORM_ROPE(TN, WN, f32) NORM_ROPE(TN, WN, f16) NORM_ROPE(TN, WN, bf16)
#define NORM_ROPE_ALL(TN) NORM_ROPE_C(TN, f32) NORM_ROPE_C(TN, f16) NORM_ROPE_C(TN, bf16)
NORM_ROPE_ALL(f32)
NORM_ROPE_ALL(f16)
NORM_ROPE_ALL(bf16)

// ---- fast paths: 8-byte/16-byte vector loads for the shapes transformer blocks use -------------------
template <class T>
struct alignas(4 * sizeof(T)) V4 {
  T v[4];
};
template <class T>
__device__ __forceinline__ V4<T> ld4(const T* p) {
  return *reinterpret_cast<const V4<T>*>(p);
}

// norm_modulate over rows of len % 8 == 0 (len / 8 <= 1024 threads, 8 values each in registers); scale
// and shift are contiguous along the row (s_last = t_last = 1) and every pointer is 4-element aligned.
template <class T>
__device__ __forceinline__ void norm_modulate_vec_impl(const T* __restrict__ x, const T* __restrict__ s,
                                                       const T* __restrict__ t, T* __restrict__ y,
                                                       const i64* __restrict__ meta, i64 len, float eps,
                                                       int is_rms) {
  const i64 row = blockIdx.x;
  const T* xr = x + row * len;
  i64 so, to;
  lead_offsets(row, meta, so, to);
  const i64 j0 = (i64)threadIdx.x * 8;
  const bool act = j0 < len;
  float v[8];
  V4<T> a0, a1;
  if (act) {
    a0 = ld4(xr + j0);
    a1 = ld4(xr + j0 + 4);
  }
  float acc = 0.0f;
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    v[e] = act ? to_f(a0.v[e]) : 0.0f;
    v[4 + e] = act ? to_f(a1.v[e]) : 0.0f;
  }
#pragma unroll
  for (int k = 0; k < 8; ++k) acc += is_rms ? v[k] * v[k] : v[k];
  float mu = 0.0f, var;
  if (is_rms) {
    var = block_sum(acc) / (float)len;
  } else {
    mu = block_sum(acc) / (float)len;
    float q = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) q += act ? (v[k] - mu) * (v[k] - mu) : 0.0f;
    var = block_sum(q) / (float)len;
  }
  if (!act) return;
  const float denom = sqrtf(var + eps);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const V4<T> sc = ld4(s + so + j0 + 4 * h), sh = ld4(t + to + j0 + 4 * h);
    V4<T> o;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float n = round_to<T>((v[4 * h + e] - mu) / denom);
      o.v[e] = from_f<T>(n * (1.0f + to_f(sc.v[e])) + to_f(sh.v[e]));
    }
    *reinterpret_cast<V4<T>*>(y + row * len + j0 + 4 * h) = o;
  }
}

// gated_residual where x, y and the output share one shape [rows, d] and the gate is [G, 1.., d] with
// G dividing rows (an adaLN gate per batch row): 4 elements per item, d % 4 == 0, pointers aligned.
template <class T>
__device__ __forceinline__ void gated_residual_rows_impl(const T* __restrict__ x, const T* __restrict__ g,
                                                         const T* __restrict__ u, T* __restrict__ y, i64 n4, i64 d,
                                                         i64 rows_per_g) {
  for (i64 it = THREAD_FIRST; it < n4; it += THREAD_STEP) {
    const i64 i = it * 4;
    const i64 row = i / d, col = i - row * d;
    const V4<T> a = ld4(x + i), b = ld4(g + (row / rows_per_g) * d + col), c = ld4(u + i);
    V4<T> o;
#pragma unroll
    for (int e = 0; e < 4; ++e) o.v[e] = from_f<T>(to_f(a.v[e]) + round_to<T>(to_f(b.v[e]) * to_f(c.v[e])));
    *reinterpret_cast<V4<T>*>(y + i) = o;
  }
}
#define FUSED_VEC(TN)                                                                                      \
  extern "C" __global__ void norm_modulate_vec_##TN(const TN* __restrict__ x, const TN* __restrict__ s,     \
                                                    const TN* __restrict__ t, TN* __restrict__ y,           \
                                                    const i64* __restrict__ meta, i64 len, float eps,       \
                                                    int is_rms) {                                           \
    norm_modulate_vec_impl<TN>(x, s, t, y, meta, len, eps, is_rms);                                         \
  }                                                                                                        \
  extern "C" __global__ void gated_residual_rows_##TN(const TN* __restrict__ x, const TN* __restrict__ g,   \
                                                      const TN* __restrict__ u, TN* __restrict__ y, i64 n4, \
                                                      i64 d, i64 rows_per_g) {                              \
    gated_residual_rows_impl<TN>(x, g, u, y, n4, d, rows_per_g);                                            \
  }
FUSED_VEC(f32)
FUSED_VEC(f16)
FUSED_VEC(bf16)
