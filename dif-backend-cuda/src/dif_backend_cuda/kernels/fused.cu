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
// rms_norm_modulate runs the same kernels with the norm's weight W (f32 or the storage type; NoWeight for
// norm_modulate, whose code is then what it was without one): the normalized value times (w + w_offset) before
// it is rounded, as rms_norm stores it.
struct NoWeight {};
template <class W>
constexpr bool has_weight() {
  return !is_same_t<W, NoWeight>::value;
}
// P weights in one vector load (the register and warp kernels; the lowering checks their alignment)
template <class W, int P>
struct alignas(P * sizeof(W)) WVec {
  W v[P];
};
template <class W, int P>
__device__ __forceinline__ void load_weights(const W* __restrict__ w, i64 j, float (&out)[P], float w_offset) {
  if constexpr (has_weight<W>()) {
    const WVec<W, P> c = *reinterpret_cast<const WVec<W, P>*>(w + j);
#pragma unroll
    for (int e = 0; e < P; ++e) out[e] = to_f(c.v[e]) + w_offset;
  }
}
template <class W>
__device__ __forceinline__ float weighted(float d, float wv) {
  if constexpr (has_weight<W>()) return d * wv;
  else return d;
}
#define NM_VPT 8
template <class T, class W>
__device__ __forceinline__ void norm_modulate_impl(const T* __restrict__ x, const T* __restrict__ s,
                                                   const T* __restrict__ t, T* __restrict__ y,
                                                   const i64* __restrict__ meta, i64 len, i64 s_last, i64 t_last,
                                                   float eps, int is_rms, const W* __restrict__ w, float w_offset) {
  const i64 row = blockIdx.x;
  const T* xr = x + row * len;
  T* yr = y + row * len;
  i64 so, to;
  lead_offsets(row, meta, so, to);
  const bool cached = len <= NM_VPT * blockDim.x;
  float v[NM_VPT];
#pragma unroll
  for (int k = 0; k < NM_VPT; ++k) {
    const i64 j = threadIdx.x + (i64)k * blockDim.x;
    v[k] = (cached && j < len) ? to_f(xr[j]) : 0.0f;
  }
  const auto each = [&](auto&& f) {  // the row from registers when it fits them, else from memory each pass
    if (cached) {
#pragma unroll
      for (int k = 0; k < NM_VPT; ++k)
        if (threadIdx.x + (i64)k * blockDim.x < len) f(v[k]);
    } else {
      for (i64 j = threadIdx.x; j < len; j += blockDim.x) f(to_f(xr[j]));
    }
  };
  const RowStats st = row_stats(each, BLOCK_SUM, len, eps, is_rms);
  const float mu = st.mu;
  const Divisor denom = st.denom;
  auto out = [&](i64 j, float e) {
    float wv = 0.0f;
    if constexpr (has_weight<W>()) wv = to_f(w[j]) + w_offset;
    const float n = round_to<T>(weighted<W>((e - mu) / denom, wv));
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
  KERNEL_ENTRY norm_modulate_##TN(const TN* __restrict__ x, const TN* __restrict__ s,         \
                                                const TN* __restrict__ t, TN* __restrict__ y,               \
                                                const i64* __restrict__ meta, i64 len, i64 s_last,          \
                                                i64 t_last, float eps, int is_rms) {                        \
    norm_modulate_impl<TN, NoWeight>(x, s, t, y, meta, len, s_last, t_last, eps, is_rms, nullptr, 0.0f);    \
  }
#define RMS_NORM_MODULATE(TN, WN)                                                                          \
  KERNEL_ENTRY rms_norm_modulate_##TN##_##WN(const TN* __restrict__ x, const TN* __restrict__ s,           \
                                             const TN* __restrict__ t, TN* __restrict__ y,                 \
                                             const i64* __restrict__ meta, i64 len, i64 s_last, i64 t_last, \
                                             float eps, int is_rms, const WN* __restrict__ w, float w_offset) { \
    norm_modulate_impl<TN, WN>(x, s, t, y, meta, len, s_last, t_last, eps, is_rms, w, w_offset);            \
  }
