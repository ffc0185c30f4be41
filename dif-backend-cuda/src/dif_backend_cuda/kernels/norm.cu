// Row-wise ops: rms/layer/group norm, softmax, l2 normalize (one block per row, fp32 statistics,
// two passes like the reference), rotary embedding, and reductions over arbitrary axes.
typedef float f32;

// Rows of rms/layer norm. One block per row (`warp_rows` = 0) or one warp per row (`warp_rows` = rows per
// block, for short rows). Each thread keeps up to ROW_VPT values in registers, so x is read once;
// longer rows fall back to re-reading (L2-resident) memory.
#define ROW_VPT 8

struct RowSpan {
  i64 row, first, stride;  // elements first, first + stride, ... of this row are this thread's
  bool valid;
};
__device__ __forceinline__ RowSpan row_span(i64 rows, int warp_rows) {
  RowSpan r;
  if (warp_rows) {
    r.row = (i64)blockIdx.x * warp_rows + (threadIdx.x >> 5);
    r.first = threadIdx.x & 31;
    r.stride = 32;
  } else {
    r.row = blockIdx.x;
    r.first = threadIdx.x;
    r.stride = blockDim.x;
  }
  r.valid = r.row < rows;
  return r;
}
__device__ __forceinline__ float row_sum(float v, int warp_rows) { return warp_rows ? warp_sum(v) : block_sum(v); }

template <class T>
struct alignas(4 * sizeof(T)) Vec4 {
  T v[4];
};

// Warp-per-row rms norm of rows of 128 or 256 elements with 4-wide loads and stores (lane l owns elements
// 4l..4l+3 of each 128-element chunk). Rows and pointers must be aligned to 4 elements.
template <class T, class TW>
__device__ __forceinline__ void rms_warp_vec4(const RowSpan& sp, const T* __restrict__ xr, const TW* __restrict__ w,
                                              T* __restrict__ yr, i64 len, float eps, float offset,
                                              int round_first) {
  const int chunks = (int)(len / 128);
  const i64 lane4 = sp.first * 4;
  float v[8];
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    Vec4<T> q;
    if (c < chunks && sp.valid) q = *reinterpret_cast<const Vec4<T>*>(xr + c * 128 + lane4);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[c * 4 + e] = (c < chunks && sp.valid) ? to_f(q.v[e]) : 0.0f;
      ss += v[c * 4 + e] * v[c * 4 + e];
    }
  }
  ss = warp_sum(ss);
  if (!sp.valid) return;
  const Divisor denom = divisor_of(sqrtf(ss / (float)len + eps));
#pragma unroll
  for (int c = 0; c < 2; ++c) {
    if (c >= chunks) break;
    Vec4<T> o;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float t = v[c * 4 + e] / denom;
      if (w != nullptr) {
        if (round_first) t = round_to<T>(t);
        t = t * (to_f(w[c * 128 + lane4 + e]) + offset);
      }
      o.v[e] = from_f<T>(t);
    }
    *reinterpret_cast<Vec4<T>*>(yr + c * 128 + lane4) = o;
  }
}

template <class T, class TW>
__device__ __forceinline__ void rms_impl(const T* __restrict__ x, const TW* __restrict__ w, T* __restrict__ y,
                                         i64 rows, i64 len, float eps, float offset, int round_first,
                                         int warp_rows, int vec4) {
  const RowSpan sp = row_span(rows, warp_rows);
  const T* xr = x + (sp.valid ? sp.row : 0) * len;
  T* yr = y + sp.row * len;
  if (vec4) {
    rms_warp_vec4<T, TW>(sp, xr, w, yr, len, eps, offset, round_first);
    return;
  }
  const bool cached = len <= ROW_VPT * sp.stride;
  float v[ROW_VPT];
  float ss = 0.0f;
  if (cached) {
#pragma unroll
    for (int k = 0; k < ROW_VPT; ++k) {
      const i64 j = sp.first + k * sp.stride;
      v[k] = (sp.valid && j < len) ? to_f(xr[j]) : 0.0f;
      ss += v[k] * v[k];
    }
  } else if (sp.valid) {
    for (i64 j = sp.first; j < len; j += sp.stride) {
      const float t = to_f(xr[j]);
      ss += t * t;
    }
  }
  ss = row_sum(ss, warp_rows);
  if (!sp.valid) return;
  const Divisor denom = divisor_of(sqrtf(ss / (float)len + eps));
  auto out = [&](i64 j, float t) {
    t = t / denom;
    if (w != nullptr) {
      if (round_first) t = round_to<T>(t);
      t = t * (to_f(w[j]) + offset);
    }
    yr[j] = from_f<T>(t);
  };
  if (cached) {
#pragma unroll
    for (int k = 0; k < ROW_VPT; ++k) {
      const i64 j = sp.first + k * sp.stride;
      if (j < len) out(j, v[k]);
    }
  } else {
    for (i64 j = sp.first; j < len; j += sp.stride) out(j, to_f(xr[j]));
  }
}