NORM_MODULATE(f32)
NORM_MODULATE(f16)
NORM_MODULATE(bf16)

// ---- gated_residual: x + rnd(gate * y), all three broadcast to the output ---------------------------
#define GATED_RESIDUAL(TN)                                                                                 \
  KERNEL_ENTRY gated_residual_##TN(const TN* __restrict__ x, const TN* __restrict__ g,        \
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
// The same over 16-byte chunks of the output (lower/base.py `chunk_broadcast`): operands spanning the
// innermost axis a chunk at a time, those of innermost size 1 (bit k of `scalars`) a scalar per chunk.
#define GATED_RESIDUAL_BVEC(TN)                                                                            \
  KERNEL_ENTRY gated_residual_bvec_##TN(const TN* __restrict__ x, const TN* __restrict__ g,                \
                                        const TN* __restrict__ u, C16<TN>* __restrict__ y,                 \
                                        const i64* __restrict__ meta, i64 chunks, int scalars) {           \
    constexpr int PER = 16 / sizeof(TN);                                                                   \
    const BIdx<3> idx(meta);                                                                               \
    for (i64 c = THREAD_FIRST; c < chunks; c += THREAD_STEP) {                                             \
      i64 off[3];                                                                                          \
      idx.offsets(c, off);                                                                                 \
      float vx[PER], vg[PER], vu[PER];                                                                     \
      load_chunk<TN>(x, off[0], scalars & 1, vx);                                                          \
      load_chunk<TN>(g, off[1], scalars & 2, vg);                                                          \
      load_chunk<TN>(u, off[2], scalars & 4, vu);                                                          \
      C16<TN> o;                                                                                           \
      _Pragma("unroll") for (int e = 0; e < PER; ++e) o.v[e] = from_f<TN>(vx[e] + round_to<TN>(vg[e] * vu[e])); \
      y[c] = o;                                                                                            \
    }                                                                                                      \
  }
GATED_RESIDUAL_BVEC(f32)
GATED_RESIDUAL_BVEC(f16)
GATED_RESIDUAL_BVEC(bf16)

// ---- act_mul: y = rnd(act(g)) * u over equal shapes (the activation rounded where the unfused act stores it);
// ACT as common.cuh gate_act (0 silu, 3 sigmoid). act_mul_vec over 16-byte chunks, ILP a thread in flight.
template <int ACT, class T>
__device__ __forceinline__ float act_mul_of(float g, float u) {
  return round_to<T>(gate_act<ACT>(g)) * u;
}
#define ACT_MUL(ACTN, ACT, TN)                                                                             \
  KERNEL_ENTRY act_mul_##ACTN##_##TN(const TN* __restrict__ g, const TN* __restrict__ u, TN* __restrict__ y, \
                                     i64 n) {                                                              \
    GRID_STRIDE(i, n) y[i] = from_f<TN>(act_mul_of<ACT, TN>(to_f(g[i]), to_f(u[i])));                      \
  }                                                                                                        \
  KERNEL_ENTRY act_mul_vec_##ACTN##_##TN(const C16<TN>* __restrict__ g, const C16<TN>* __restrict__ u,     \
                                         C16<TN>* __restrict__ y, i64 chunks) {                            \
    constexpr int PER = 16 / sizeof(TN);                                                                   \
    GRID_STRIDE_ILP(base, step, chunks) {                                                                  \
      C16<TN> a[ILP], b[ILP];                                                                              \
      ILP_FOR(e) if (base + e * step < chunks) a[e] = g[base + e * step], b[e] = u[base + e * step];       \
      ILP_FOR(e) {                                                                                         \
        if (base + e * step >= chunks) continue;                                                           \
        C16<TN> o;                                                                                         \
        _Pragma("unroll") for (int k = 0; k < PER; ++k) o.v[k] = from_f<TN>(act_mul_of<ACT, TN>(to_f(a[e].v[k]), \
                                                                                                to_f(b[e].v[k]))); \
        y[base + e * step] = o;                                                                            \
      }                                                                                                    \
    }                                                                                                      \
  }