// dx of rms_norm (CENTRED false) or layer_norm (true) over each row, with dn = g (w + offset), mu the row's
// mean (0 for rms_norm), r = 1/sqrt(mean((x - mu)^2) + eps) and n = (x - mu) r:
// dx = r (dn - mean(dn)? - n mean(dn n)) = r dn - r mean(dn)? - (x - mu) r^3 mean(dn (x - mu)).
// The row is cached in registers (two passes over them for the mean first, as the forward's statistics).
template <class T, class TW, bool CENTRED>
__device__ __forceinline__ void norm_backward_impl(const T* __restrict__ x, const T* __restrict__ g,
                                                   const TW* __restrict__ w, T* __restrict__ dx, i64 rows, i64 len,
                                                   float eps, float offset, int warp_rows) {
  const RowSpan sp = row_span(rows, warp_rows);
  const i64 base = (sp.valid ? sp.row : 0) * len;
  const T* xr = x + base;
  const T* gr = g + base;
  auto dn_at = [&](i64 j) { return w != nullptr ? to_f(gr[j]) * (to_f(w[j]) + offset) : to_f(gr[j]); };
  const bool cached = len <= ROW_VPT * sp.stride;
  float v[ROW_VPT], d[ROW_VPT];
  float mu = 0.0f;
  if (cached) {
#pragma unroll
    for (int k = 0; k < ROW_VPT; ++k) {
      const i64 j = sp.first + k * sp.stride;
      const bool in = sp.valid && j < len;
      v[k] = in ? to_f(xr[j]) : 0.0f;
      d[k] = in ? dn_at(j) : 0.0f;
      mu += v[k];
    }
  } else if (CENTRED && sp.valid) {
    for (i64 j = sp.first; j < len; j += sp.stride) mu += to_f(xr[j]);
  }
  mu = CENTRED ? row_sum(mu, warp_rows) / (float)len : 0.0f;
  float ss = 0.0f, dot = 0.0f, sd = 0.0f;
  if (cached) {
#pragma unroll
    for (int k = 0; k < ROW_VPT; ++k) {
      const i64 j = sp.first + k * sp.stride;
      const float c = (sp.valid && j < len) ? v[k] - mu : 0.0f;
      ss += c * c;
      dot += d[k] * c;
      sd += d[k];
    }
  } else if (sp.valid) {
    for (i64 j = sp.first; j < len; j += sp.stride) {
      const float c = to_f(xr[j]) - mu, u = dn_at(j);
      ss += c * c;
      dot += u * c;
      sd += u;
    }
  }
  ss = row_sum(ss, warp_rows);
  dot = row_sum(dot, warp_rows);
  if (CENTRED) sd = row_sum(sd, warp_rows);
  if (!sp.valid) return;
  const float r = 1.0f / sqrtf(ss / (float)len + eps);
  const float slope = dot / (float)len * r * r * r;
  const float shift = CENTRED ? r * sd / (float)len : 0.0f;
  T* dr = dx + sp.row * len;
  if (cached) {
#pragma unroll
    for (int k = 0; k < ROW_VPT; ++k) {
      const i64 j = sp.first + k * sp.stride;
      if (j < len) dr[j] = from_f<T>(r * d[k] - shift - slope * (v[k] - mu));
    }
  } else {
    for (i64 j = sp.first; j < len; j += sp.stride) {
      dr[j] = from_f<T>(r * dn_at(j) - shift - slope * (to_f(xr[j]) - mu));
    }
  }
}

template <class T, class TW>
__device__ __forceinline__ void layer_impl(const T* __restrict__ x, const TW* __restrict__ w,
                                           const TW* __restrict__ b, T* __restrict__ y, i64 rows, i64 len, float eps,
                                           int warp_rows) {
  const RowSpan sp = row_span(rows, warp_rows);
  const T* xr = x + (sp.valid ? sp.row : 0) * len;
  T* yr = y + sp.row * len;
  const bool cached = len <= ROW_VPT * sp.stride;
  float v[ROW_VPT];
  float s = 0.0f;
  if (cached) {
#pragma unroll
    for (int k = 0; k < ROW_VPT; ++k) {
      const i64 j = sp.first + k * sp.stride;
      v[k] = (sp.valid && j < len) ? to_f(xr[j]) : 0.0f;
      s += v[k];
    }
  } else if (sp.valid) {
    for (i64 j = sp.first; j < len; j += sp.stride) s += to_f(xr[j]);
  }
  const float mu = row_sum(s, warp_rows) / (float)len;
  float q = 0.0f;
  if (cached) {
#pragma unroll
    for (int k = 0; k < ROW_VPT; ++k) {
      const i64 j = sp.first + k * sp.stride;
      const float d = v[k] - mu;
      q += (sp.valid && j < len) ? d * d : 0.0f;
    }
  } else if (sp.valid) {
    for (i64 j = sp.first; j < len; j += sp.stride) {
      const float d = to_f(xr[j]) - mu;
      q += d * d;
    }
  }
  const Divisor denom = divisor_of(sqrtf(row_sum(q, warp_rows) / (float)len + eps));
  if (!sp.valid) return;
  auto out = [&](i64 j, float t) {
    t = (t - mu) / denom;
    if (w != nullptr) t = t * to_f(w[j]);
    if (b != nullptr) t = t + to_f(b[j]);
    yr[j] = from_f<T>(t);
  };
  if (cached) {
#pragma unroll
    for (int k = 0; k < ROW_VPT; ++k) {
      const i64 j = sp.first + k * sp.stride;
      if (j < len) out(j, v[k]);
    }
  } else {
    for (i64 j = sp.first; j < len; j += sp.stride) out(j, to_f(xr[j]));
  }
}

// x[N, C, S] (S = all spatial positions); one block per (n, group).
// SILU: group_norm_silu (dif.ops.norm_act): the normalized value rounded to T as the unfused program stores
// it, then silu, one more rounding; the activation is written once instead of twice and read once less.
template <bool SILU, class T>
__device__ __forceinline__ T gn_out(float v) {
  if (!SILU) return from_f<T>(v);
  const float r = to_f(from_f<T>(v));
  return from_f<T>(r * sigmoid_f(r));
}

template <class T, class TW, bool SILU = false>
__device__ __forceinline__ void group_impl(const T* __restrict__ x, const TW* __restrict__ w,
                                           const TW* __restrict__ b, T* __restrict__ y, i64 c, i64 s, i64 groups,
                                           float eps) {
  const i64 n = blockIdx.x / groups, g = blockIdx.x % groups, cg = c / groups, m = cg * s;
  const i64 base = (n * c + g * cg) * s;
  float acc = 0.0f;
  for (i64 j = threadIdx.x; j < m; j += blockDim.x) acc += to_f(x[base + j]);
  const float mu = block_sum(acc) / (float)m;
  float q = 0.0f;
  for (i64 j = threadIdx.x; j < m; j += blockDim.x) {
    const float d = to_f(x[base + j]) - mu;
    q += d * d;
  }
  const Divisor denom = divisor_of(sqrtf(block_sum(q) / (float)m + eps));
  for (i64 j = threadIdx.x; j < m; j += blockDim.x) {
    const i64 ch = g * cg + j / s;
    const float v = (to_f(x[base + j]) - mu) / denom;
    y[base + j] = gn_out<SILU, T>(v * to_f(w[ch]) + to_f(b[ch]));
  }
}

// Rows along a middle axis: x viewed as [outer, len, inner]; block b handles (b / inner, b % inner).
template <class T>
__device__ __forceinline__ void softmax_impl(const T* __restrict__ x, T* __restrict__ y, i64 len, i64 inner) {
  const i64 o = blockIdx.x / inner, i = blockIdx.x % inner, base = o * len * inner + i;
  float m = -DIF_INF;
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) m = fmaxf(m, to_f(x[base + j * inner]));
  m = block_max(m);
  float s = 0.0f;
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) s += expf(to_f(x[base + j * inner]) - m);
  s = block_sum(s);
  for (i64 j = threadIdx.x; j < len; j += blockDim.x)
    y[base + j * inner] = from_f<T>(expf(to_f(x[base + j * inner]) - m) / s);
}