#define ACT_MUL_ALL(TN) ACT_MUL(silu, 0, TN) ACT_MUL(sigmoid, 3, TN)
ACT_MUL_ALL(f32)
ACT_MUL_ALL(f16)
ACT_MUL_ALL(bf16)

// ---- rms_norm_rope: x, y [B, S, H, D] whose tokens are xt / yt elements apart (H * D when contiguous);
// one warp per (b, s, h) row, the normalized row staged in shared memory so each lane can read the channel
// it rotates with. Dynamic shared memory: warps_per_block * D floats.
//
// rms_norm_rope_quant (Y = f8e4m3) runs the same kernels and writes each rotated value divided by one scale for
// the tensor, rounded to e4m3 (saturated, as qstore), with the scale at *scale_out: s = sqrt(D) * m / 448, m the
// largest |w + offset| over w and the weights b1..b3 that share the scale (null when absent; 1 when m is 0). A
// normalized row has no channel beyond sqrt(D) in magnitude and the rotation keeps each pair's norm, so no value
// exceeds the range: the scale is known before any row is read (dif.ops.quant.rms_norm_rope_quant).
template <class TW>
__device__ __forceinline__ float norm_bound_max(const TW* __restrict__ w, const TW* __restrict__ b1,
                                                const TW* __restrict__ b2, const TW* __restrict__ b3, i64 dim,
                                                float offset) {
  const TW* ws[4] = {w, b1, b2, b3};
  float m = 0.0f;
  for (int k = 0; k < 4; ++k)
    if (ws[k] != nullptr)
      for (i64 j = threadIdx.x & 31; j < dim; j += 32) m = fmaxf(m, fabsf(to_f(ws[k][j]) + offset));
  return warp_max(m);
}
__device__ __forceinline__ float norm_bound_scale(float m, i64 dim) {
  return m > 0.0f ? sqrtf((float)dim) * m / 448.0f : 1.0f;
}
template <class Y>
__device__ __forceinline__ Y rope_out(float v, const Divisor& scale) {
  if constexpr (is_same_t<Y, f8e4m3>::value) return e4m3_at(v, scale);
  else return from_f<Y>(v);
}
// The quantized form's scale (the unquantized form: none, and its divisor is never read)
template <class Y, class TW>
__device__ __forceinline__ Divisor rope_scale(const TW* __restrict__ w, const TW* __restrict__ b1,
                                              const TW* __restrict__ b2, const TW* __restrict__ b3, i64 dim,
                                              float offset, float* __restrict__ scale_out, bool first) {
  if constexpr (is_same_t<Y, f8e4m3>::value) {
    const float s = norm_bound_scale(norm_bound_max(w, b1, b2, b3, dim, offset), dim);
    if (first && (threadIdx.x & 31) == 0) *scale_out = s;
    return divisor_of(s);
  } else {
    return divisor_of(1.0f);
  }
}
#define NORM_ROPE_BOUND_ARGS(WN) const WN *__restrict__ b1, const WN *__restrict__ b2, const WN *__restrict__ b3, \
                                 float *__restrict__ scale_out