template <class T>
__device__ __forceinline__ void l2_impl(const T* __restrict__ x, T* __restrict__ y, i64 len, i64 inner, float eps) {
  const i64 o = blockIdx.x / inner, i = blockIdx.x % inner, base = o * len * inner + i;
  float s = 0.0f;
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) {
    const float v = to_f(x[base + j * inner]);
    s += v * v;
  }
  const float nrm = fmaxf(sqrtf(block_sum(s)), eps);
  for (i64 j = threadIdx.x; j < len; j += blockDim.x) y[base + j * inner] = from_f<T>(to_f(x[base + j * inner]) / nrm);
}

// group_norm over large groups (a VAE at 1024x1024: 4M values in each of 32 groups). One block per group would
// leave most SMs idle, so each group is cut into slices of `span` values, `span` dividing the spatial size S
// (a slice lies within one channel), read and written in 16-byte chunks (x and y 16-byte aligned).
// Pass 1, per slice: its mean and M2 (squared deviations from that mean; the second read of the slice comes
// from L2). Pass 2, per slice: combine the group's slices exactly (M2 = sum M2_i + n_i (mean_i - mean)^2, all
// slices the same size) and normalize the slice.
template <class T>
__device__ __forceinline__ void group_stats_impl(const T* __restrict__ x, float* __restrict__ part, i64 span) {
  constexpr int P = 16 / sizeof(T);
  const i64 slice = (i64)blockIdx.x * gridDim.y + blockIdx.y;  // group-major
  const C16<T>* xs = reinterpret_cast<const C16<T>*>(x + slice * span);
  const i64 chunks = span / P;
  float acc = 0.0f;
  for (i64 j = threadIdx.x; j < chunks; j += blockDim.x) {
    const C16<T> v = xs[j];
#pragma unroll
    for (int e = 0; e < P; ++e) acc += to_f(v.v[e]);
  }
  const float mu = block_sum(acc) / (float)span;
  float q = 0.0f;
  for (i64 j = threadIdx.x; j < chunks; j += blockDim.x) {
    const C16<T> v = xs[j];
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const float d = to_f(v.v[e]) - mu;
      q += d * d;
    }
  }
  q = block_sum(q);
  if (threadIdx.x == 0) {
    part[2 * slice] = mu;
    part[2 * slice + 1] = q;
  }
}
template <class T, class TW, bool SILU = false>
__device__ __forceinline__ void group_apply_impl(const T* __restrict__ x, const TW* __restrict__ w,
                                                 const TW* __restrict__ b, const float* __restrict__ part,
                                                 T* __restrict__ y, i64 c, i64 s, i64 groups, i64 span, float eps) {
  constexpr int P = 16 / sizeof(T);
  const i64 group = blockIdx.x, slices = gridDim.y, slice = group * slices + blockIdx.y;
  const float* pg = part + 2 * group * slices;
  float acc = 0.0f;
  for (i64 i = threadIdx.x; i < slices; i += blockDim.x) acc += pg[2 * i];
  const float mu = block_sum(acc) / (float)slices;
  float q = 0.0f;
  for (i64 i = threadIdx.x; i < slices; i += blockDim.x) {
    const float d = pg[2 * i] - mu;
    q += pg[2 * i + 1] + (float)span * d * d;
  }
  const Divisor denom = divisor_of(sqrtf(block_sum(q) / (float)(slices * span) + eps));
  const i64 ch = (group % groups) * (c / groups) + blockIdx.y * span / s;
  const float scale = to_f(w[ch]) / denom, shift = to_f(b[ch]);
  const C16<T>* xs = reinterpret_cast<const C16<T>*>(x + slice * span);
  C16<T>* ys = reinterpret_cast<C16<T>*>(y + slice * span);
  for (i64 j = threadIdx.x; j < span / P; j += blockDim.x) {
    const C16<T> v = xs[j];
    C16<T> o;
#pragma unroll
    for (int e = 0; e < P; ++e) o.v[e] = gn_out<SILU, T>((to_f(v.v[e]) - mu) * scale + shift);
    ys[j] = o;
  }
}

#define NORMS(TN, WN)                                                                                      \
  KERNEL_ENTRY rms_norm_##TN##_##WN(const TN* __restrict__ x, const WN* __restrict__ w,       \
                                                   TN* __restrict__ y, i64 rows, i64 len, float eps,       \
                                                   float offset, int round_first, int warp_rows, int vec4) { \
    rms_impl<TN, WN>(x, w, y, rows, len, eps, offset, round_first, warp_rows, vec4);                       \
  }                                                                                                        \
  KERNEL_ENTRY rms_norm_backward_##TN##_##WN(const TN* __restrict__ x, const TN* __restrict__ g,           \
                                             const WN* __restrict__ w, TN* __restrict__ dx, i64 rows,       \
                                             i64 len, float eps, float offset, int warp_rows) {             \
    norm_backward_impl<TN, WN, false>(x, g, w, dx, rows, len, eps, offset, warp_rows);                     \
  }                                                                                                        \
  KERNEL_ENTRY layer_norm_backward_##TN##_##WN(const TN* __restrict__ x, const TN* __restrict__ g,         \
                                               const WN* __restrict__ w, TN* __restrict__ dx, i64 rows,     \
                                               i64 len, float eps, float offset, int warp_rows) {           \
    norm_backward_impl<TN, WN, true>(x, g, w, dx, rows, len, eps, offset, warp_rows);                      \
  }                                                                                                        \
  KERNEL_ENTRY layer_norm_##TN##_##WN(const TN* __restrict__ x, const WN* __restrict__ w,     \
                                                     const WN* __restrict__ b, TN* __restrict__ y, i64 rows, \
                                                     i64 len, float eps, int warp_rows) {                  \
    layer_impl<TN, WN>(x, w, b, y, rows, len, eps, warp_rows);                                             \
  }                                                                                                        \
  KERNEL_ENTRY group_norm_##TN##_##WN(const TN* __restrict__ x, const WN* __restrict__ w,     \
                                                     const WN* __restrict__ b, TN* __restrict__ y, i64 c,   \
                                                     i64 s, i64 groups, float eps) {                       \
    group_impl<TN, WN>(x, w, b, y, c, s, groups, eps);                                                     \
  }                                                                                                        \
  KERNEL_ENTRY group_norm_apply_##TN##_##WN(                                                 \
      const TN* __restrict__ x, const WN* __restrict__ w, const WN* __restrict__ b,                        \
      const float* __restrict__ part, TN* __restrict__ y, i64 c, i64 s, i64 groups, i64 span, float eps) { \
    group_apply_impl<TN, WN>(x, w, b, part, y, c, s, groups, span, eps);                                   \
  }                                                                                                        \
  KERNEL_ENTRY group_norm_silu_##TN##_##WN(const TN* __restrict__ x, const WN* __restrict__ w,             \
                                           const WN* __restrict__ b, TN* __restrict__ y, i64 c, i64 s,     \
                                           i64 groups, float eps) {                                        \
    group_impl<TN, WN, true>(x, w, b, y, c, s, groups, eps);                                               \
  }                                                                                                        \
  KERNEL_ENTRY group_norm_silu_apply_##TN##_##WN(                                                          \
      const TN* __restrict__ x, const WN* __restrict__ w, const WN* __restrict__ b,                        \
      const float* __restrict__ part, TN* __restrict__ y, i64 c, i64 s, i64 groups, i64 span, float eps) { \
    group_apply_impl<TN, WN, true>(x, w, b, part, y, c, s, groups, span, eps);                             \
  }
#define NORMS_ALL(TN) NORMS(TN, f32) NORMS(TN, f16) NORMS(TN, bf16)
NORMS_ALL(f32)
NORMS_ALL(f16)
NORMS_ALL(bf16)

#define GROUP_STATS(TN)                                                                                    \
  KERNEL_ENTRY group_norm_stats_##TN(const TN* __restrict__ x, float* __restrict__ part, i64 span) { \
    group_stats_impl<TN>(x, part, span);                                                                   \
  }
GROUP_STATS(f32)
GROUP_STATS(f16)
GROUP_STATS(bf16)

#define ROWS(TN)                                                                                           \
  KERNEL_ENTRY softmax_##TN(const TN* __restrict__ x, TN* __restrict__ y, i64 len, i64 inner) { \
    softmax_impl<TN>(x, y, len, inner);                                                                    \
  }                                                                                                        \
  KERNEL_ENTRY l2_normalize_##TN(const TN* __restrict__ x, TN* __restrict__ y, i64 len,       \
                                                i64 inner, float eps) {                                    \
    l2_impl<TN>(x, y, len, inner, eps);                                                                    \
  }