template <class T, class TW, class TC, class Y>
__device__ __forceinline__ void rms_norm_rope_impl(const T* __restrict__ x, const TW* __restrict__ w,
                                                   const TC* __restrict__ cs, const TC* __restrict__ sn,
                                                   Y* __restrict__ y, i64 rows, i64 seq, i64 heads, i64 dim,
                                                   i64 rot, float eps, float offset, int round_first, int pairs,
                                                   i64 xt, i64 yt, NORM_ROPE_BOUND_ARGS(TW)) {
  extern __shared__ float stage[];
  const int warps = blockDim.x >> 5, lane = threadIdx.x & 31;
  const i64 row = (i64)blockIdx.x * warps + (threadIdx.x >> 5);
  float* buf = stage + (threadIdx.x >> 5) * dim;
  const bool valid = row < rows;
  const i64 r0 = valid ? row : 0;
  const T* xr = x + (r0 / heads) * xt + (r0 % heads) * dim;
  float ss = 0.0f;
  for (i64 j = lane; j < dim; j += 32) {
    const float e = valid ? to_f(xr[j]) : 0.0f;
    buf[j] = e;
    ss += e * e;
  }
  ss = warp_sum(ss);
  if (!valid) return;
  const Divisor qs = rope_scale<Y>(w, b1, b2, b3, dim, offset, scale_out, row == 0);
  const Divisor denom = divisor_of(sqrtf(ss / (float)dim + eps));
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
  Y* yr = y + (row / heads) * yt + (row % heads) * dim;
  const i64 half = rot / 2;
  for (i64 j = lane; j < dim; j += 32) {
    float o = buf[j];
    if (j < rot) {
      const float r = pairs ? ((j & 1) ? buf[j - 1] : -buf[j + 1]) : (j < half ? -buf[j + half] : buf[j - half]);
      o = o * to_f(cr[j]) + r * to_f(sr[j]);
    }
    yr[j] = rope_out<Y>(o, qs);
  }
}
// The head_dim == 128 case in registers: lane l holds channels 4l..4l+3 (one 4-element load), a pair
// (2i, 2i+1) sits in one lane and a half-split partner (j +- 64) in lane l ^ 16; no shared memory.
// Needs x, y and the token strides 4-element aligned; half mode needs rot == 128, pairs mode rot % 4 == 0.
template <class T>
struct alignas(4 * sizeof(T)) R4 {
  T v[4];
};
// RR heads per warp (4 or 8: rms_norm_rope_vec<RR>): their loads are all in flight at once, 8 when the head
// count allows, since one head is only 256 bytes per warp. The RR rows of a warp are heads of one token
// (heads % RR == 0), so the token's table row is read once per warp, and the index arithmetic is 32-bit
// (rows < 2^31).
template <class T, class TW, class TC, int ROPE_ROWS, class Y>
__device__ __forceinline__ void rms_norm_rope_vec_impl(const T* __restrict__ x, const TW* __restrict__ w,
                                                       const TC* __restrict__ cs, const TC* __restrict__ sn,
                                                       Y* __restrict__ y, i64 rows, i64 seq, i64 heads, i64 rot,
                                                       float eps, float offset, int round_first, int pairs,
                                                       i64 xt, i64 yt, NORM_ROPE_BOUND_ARGS(TW)) {
  const int lane = threadIdx.x & 31;
  const unsigned row0 = (blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5)) * ROPE_ROWS;
  if (row0 >= (unsigned)rows) return;  // whole warps leave together: the shuffles below stay warp-uniform
  const unsigned token = row0 / (unsigned)heads, h0 = row0 - token * (unsigned)heads;
  const int j0 = 4 * lane;
  const T* xr = x + (i64)token * xt + (i64)h0 * 128 + j0;
  R4<T> in[ROPE_ROWS];
#pragma unroll
  for (int k = 0; k < ROPE_ROWS; ++k) in[k] = *reinterpret_cast<const R4<T>*>(xr + k * 128);
  const unsigned s = token % (unsigned)seq;
  float wv[4], c[4], sv[4];
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const int j = j0 + e;
    wv[e] = to_f(w[j]) + offset;
    c[e] = j < rot ? to_f(cs[(i64)s * rot + j]) : 1.0f;
    sv[e] = j < rot ? to_f(sn[(i64)s * rot + j]) : 0.0f;
  }
  const Divisor qs = rope_scale<Y>(w, b1, b2, b3, 128, offset, scale_out, row0 == 0);
  Y* yr = y + (i64)token * yt + (i64)h0 * 128 + j0;
#pragma unroll
  for (int k = 0; k < ROPE_ROWS; ++k) {
    float v[4], ss = 0.0f;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      v[e] = to_f(in[k].v[e]);
      ss += v[e] * v[e];
    }
    const Divisor denom = divisor_of(sqrtf(warp_sum(ss) / 128.0f + eps));
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      float t = v[e] / denom;
      if (round_first) t = round_to<T>(t);
      v[e] = round_to<T>(t * wv[e]);
    }
    float partner[4];