ROWS(f32)
ROWS(f16)
ROWS(bf16)

// ---- rotary embedding: x[B, S, H, D], cos/sin[S, R]; the leading R channels of each head rotate --------
// Thread t of a row handles two channels that rotate together: pairs mode (2t, 2t+1); half mode (t, t + R/2)
// for t < R/2, then pass-through pairs after R. threadIdx.y picks the row (b, s, h): no per-element division.
template <class T, class TC>
__device__ __forceinline__ void rope_impl(const T* __restrict__ x, const TC* __restrict__ cs,
                                          const TC* __restrict__ sn, T* __restrict__ y, i64 rows, i64 seq, i64 heads,
                                          i64 dim, i64 rot, int pairs) {
  const i64 half = rot / 2, items = (dim + 1) / 2;
  for (i64 row = (i64)blockIdx.x * blockDim.y + threadIdx.y; row < rows; row += (i64)gridDim.x * blockDim.y) {
    i64 t0 = row;
    divmod(t0, heads);
    const i64 s = divmod(t0, seq);
    const T* xr = x + row * dim;
    T* yr = y + row * dim;
    const TC* cr = cs + s * rot;
    const TC* sr = sn + s * rot;
    for (i64 t = threadIdx.x; t < items; t += blockDim.x) {
      i64 c0, c1;
      bool rotate;
      if (pairs) {
        c0 = 2 * t;
        c1 = c0 + 1;
        rotate = c1 < rot;
      } else if (t < half) {
        c0 = t;
        c1 = t + half;
        rotate = true;
      } else {
        c0 = rot + 2 * (t - half);
        c1 = c0 + 1;
        rotate = false;
      }
      if (c0 >= dim) continue;
      if (!rotate) {
        yr[c0] = xr[c0];
        if (c1 < dim) yr[c1] = xr[c1];
        continue;
      }
      const float x0 = to_f(xr[c0]), x1 = to_f(xr[c1]);
      yr[c0] = from_f<T>(x0 * to_f(cr[c0]) - x1 * to_f(sr[c0]));
      yr[c1] = from_f<T>(x1 * to_f(cr[c1]) + x0 * to_f(sr[c1]));
    }
  }
}
#define ROPE(TN, CN)                                                                                       \
  KERNEL_ENTRY rope_##TN##_##CN(const TN* __restrict__ x, const CN* __restrict__ c,           \
                                              const CN* __restrict__ s, TN* __restrict__ y, i64 rows, i64 seq, \
                                              i64 heads, i64 dim, i64 rot, int pairs) {                    \
    rope_impl<TN, CN>(x, c, s, y, rows, seq, heads, dim, rot, pairs);                                      \
  }
#define ROPE_ALL(TN) ROPE(TN, f32) ROPE(TN, f16) ROPE(TN, bf16)
ROPE_ALL(f32)
ROPE_ALL(f16)
ROPE_ALL(bf16)