#pragma unroll
    for (int e = 0; e < 4; ++e) partner[e] = __shfl_xor_sync(0xffffffffu, v[e], 16);
    R4<Y> out;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      // past `rot` the channel passes through: c = 1, s = 0 above
      const float r = pairs ? ((e & 1) ? v[e ^ 1] : -v[e ^ 1]) : (j0 + e < 64 ? -partner[e] : partner[e]);
      out.v[e] = rope_out<Y>(v[e] * c[e] + r * sv[e], qs);
    }
    *reinterpret_cast<R4<Y>*>(yr + k * 128) = out;
  }
}
#define NORM_ROPE_VEC(TN, WN, CN, YN, NAME, RR)                                                            \
  KERNEL_ENTRY NAME##_vec##RR##_##TN##_##WN##_##CN(                                                        \
      const TN* __restrict__ x, const WN* __restrict__ w, const CN* __restrict__ c, const CN* __restrict__ s, \
      YN* __restrict__ y, i64 rows, i64 seq, i64 heads, i64 rot, float eps, float offset, int round_first,  \
      int pairs, i64 xt, i64 yt, NORM_ROPE_BOUND_ARGS(WN)) {                                               \
    rms_norm_rope_vec_impl<TN, WN, CN, RR, YN>(x, w, c, s, y, rows, seq, heads, rot, eps, offset, round_first, \
                                               pairs, xt, yt, b1, b2, b3, scale_out);                      \
  }
#define NORM_ROPE_FORMS(TN, WN, CN, YN, NAME)                                                              \
  NORM_ROPE_VEC(TN, WN, CN, YN, NAME, 4)                                                                   \
  NORM_ROPE_VEC(TN, WN, CN, YN, NAME, 8)                                                                   \
  KERNEL_ENTRY NAME##_##TN##_##WN##_##CN(                                                                  \
      const TN* __restrict__ x, const WN* __restrict__ w, const CN* __restrict__ c, const CN* __restrict__ s, \
      YN* __restrict__ y, i64 rows, i64 seq, i64 heads, i64 dim, i64 rot, float eps, float offset,         \
      int round_first, int pairs, i64 xt, i64 yt, NORM_ROPE_BOUND_ARGS(WN)) {                               \
    rms_norm_rope_impl<TN, WN, CN, YN>(x, w, c, s, y, rows, seq, heads, dim, rot, eps, offset, round_first, pairs, \
                                       xt, yt, b1, b2, b3, scale_out);                                     \
  }
// rms_norm_rope over every float dtype; rms_norm_rope_quant (e4m3 out) over the half-precision ones
#define NORM_ROPE(TN, WN, CN) NORM_ROPE_FORMS(TN, WN, CN, TN, rms_norm_rope)
#define NORM_ROPE_Q8(TN, WN, CN) NORM_ROPE_FORMS(TN, WN, CN, f8e4m3, rms_norm_rope_q8)
#define NORM_ROPE_C(TN, WN) NORM_ROPE(TN, WN, f32) NORM_ROPE(TN, WN, f16) NORM_ROPE(TN, WN, bf16)
#define NORM_ROPE_ALL(TN) NORM_ROPE_C(TN, f32) NORM_ROPE_C(TN, f16) NORM_ROPE_C(TN, bf16)
#define NORM_ROPE_Q8_C(TN, WN) NORM_ROPE_Q8(TN, WN, f32) NORM_ROPE_Q8(TN, WN, f16) NORM_ROPE_Q8(TN, WN, bf16)
#define NORM_ROPE_Q8_ALL(TN) NORM_ROPE_Q8_C(TN, f32) NORM_ROPE_Q8_C(TN, f16) NORM_ROPE_Q8_C(TN, bf16)
NORM_ROPE_ALL(f32)
NORM_ROPE_ALL(f16)
NORM_ROPE_ALL(bf16)
NORM_ROPE_Q8_ALL(f16)
NORM_ROPE_Q8_ALL(bf16)

// ---- fast paths: 8-byte/16-byte vector loads for the shapes transformer blocks use -------------------
template <class T>
struct alignas(4 * sizeof(T)) V4 {
  T v[4];
};
template <class T>
__device__ __forceinline__ V4<T> ld4(const T* p) {
  return *reinterpret_cast<const V4<T>*>(p);
}

// norm_modulate over rows of len % VPT == 0 (len / VPT <= 1024 threads, VPT values each in registers); scale
// and shift are contiguous along the row (s_last = t_last = 1) and every pointer is 4-element aligned.
// Every load (x, scale, shift) is issued before the first reduction, so a block waits on memory once.
template <class T, int VPT, class W>
__device__ __forceinline__ void norm_modulate_vec_impl(const T* __restrict__ x, const T* __restrict__ s,
                                                       const T* __restrict__ t, T* __restrict__ y,
                                                       const i64* __restrict__ meta, i64 len, float eps,
                                                       int is_rms, const W* __restrict__ w, float w_offset) {
  constexpr int C = VPT / 4;
  const i64 row = blockIdx.x;
  const T* xr = x + row * len;
  i64 so, to;
  lead_offsets(row, meta, so, to);
  const i64 j0 = (i64)threadIdx.x * VPT;
  const bool act = j0 < len;
  V4<T> a[C], sc[C], sh[C];
  if (act) {
#pragma unroll
    for (int c = 0; c < C; ++c) {
      a[c] = ld4(xr + j0 + 4 * c);
      sc[c] = ld4(s + so + j0 + 4 * c);
      sh[c] = ld4(t + to + j0 + 4 * c);
    }
  }
  float v[VPT];
#pragma unroll
  for (int c = 0; c < C; ++c)
#pragma unroll
    for (int e = 0; e < 4; ++e) v[4 * c + e] = act ? to_f(a[c].v[e]) : 0.0f;
  const auto each = [&](auto&& f) {
    if (act)
#pragma unroll
      for (int k = 0; k < VPT; ++k) f(v[k]);
  };
  const RowStats st = row_stats(each, BLOCK_SUM, len, eps, is_rms);  // every thread: the block sums wait on all
  if (!act) return;
  const float mu = st.mu;
  const Divisor denom = st.denom;
#pragma unroll
  for (int c = 0; c < C; ++c) {
    V4<T> o;
    float wv[4];
    load_weights<W, 4>(w, j0 + 4 * c, wv, w_offset);
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float n = round_to<T>(weighted<W>((v[4 * c + e] - mu) / denom, wv[e]));
      o.v[e] = from_f<T>(n * (1.0f + to_f(sc[c].v[e])) + to_f(sh[c].v[e]));
    }
    *reinterpret_cast<V4<T>*>(y + row * len + j0 + 4 * c) = o;
  }
}