// ---- reductions: one warp per output element ------------------------------------------------------
// meta = [rk, kept_shape[rk], kept_strides[rk], rr, red_shape[rr], red_strides[rr]]
__device__ __forceinline__ i64 strided_offset(i64 i, const i64* __restrict__ m) {
  const int r = (int)m[0];
  i64 off = 0;
  for (int d = r - 1; d >= 0; --d) off += divmod(i, m[1 + d]) * m[1 + r + d];
  return off;
}
// The reduction of elements [lo, hi) of output o by one warp (the warp's lanes stride through them). Over
// one contiguous run (a norm's row statistics) the index needs no division per element, and the lanes read
// 16-byte chunks where the run starts on one.
template <class T, bool MAX>
__device__ __forceinline__ float reduce_range(const T* __restrict__ x, const i64* __restrict__ meta, i64 o, i64 lo,
                                              i64 hi, int lane) {
  const i64* red = meta + 1 + 2 * meta[0];
  const i64 base = strided_offset(o, meta);
  float acc = MAX ? -DIF_INF : 0.0f;
  if (red[0] == 1 && red[2] == 1) {
    constexpr int PER = 16 / sizeof(T);
    const T* row = x + base;
    i64 j = lo;
    if (((unsigned long long)(row + lo) & 15) == 0) {
      const C16<T>* chunks = reinterpret_cast<const C16<T>*>(row + lo);
      const i64 n = (hi - lo) / PER;
      for (i64 c = lane; c < n; c += 32) {
        const C16<T> v = chunks[c];
#pragma unroll
        for (int e = 0; e < PER; ++e) {
          const float f = to_f(v.v[e]);
          acc = MAX ? ((f != f || f > acc) ? f : acc) : acc + f;
        }
      }
      j = lo + n * PER;
    }
    for (j += lane; j < hi; j += 32) {
      const float v = to_f(row[j]);
      acc = MAX ? ((v != v || v > acc) ? v : acc) : acc + v;
    }
    return MAX ? warp_max(acc) : warp_sum(acc);
  }
  for (i64 j = lo + lane; j < hi; j += 32) {
    const float v = to_f(x[base + strided_offset(j, red)]);
    acc = MAX ? ((v != v || v > acc) ? v : acc) : acc + v;
  }
  return MAX ? warp_max(acc) : warp_sum(acc);
}
template <class T, bool MAX>
__device__ __forceinline__ void reduce_impl(const T* __restrict__ x, T* __restrict__ y, const i64* __restrict__ meta,
                                            i64 n_out, i64 n_red, float divisor) {
  const i64 o = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (o >= n_out) return;
  const float acc = reduce_range<T, MAX>(x, meta, o, 0, n_red, lane);
  if (lane == 0) y[o] = from_f<T>(MAX ? acc : acc / divisor);
}
// Few outputs of many elements each (a loss, a gradient's squared norm): one warp per output would leave all
// but a few SMs idle (6.5 ms for the 589,824 values of one LoRA gradient on the H200). Split each output's
// elements into `parts` ranges, a warp each, into fp32 partial results part[o * parts + p]; then
// reduce_finish_* reduces each output's parts.
template <class T, bool MAX>
__device__ __forceinline__ void reduce_partial_impl(const T* __restrict__ x, float* __restrict__ part,
                                                    const i64* __restrict__ meta, i64 n_out, i64 n_red, i64 parts) {
  const i64 w = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (w >= n_out * parts) return;
  const i64 o = w / parts, p = w - o * parts, chunk = (n_red + parts - 1) / parts;
  const i64 lo = p * chunk, hi = lo + chunk < n_red ? lo + chunk : n_red;
  const float acc = reduce_range<T, MAX>(x, meta, o, lo, hi, lane);
  if (lane == 0) part[w] = acc;
}
template <class T, bool MAX>
__device__ __forceinline__ void reduce_finish_impl(const float* __restrict__ part, T* __restrict__ y, i64 n_out,
                                                   i64 parts, float divisor) {
  const i64 o = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (o >= n_out) return;
  float acc = MAX ? -DIF_INF : 0.0f;
  for (i64 j = lane; j < parts; j += 32) {
    const float v = part[o * parts + j];
    acc = MAX ? ((v != v || v > acc) ? v : acc) : acc + v;
  }
  acc = MAX ? warp_max(acc) : warp_sum(acc);
  if (lane == 0) y[o] = from_f<T>(MAX ? acc : acc / divisor);
}
#define REDUCE_KIND(TN, KIND, MAX)                                                                         \
  KERNEL_ENTRY reduce_##KIND##_##TN(const TN* __restrict__ x, TN* __restrict__ y,                          \
                                    const i64* __restrict__ meta, i64 n_out, i64 n_red, float divisor) {   \
    reduce_impl<TN, MAX>(x, y, meta, n_out, n_red, divisor);                                               \
  }                                                                                                        \
  KERNEL_ENTRY reduce_partial_##KIND##_##TN(const TN* __restrict__ x, float* __restrict__ part,            \
                                            const i64* __restrict__ meta, i64 n_out, i64 n_red,            \
                                            i64 parts) {                                                   \
    reduce_partial_impl<TN, MAX>(x, part, meta, n_out, n_red, parts);                                      \
  }                                                                                                        \
  KERNEL_ENTRY reduce_finish_##KIND##_##TN(const float* __restrict__ part, TN* __restrict__ y, i64 n_out,  \
                                           i64 parts, float divisor) {                                     \
    reduce_finish_impl<TN, MAX>(part, y, n_out, parts, divisor);                                           \
  }
#define REDUCE(TN) REDUCE_KIND(TN, sum, false) REDUCE_KIND(TN, max, true)
REDUCE(f32)
REDUCE(f16)
REDUCE(bf16)