// norm_modulate with one warp per row, for rows of len = 32 * N * P (P values of 16 bytes per chunk, N chunks
// per lane, lane-interleaved so each warp load covers 512 contiguous bytes). The row stays in registers in
// storage precision and both statistics are warp reductions: no shared memory and no block barrier, so a
// block holds 8 independent rows and many rows' loads are in flight per SM (the block-per-row kernel above
// waits on two block reductions per row). x, s, t, y 16-byte aligned; scale and shift contiguous in the row.
template <class T, int N, class W>
__device__ __forceinline__ void norm_modulate_warp_impl(const T* __restrict__ x, const T* __restrict__ s,
                                                        const T* __restrict__ t, T* __restrict__ y,
                                                        const i64* __restrict__ meta, i64 rows, float eps,
                                                        int is_rms, const W* __restrict__ w, float w_offset) {
  constexpr int P = 16 / sizeof(T);
  constexpr i64 len = 32 * N * P;
  const int lane = threadIdx.x & 31;
  const i64 row = (i64)blockIdx.x * (blockDim.x >> 5) + (threadIdx.x >> 5);
  if (row >= rows) return;  // whole warps leave together
  C16<T> a[N];
  const RowStats st = warp_row_stats(x + row * len, a, eps, is_rms);
  const float mu = st.mu;
  const Divisor denom = st.denom;
  i64 so, to;
  lead_offsets(row, meta, so, to);
  const C16<T>* sr = reinterpret_cast<const C16<T>*>(s + so);
  const C16<T>* tr = reinterpret_cast<const C16<T>*>(t + to);
  C16<T>* yr = reinterpret_cast<C16<T>*>(y + row * len);
#pragma unroll
  for (int k = 0; k < N; ++k) {
    const C16<T> sc = sr[k * 32 + lane], sh = tr[k * 32 + lane];
    float wv[P];
    load_weights<W, P>(w, (i64)(k * 32 + lane) * P, wv, w_offset);
    C16<T> o;
#pragma unroll
    for (int e = 0; e < P; ++e) {
      const float n = round_to<T>(weighted<W>((to_f(a[k].v[e]) - mu) / denom, wv[e]));
      o.v[e] = from_f<T>(n * (1.0f + to_f(sc.v[e])) + to_f(sh.v[e]));
    }
    yr[k * 32 + lane] = o;
  }
}
#define NORM_MODULATE_WARP(TN, N)                                                                          \
  KERNEL_ENTRY norm_modulate_warp##N##_##TN(const TN* __restrict__ x, const TN* __restrict__ s, \
                                                          const TN* __restrict__ t, TN* __restrict__ y,     \
                                                          const i64* __restrict__ meta, i64 rows, float eps, \
                                                          int is_rms) {                                     \
    norm_modulate_warp_impl<TN, N, NoWeight>(x, s, t, y, meta, rows, eps, is_rms, nullptr, 0.0f);           \
  }
#define RMS_NORM_MODULATE_WARP(TN, WN, N)                                                                  \
  KERNEL_ENTRY rms_norm_modulate_warp##N##_##TN##_##WN(const TN* __restrict__ x, const TN* __restrict__ s, \
                                                      const TN* __restrict__ t, TN* __restrict__ y,        \
                                                      const i64* __restrict__ meta, i64 rows, float eps,   \
                                                      int is_rms, const WN* __restrict__ w, float w_offset) { \
    norm_modulate_warp_impl<TN, N, WN>(x, s, t, y, meta, rows, eps, is_rms, w, w_offset);                  \
  }
#define NORM_MODULATE_WARPS(TN)                                                                            \
  NORM_MODULATE_WARP(TN, 4) NORM_MODULATE_WARP(TN, 8) NORM_MODULATE_WARP(TN, 12) NORM_MODULATE_WARP(TN, 16) \
  NORM_MODULATE_WARP(TN, 20) NORM_MODULATE_WARP(TN, 24)
#define RMS_NORM_MODULATE_WARPS(TN, WN)                                                                    \
  RMS_NORM_MODULATE_WARP(TN, WN, 4) RMS_NORM_MODULATE_WARP(TN, WN, 8) RMS_NORM_MODULATE_WARP(TN, WN, 12)   \
  RMS_NORM_MODULATE_WARP(TN, WN, 16) RMS_NORM_MODULATE_WARP(TN, WN, 20) RMS_NORM_MODULATE_WARP(TN, WN, 24)
NORM_MODULATE_WARPS(f32)
NORM_MODULATE_WARPS(f16)
NORM_MODULATE_WARPS(bf16)

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
  KERNEL_ENTRY norm_modulate_vec_##TN(const TN* __restrict__ x, const TN* __restrict__ s,     \
                                                    const TN* __restrict__ t, TN* __restrict__ y,           \
                                                    const i64* __restrict__ meta, i64 len, float eps,       \
                                                    int is_rms) {                                           \
    norm_modulate_vec_impl<TN, 8, NoWeight>(x, s, t, y, meta, len, eps, is_rms, nullptr, 0.0f);             \
  }                                                                                                        \
  KERNEL_ENTRY norm_modulate_vec16_##TN(const TN* __restrict__ x, const TN* __restrict__ s,   \
                                                      const TN* __restrict__ t, TN* __restrict__ y,         \
                                                      const i64* __restrict__ meta, i64 len, float eps,     \
                                                      int is_rms) {                                         \
    norm_modulate_vec_impl<TN, 16, NoWeight>(x, s, t, y, meta, len, eps, is_rms, nullptr, 0.0f);            \
  }                                                                                                        \
  KERNEL_ENTRY gated_residual_rows_##TN(const TN* __restrict__ x, const TN* __restrict__ g,   \
                                                      const TN* __restrict__ u, TN* __restrict__ y, i64 n4, \
                                                      i64 d, i64 rows_per_g) {                              \
    gated_residual_rows_impl<TN>(x, g, u, y, n4, d, rows_per_g);                                            \
  }
FUSED_VEC(f32)
FUSED_VEC(f16)
FUSED_VEC(bf16)
// rms_norm_modulate over every storage type T and weight type W (the three kernels above, weighted)
#define RMS_NORM_MODULATE_VEC(TN, WN)                                                                      \
  KERNEL_ENTRY rms_norm_modulate_vec_##TN##_##WN(const TN* __restrict__ x, const TN* __restrict__ s,       \
                                                 const TN* __restrict__ t, TN* __restrict__ y,             \
                                                 const i64* __restrict__ meta, i64 len, float eps, int is_rms, \
                                                 const WN* __restrict__ w, float w_offset) {               \
    norm_modulate_vec_impl<TN, 8, WN>(x, s, t, y, meta, len, eps, is_rms, w, w_offset);                    \
  }                                                                                                        \
  KERNEL_ENTRY rms_norm_modulate_vec16_##TN##_##WN(const TN* __restrict__ x, const TN* __restrict__ s,     \
                                                   const TN* __restrict__ t, TN* __restrict__ y,           \
                                                   const i64* __restrict__ meta, i64 len, float eps,       \
                                                   int is_rms, const WN* __restrict__ w, float w_offset) { \
    norm_modulate_vec_impl<TN, 16, WN>(x, s, t, y, meta, len, eps, is_rms, w, w_offset);                   \
  }
#define RMS_NORM_MODULATE_ALL(TN, WN) RMS_NORM_MODULATE(TN, WN) RMS_NORM_MODULATE_WARPS(TN, WN) RMS_NORM_MODULATE_VEC(TN, WN)
#define RMS_NORM_MODULATE_W(TN) RMS_NORM_MODULATE_ALL(TN, f32) RMS_NORM_MODULATE_ALL(TN, f16) RMS_NORM_MODULATE_ALL(TN, bf16)
RMS_NORM_MODULATE_W(f32)
RMS_NORM_MODULATE_W(f16)
RMS_NORM_MODULATE_W(bf16)

// ---- adamw_update: one AdamW step of f32 master weights and moments ---------------------------------
// Each operation rounded on its own (no contraction into FMAs), as the chain of core ops it stands for
// rounds it, so the fused step and the chain agree bit for bit. The scalars are device values.
KERNEL_ENTRY adamw_update_f32(const float* __restrict__ p, const float* __restrict__ g, const float* __restrict__ m,
                              const float* __restrict__ v, const float* __restrict__ step_size,
                              const float* __restrict__ root_bc2, const float* __restrict__ decay, float* p_out,
                              float* m_out, float* v_out, i64 n, float b1, float c1, float b2, float c2, float eps) {
  const float lr = *step_size, rb = *root_bc2, dk = *decay;
  GRID_STRIDE_ILP(base, step, n) {
    ILP_FOR(e) {
      const i64 i = base + e * step;
      if (i < n) {
        const float gi = g[i];
        const float mi = __fadd_rn(__fmul_rn(m[i], b1), __fmul_rn(gi, c1));
        const float vi = __fadd_rn(__fmul_rn(v[i], b2), __fmul_rn(__fmul_rn(gi, gi), c2));
        const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), rb), eps);
        p_out[i] = __fsub_rn(__fmul_rn(p[i], dk), __fmul_rn(lr, __fdiv_rn(mi, denom)));
        m_out[i] = mi;
        v_out[i] = vi;
      }
    }
  }
}
