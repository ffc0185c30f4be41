// Elementwise ops: unary math/activations, broadcasting binaries, comparisons, where, modulate, casts,
// gated linear units. Inputs are contiguous; broadcasting operands get strides (0 on broadcast axes)
// from `meta` (see bcast_offsets in common.cuh). Float math is fp32, results rounded once on store.
typedef float f32;
typedef signed char i8;
typedef int i32;
typedef unsigned char u8;

enum UnaryOp { U_NEG, U_ABS, U_EXP, U_LOG, U_SQRT, U_RSQRT, U_SIN, U_COS, U_TANH, U_SIGMOID, U_SILU, U_RELU,
               U_RECIP, U_SQUARE, U_GELU, U_GELU_TANH, U_CLAMP, U_AFFINE, U_ROUND };

template <int OP>
__device__ __forceinline__ float unary_math(float x, float p0, float p1) {
  switch (OP) {
    case U_NEG: return -x;
    case U_ABS: return fabsf(x);
    case U_EXP: return expf(x);
    case U_LOG: return logf(x);
    case U_SQRT: return sqrtf(x);
    case U_RSQRT: return 1.0f / sqrtf(x);
    case U_SIN: return sinf(x);
    case U_COS: return cosf(x);
    case U_TANH: return tanhf(x);
    case U_SIGMOID: return sigmoid_f(x);
    case U_SILU: return x * sigmoid_f(x);
    case U_RELU: return x > 0.0f ? x : (x != x ? x : 0.0f);
    case U_RECIP: return 1.0f / x;
    case U_SQUARE: return x * x;
    case U_GELU: return gelu_erf_f(x);
    case U_GELU_TANH: return gelu_tanh_f(x);
    case U_CLAMP: return fminf(fmaxf(x, p0), p1);
    case U_AFFINE: return __fadd_rn(__fmul_rn(x, p0), p1);
    case U_ROUND: return rintf(x);  // ties to even
  }
  return x;
}

template <int OP, class T>
__device__ __forceinline__ void unary_impl(const T* __restrict__ x, T* __restrict__ y, i64 n, float p0, float p1) {
  GRID_STRIDE_ILP(base, step, n) {
    float v[ILP];
    ILP_FOR(e) {
      const i64 i = base + e * step;
      v[e] = i < n ? to_f(x[i]) : 0.0f;
    }
    ILP_FOR(e) {
      const i64 i = base + e * step;
      if (i < n) y[i] = from_f<T>(unary_math<OP>(v[e], p0, p1));
    }
  }
}

#define UNARY(NAME, OP, TN)                                                                                \
  KERNEL_ENTRY unary_##NAME##_##TN(const TN* __restrict__ x, TN* __restrict__ y, i64 n,     \
                                                  float p0, float p1) {                                   \
    unary_impl<OP, TN>(x, y, n, p0, p1);                                                                   \
  }
#define UNARY_ALL(TN)                                                                                      \
  UNARY(neg, U_NEG, TN) UNARY(abs, U_ABS, TN) UNARY(exp, U_EXP, TN) UNARY(log, U_LOG, TN)                \
  UNARY(sqrt, U_SQRT, TN) UNARY(rsqrt, U_RSQRT, TN) UNARY(sin, U_SIN, TN) UNARY(cos, U_COS, TN)          \
  UNARY(tanh, U_TANH, TN) UNARY(sigmoid, U_SIGMOID, TN) UNARY(silu, U_SILU, TN) UNARY(relu, U_RELU, TN)  \
  UNARY(reciprocal, U_RECIP, TN) UNARY(square, U_SQUARE, TN) UNARY(gelu, U_GELU, TN)                     \
  UNARY(gelu_tanh, U_GELU_TANH, TN) UNARY(clamp, U_CLAMP, TN) UNARY(scalar_affine, U_AFFINE, TN)         \
  UNARY(round, U_ROUND, TN)
UNARY_ALL(f32)
UNARY_ALL(f16)
UNARY_ALL(bf16)

// The 16-byte fast paths (`*_vec`): contiguous operands, 16-byte aligned, whole chunks (the lowering checks).
// A scalar path moves 2 bytes per lane per load for bf16, too little in flight to near the memory's rate.
template <int OP, class T>
__device__ __forceinline__ void unary_vec_impl(const C16<T>* __restrict__ x, C16<T>* __restrict__ y, i64 chunks,
                                               float p0, float p1) {
  for (i64 c = THREAD_FIRST; c < chunks; c += THREAD_STEP) {
    C16<T> v = x[c];
#pragma unroll
    for (int e = 0; e < (int)(16 / sizeof(T)); ++e) v.v[e] = from_f<T>(unary_math<OP>(to_f(v.v[e]), p0, p1));
    y[c] = v;
  }
}
#define UNARY_VEC(NAME, OP, TN)                                                                            \
  KERNEL_ENTRY unary_vec_##NAME##_##TN(const C16<TN>* __restrict__ x, C16<TN>* __restrict__ y, \
                                                      i64 chunks, float p0, float p1) {                   \
    unary_vec_impl<OP, TN>(x, y, chunks, p0, p1);                                                          \
  }
#define UNARY_VEC_ALL(TN)                                                                                  \
  UNARY_VEC(neg, U_NEG, TN) UNARY_VEC(abs, U_ABS, TN) UNARY_VEC(exp, U_EXP, TN) UNARY_VEC(log, U_LOG, TN)  \
  UNARY_VEC(sqrt, U_SQRT, TN) UNARY_VEC(rsqrt, U_RSQRT, TN) UNARY_VEC(sin, U_SIN, TN)                     \
  UNARY_VEC(cos, U_COS, TN) UNARY_VEC(tanh, U_TANH, TN) UNARY_VEC(sigmoid, U_SIGMOID, TN)                 \
  UNARY_VEC(silu, U_SILU, TN) UNARY_VEC(relu, U_RELU, TN) UNARY_VEC(reciprocal, U_RECIP, TN)              \
  UNARY_VEC(square, U_SQUARE, TN) UNARY_VEC(gelu, U_GELU, TN) UNARY_VEC(gelu_tanh, U_GELU_TANH, TN)       \
  UNARY_VEC(clamp, U_CLAMP, TN) UNARY_VEC(scalar_affine, U_AFFINE, TN) UNARY_VEC(round, U_ROUND, TN)
UNARY_VEC_ALL(f32)
UNARY_VEC_ALL(f16)
UNARY_VEC_ALL(bf16)

// ---- binaries ------------------------------------------------------------------------------------
enum BinaryOp { B_ADD, B_SUB, B_MUL, B_DIV, B_MAX, B_MIN, B_POW };

template <int OP>
__device__ __forceinline__ float binary_math(float a, float b) {
  switch (OP) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_DIV: return a / b;
    case B_MAX: return (a != a || a > b) ? a : b;  // NaN propagates like numpy
    case B_MIN: return (a != a || a < b) ? a : b;
    case B_POW: return powf(a, b);
  }
  return a;
}
template <int OP, class T>
__device__ __forceinline__ T binary_int(T a, T b) {
  switch (OP) {
    case B_ADD: return a + b;
    case B_SUB: return a - b;
    case B_MUL: return a * b;
    case B_MAX: return a > b ? a : b;
    case B_MIN: return a < b ? a : b;
  }
  return a;
}

template <int OP, class T>
__device__ __forceinline__ void binary_impl(const T* __restrict__ a, const T* __restrict__ b, T* __restrict__ y,
                                            const i64* __restrict__ meta, i64 n) {
  BWalk<2> walk(meta, THREAD_FIRST, THREAD_STEP);
  GRID_STRIDE_ILP(base, step, n) {
    T va[ILP], vb[ILP];
    ILP_FOR(e) {
      const i64 i = base + e * step;
      i64 off[2];
      walk.offsets(i, off);
      walk.advance();
      if (i < n) {
        va[e] = a[off[0]];
        vb[e] = b[off[1]];
      }
    }
    ILP_FOR(e) {
      const i64 i = base + e * step;
      if (i >= n) continue;
      if constexpr (is_flt<T>::value) y[i] = from_f<T>(binary_math<OP>(to_f(va[e]), to_f(vb[e])));
      else y[i] = binary_int<OP, T>(va[e], vb[e]);
    }
  }
}

#define BINARY(NAME, OP, TN)                                                                               \
  KERNEL_ENTRY binary_##NAME##_##TN(const TN* __restrict__ a, const TN* __restrict__ b,      \
                                                   TN* __restrict__ y, const i64* __restrict__ meta, i64 n) { \
    binary_impl<OP, TN>(a, b, y, meta, n);                                                                 \
  }
#define BINARY_FLOAT(TN)                                                                                   \
  BINARY(add, B_ADD, TN) BINARY(sub, B_SUB, TN) BINARY(mul, B_MUL, TN) BINARY(div, B_DIV, TN)            \
  BINARY(maximum, B_MAX, TN) BINARY(minimum, B_MIN, TN) BINARY(pow, B_POW, TN)
#define BINARY_INT(TN)                                                                                     \
  BINARY(add, B_ADD, TN) BINARY(sub, B_SUB, TN) BINARY(mul, B_MUL, TN) BINARY(maximum, B_MAX, TN)        \
  BINARY(minimum, B_MIN, TN)
BINARY_FLOAT(f32)
BINARY_FLOAT(f16)
BINARY_FLOAT(bf16)
BINARY_INT(i32)
BINARY_INT(i64)

// Same-shape float binaries, 16 bytes per operand per step (see the unary fast path).
template <int OP, class T>
__device__ __forceinline__ void binary_vec_impl(const C16<T>* __restrict__ a, const C16<T>* __restrict__ b,
                                                C16<T>* __restrict__ y, i64 chunks) {
  for (i64 c = THREAD_FIRST; c < chunks; c += THREAD_STEP) {
    const C16<T> va = a[c], vb = b[c];
    C16<T> o;
#pragma unroll
    for (int e = 0; e < (int)(16 / sizeof(T)); ++e) o.v[e] = from_f<T>(binary_math<OP>(to_f(va.v[e]), to_f(vb.v[e])));
    y[c] = o;
  }
}
#define BINARY_VEC(NAME, OP, TN)                                                                           \
  KERNEL_ENTRY binary_vec_##NAME##_##TN(const C16<TN>* __restrict__ a,                       \
                                                       const C16<TN>* __restrict__ b, C16<TN>* __restrict__ y, \
                                                       i64 chunks) {                                       \
    binary_vec_impl<OP, TN>(a, b, y, chunks);                                                              \
  }
#define BINARY_VEC_ALL(TN)                                                                                 \
  BINARY_VEC(add, B_ADD, TN) BINARY_VEC(sub, B_SUB, TN) BINARY_VEC(mul, B_MUL, TN) BINARY_VEC(div, B_DIV, TN) \
  BINARY_VEC(maximum, B_MAX, TN) BINARY_VEC(minimum, B_MIN, TN) BINARY_VEC(pow, B_POW, TN)
BINARY_VEC_ALL(f32)
BINARY_VEC_ALL(f16)
BINARY_VEC_ALL(bf16)

// Broadcasting binaries over 16-byte chunks of the output (lower/base.py `chunk_broadcast`): an operand
// spanning the innermost axis (a [S, 1, D] rotary table against [B, S, H, D] heads) is read a chunk at a
// time, one of innermost size 1 (a norm's per-row statistic) one scalar per chunk (bit k of `scalars`
// set); meta describes the chunk grid.
template <int OP, class T>
__device__ __forceinline__ void binary_bvec_impl(const T* __restrict__ a, const T* __restrict__ b,
                                                 C16<T>* __restrict__ y, const i64* __restrict__ meta, i64 chunks,
                                                 int scalars) {
  constexpr int PER = 16 / sizeof(T);
  const BIdx<2> idx(meta);
  for (i64 c = THREAD_FIRST; c < chunks; c += THREAD_STEP) {
    i64 off[2];
    idx.offsets(c, off);
    float va[PER], vb[PER];
    load_chunk<T>(a, off[0], scalars & 1, va);
    load_chunk<T>(b, off[1], scalars & 2, vb);
    C16<T> o;
#pragma unroll
    for (int e = 0; e < PER; ++e) o.v[e] = from_f<T>(binary_math<OP>(va[e], vb[e]));
    y[c] = o;
  }
}
#define BINARY_BVEC(NAME, OP, TN)                                                                          \
  KERNEL_ENTRY binary_bvec_##NAME##_##TN(const TN* __restrict__ a, const TN* __restrict__ b,               \
                                         C16<TN>* __restrict__ y, const i64* __restrict__ meta, i64 chunks, \
                                         int scalars) {                                                    \
    binary_bvec_impl<OP, TN>(a, b, y, meta, chunks, scalars);                                              \
  }
#define BINARY_BVEC_ALL(TN)                                                                                \
  BINARY_BVEC(add, B_ADD, TN) BINARY_BVEC(sub, B_SUB, TN) BINARY_BVEC(mul, B_MUL, TN)                      \
  BINARY_BVEC(div, B_DIV, TN) BINARY_BVEC(maximum, B_MAX, TN) BINARY_BVEC(minimum, B_MIN, TN)             \
  BINARY_BVEC(pow, B_POW, TN)
BINARY_BVEC_ALL(f32)
BINARY_BVEC_ALL(f16)
BINARY_BVEC_ALL(bf16)

// ---- comparisons -> bool -------------------------------------------------------------------------
enum CompareOp { C_LESS, C_GREATER, C_EQUAL };
template <int OP, class T>
__device__ __forceinline__ void compare_impl(const T* __restrict__ a, const T* __restrict__ b, b8* __restrict__ y,
                                             const i64* __restrict__ meta, i64 n) {
  BWalk<2> walk(meta, THREAD_FIRST, THREAD_STEP);
  GRID_STRIDE_ILP(base, step, n) {
    T va[ILP], vb[ILP];
    ILP_FOR(e) {
      const i64 i = base + e * step;
      i64 off[2];
      walk.offsets(i, off);
      walk.advance();
      if (i < n) {
        va[e] = a[off[0]];
        vb[e] = b[off[1]];
      }
    }
    ILP_FOR(e) {
      const i64 i = base + e * step;
      if (i >= n) continue;
      bool r;
      if constexpr (is_flt<T>::value) {
        const float x = to_f(va[e]), z = to_f(vb[e]);
        r = OP == C_LESS ? x < z : (OP == C_GREATER ? x > z : x == z);
      } else {
        r = OP == C_LESS ? va[e] < vb[e] : (OP == C_GREATER ? va[e] > vb[e] : va[e] == vb[e]);
      }
      y[i].x = r ? 1 : 0;
    }
  }
}
#define COMPARE(NAME, OP, TN)                                                                              \
  KERNEL_ENTRY compare_##NAME##_##TN(const TN* __restrict__ a, const TN* __restrict__ b,     \
                                                    b8* __restrict__ y, const i64* __restrict__ meta, i64 n) { \
    compare_impl<OP, TN>(a, b, y, meta, n);                                                                \
  }
#define COMPARE_ALL(TN) COMPARE(less, C_LESS, TN) COMPARE(greater, C_GREATER, TN) COMPARE(equal, C_EQUAL, TN)
COMPARE_ALL(f32)
COMPARE_ALL(f16)
COMPARE_ALL(bf16)
COMPARE_ALL(i32)
COMPARE_ALL(i64)

// ---- where (dtype-agnostic: selects bytes by element size) ---------------------------------------
#define WHERE(BITS, U)                                                                                     \
  KERNEL_ENTRY where_u##BITS(const b8* __restrict__ c, const U* __restrict__ a,              \
                                           const U* __restrict__ b, U* __restrict__ y,                     \
                                           const i64* __restrict__ meta, i64 n) {                          \
    BWalk<3> walk(meta, THREAD_FIRST, THREAD_STEP);                                                        \
    GRID_STRIDE_ILP(base, step, n) {                                                                       \
      U v[ILP];                                                                                            \
      ILP_FOR(e) {                                                                                         \
        const i64 i = base + e * step;                                                                     \
        i64 off[3];                                                                                        \
        walk.offsets(i, off);                                                                              \
        walk.advance();                                                                                    \
        if (i < n) {                                                                                       \
          v[e] = c[off[0]].x ? a[off[1]] : b[off[2]];                                                      \
        }                                                                                                  \
      }                                                                                                    \
      ILP_FOR(e) {                                                                                         \
        const i64 i = base + e * step;                                                                     \
        if (i < n) y[i] = v[e];                                                                            \
      }                                                                                                    \
    }                                                                                                      \
  }
WHERE(8, unsigned char)
WHERE(16, unsigned short)
WHERE(32, unsigned int)
WHERE(64, u64)

// ---- modulate: x * (1 + scale) + shift -----------------------------------------------------------
#define MODULATE(TN)                                                                                       \
  KERNEL_ENTRY modulate_##TN(const TN* __restrict__ x, const TN* __restrict__ s,             \
                                           const TN* __restrict__ t, TN* __restrict__ y,                   \
                                           const i64* __restrict__ meta, i64 n) {                          \
    BWalk<3> walk(meta, THREAD_FIRST, THREAD_STEP);                                                        \
    GRID_STRIDE_ILP(base, step, n) {                                                                       \
      float v[ILP];                                                                                        \
      ILP_FOR(e) {                                                                                         \
        const i64 i = base + e * step;                                                                     \
        i64 off[3];                                                                                        \
        walk.offsets(i, off);                                                                              \
        walk.advance();                                                                                    \
        if (i < n) {                                                                                       \
          v[e] = to_f(x[off[0]]) * (1.0f + to_f(s[off[1]])) + to_f(t[off[2]]);                             \
        }                                                                                                  \
      }                                                                                                    \
      ILP_FOR(e) {                                                                                         \
        const i64 i = base + e * step;                                                                     \
        if (i < n) y[i] = from_f<TN>(v[e]);                                                                \
      }                                                                                                    \
    }                                                                                                      \
  }
MODULATE(f32)
MODULATE(f16)
MODULATE(bf16)

// modulate where x and y are [rows, d] and scale/shift are [G, 1.., d] with G dividing rows (an adaLN
// modulation per batch row), in 16-byte chunks: d a whole number of chunks (dc per row).
template <class T>
__device__ __forceinline__ void modulate_rows_impl(const C16<T>* __restrict__ x, const C16<T>* __restrict__ s,
                                                   const C16<T>* __restrict__ t, C16<T>* __restrict__ y, i64 chunks,
                                                   i64 dc, i64 rows_per_g) {
  for (i64 c = THREAD_FIRST; c < chunks; c += THREAD_STEP) {
    const i64 row = c / dc;
    const i64 g = (row / rows_per_g) * dc + (c - row * dc);
    const C16<T> vx = x[c], vs = s[g], vt = t[g];
    C16<T> o;
#pragma unroll
    for (int e = 0; e < (int)(16 / sizeof(T)); ++e)
      o.v[e] = from_f<T>(to_f(vx.v[e]) * (1.0f + to_f(vs.v[e])) + to_f(vt.v[e]));
    y[c] = o;
  }
}
#define MODULATE_ROWS(TN)                                                                                  \
  KERNEL_ENTRY modulate_rows_##TN(const C16<TN>* __restrict__ x, const C16<TN>* __restrict__ s, \
                                                const C16<TN>* __restrict__ t, C16<TN>* __restrict__ y,    \
                                                i64 chunks, i64 dc, i64 rows_per_g) {                     \
    modulate_rows_impl<TN>(x, s, t, y, chunks, dc, rows_per_g);                                            \
  }
MODULATE_ROWS(f32)
MODULATE_ROWS(f16)
MODULATE_ROWS(bf16)

// ---- glu: split last axis into a | b; first: act(a) * b, second: a * act(b) ----------------------
enum GluAct { G_SILU, G_GELU, G_GELU_TANH };
template <int ACT>
__device__ __forceinline__ float glu_act(float v) {
  return ACT == G_SILU ? v * sigmoid_f(v) : (ACT == G_GELU ? gelu_erf_f(v) : gelu_tanh_f(v));
}
// x[rows, 2h] -> y[rows, h], rows xp / yp elements apart (2h / h when contiguous); grid.y walks rows,
// grid.x (with ILP) walks columns: no index division.
#define GLU(ACTN, ACT, TN)                                                                                 \
  KERNEL_ENTRY glu_##ACTN##_##TN(const TN* __restrict__ x, TN* __restrict__ y, i64 rows, i64 h, \
                                               int gate_first, i64 xp, i64 yp) {                           \
    const i64 step = (i64)gridDim.x * blockDim.x;                                                          \
    for (i64 r = blockIdx.y; r < rows; r += gridDim.y) {                                                   \
      const TN* xr = x + r * xp;                                                                           \
      TN* yr = y + r * yp;                                                                                 \
      for (i64 base = (i64)blockIdx.x * blockDim.x + threadIdx.x; base < h; base += ILP * step) {          \
        float va[ILP], vb[ILP];                                                                            \
        ILP_FOR(e) {                                                                                       \
          const i64 j = base + e * step;                                                                   \
          va[e] = j < h ? to_f(xr[j]) : 0.0f;                                                              \
          vb[e] = j < h ? to_f(xr[h + j]) : 0.0f;                                                          \
        }                                                                                                  \
        ILP_FOR(e) {                                                                                       \
          const i64 j = base + e * step;                                                                   \
          if (j < h) yr[j] = from_f<TN>(gate_first ? glu_act<ACT>(va[e]) * vb[e] : va[e] * glu_act<ACT>(vb[e])); \
        }                                                                                                  \
      }                                                                                                    \
    }                                                                                                      \
  }
// The same with 8 values per thread through 4-element vector loads: h % 8 == 0, and pointers and row
// pitches multiples of 4 elements (the shapes of transformer FFNs).
template <class T>
struct alignas(4 * sizeof(T)) Glu4 {
  T v[4];
};
template <int ACT, class T>
__device__ __forceinline__ void glu_vec_impl(const T* __restrict__ x, T* __restrict__ y, i64 rows, i64 h,
                                             int gate_first, i64 xp, i64 yp) {
  // grid.x covers a row in chunks of 8 (one per thread), grid.y strides over rows: no index division
  const i64 j = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (j >= h) return;
  for (i64 r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* xr = x + r * xp + j;
    Glu4<T> a[2], b[2], o[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      a[k] = *reinterpret_cast<const Glu4<T>*>(xr + 4 * k);
      b[k] = *reinterpret_cast<const Glu4<T>*>(xr + h + 4 * k);
    }
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float va = to_f(a[k].v[e]), vb = to_f(b[k].v[e]);
        o[k].v[e] = from_f<T>(gate_first ? glu_act<ACT>(va) * vb : va * glu_act<ACT>(vb));
      }
#pragma unroll
    for (int k = 0; k < 2; ++k) *reinterpret_cast<Glu4<T>*>(y + r * yp + j + 4 * k) = o[k];
  }
}
#define GLU_VEC(ACTN, ACT, TN)                                                                             \
  KERNEL_ENTRY glu_vec_##ACTN##_##TN(const TN* __restrict__ x, TN* __restrict__ y, i64 rows,  \
                                                   i64 h, int gate_first, i64 xp, i64 yp) {                \
    glu_vec_impl<ACT, TN>(x, y, rows, h, gate_first, xp, yp);                                              \
  }
#define GLU_ALL(TN)                                                                                     \
  GLU(silu, G_SILU, TN) GLU(gelu, G_GELU, TN) GLU(gelu_tanh, G_GELU_TANH, TN)                              \
  GLU_VEC(silu, G_SILU, TN) GLU_VEC(gelu, G_GELU, TN) GLU_VEC(gelu_tanh, G_GELU_TANH, TN)
GLU_ALL(f32)
GLU_ALL(f16)
GLU_ALL(bf16)

// ---- glu_backward: dx of glu(x) given the cotangent g, in one pass -------------------------------
// The gated half v: d v = g * plain * act'(v); the plain half: d plain = g * act(v).
template <int ACT>
__device__ __forceinline__ float glu_act_grad(float v) {
  if (ACT == G_SILU) {
    const float s = sigmoid_f(v);
    return s * (1.0f + v * (1.0f - s));
  }
  if (ACT == G_GELU) return 0.5f * (1.0f + erff(v * 0.70710678118654752f)) + v * expf(-0.5f * v * v) * 0.39894228040143268f;
  const float c = 0.79788456080286536f, k = 0.044715f;
  const float t = tanhf(c * (v + k * v * v * v));
  return 0.5f * (1.0f + t) + 0.5f * v * (1.0f - t * t) * c * (1.0f + 3.0f * k * v * v);
}
// (a, b) = the halves at one column, gg the cotangent there: writes (d a, d b).
template <int ACT>
__device__ __forceinline__ void glu_grad_pair(float a, float b, float gg, int gate_first, float& da, float& db) {
  if (gate_first) {
    da = gg * b * glu_act_grad<ACT>(a);
    db = gg * glu_act<ACT>(a);
  } else {
    da = gg * glu_act<ACT>(b);
    db = gg * a * glu_act_grad<ACT>(b);
  }
}
// x, dx [rows, 2h] (row pitches xp, dp), g [rows, h] (pitch gp); the grid as glu's.
#define GLU_BACKWARD(ACTN, ACT, TN)                                                                        \
  KERNEL_ENTRY glu_backward_##ACTN##_##TN(const TN* __restrict__ x, const TN* __restrict__ g,              \
                                          TN* __restrict__ dx, i64 rows, i64 h, int gate_first, i64 xp,     \
                                          i64 gp, i64 dp) {                                                 \
    const i64 step = (i64)gridDim.x * blockDim.x;                                                          \
    for (i64 r = blockIdx.y; r < rows; r += gridDim.y) {                                                   \
      const TN* xr = x + r * xp;                                                                           \
      const TN* gr = g + r * gp;                                                                           \
      TN* dr = dx + r * dp;                                                                                \
      for (i64 base = (i64)blockIdx.x * blockDim.x + threadIdx.x; base < h; base += ILP * step) {          \
        float va[ILP], vb[ILP], vg[ILP];                                                                   \
        ILP_FOR(e) {                                                                                       \
          const i64 j = base + e * step;                                                                   \
          va[e] = j < h ? to_f(xr[j]) : 0.0f;                                                              \
          vb[e] = j < h ? to_f(xr[h + j]) : 0.0f;                                                          \
          vg[e] = j < h ? to_f(gr[j]) : 0.0f;                                                              \
        }                                                                                                  \
        ILP_FOR(e) {                                                                                       \
          const i64 j = base + e * step;                                                                   \
          if (j < h) {                                                                                     \
            float da, db;                                                                                  \
            glu_grad_pair<ACT>(va[e], vb[e], vg[e], gate_first, da, db);                                   \
            dr[j] = from_f<TN>(da);                                                                        \
            dr[h + j] = from_f<TN>(db);                                                                    \
          }                                                                                                \
        }                                                                                                  \
      }                                                                                                    \
    }                                                                                                      \
  }
// 8 columns per thread through 4-element vector loads, on glu_vec's conditions (g's pitch as well).
template <int ACT, class T>
__device__ __forceinline__ void glu_backward_vec_impl(const T* __restrict__ x, const T* __restrict__ g,
                                                      T* __restrict__ dx, i64 rows, i64 h, int gate_first,
                                                      i64 xp, i64 gp, i64 dp) {
  const i64 j = ((i64)blockIdx.x * blockDim.x + threadIdx.x) * 8;
  if (j >= h) return;
  for (i64 r = blockIdx.y; r < rows; r += gridDim.y) {
    const T* xr = x + r * xp + j;
    const T* gr = g + r * gp + j;
    Glu4<T> a[2], b[2], gg[2], da[2], db[2];
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      a[k] = *reinterpret_cast<const Glu4<T>*>(xr + 4 * k);
      b[k] = *reinterpret_cast<const Glu4<T>*>(xr + h + 4 * k);
      gg[k] = *reinterpret_cast<const Glu4<T>*>(gr + 4 * k);
    }
#pragma unroll
    for (int k = 0; k < 2; ++k)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float fa, fb;
        glu_grad_pair<ACT>(to_f(a[k].v[e]), to_f(b[k].v[e]), to_f(gg[k].v[e]), gate_first, fa, fb);
        da[k].v[e] = from_f<T>(fa);
        db[k].v[e] = from_f<T>(fb);
      }
    T* dr = dx + r * dp + j;
#pragma unroll
    for (int k = 0; k < 2; ++k) {
      *reinterpret_cast<Glu4<T>*>(dr + 4 * k) = da[k];
      *reinterpret_cast<Glu4<T>*>(dr + h + 4 * k) = db[k];
    }
  }
}
#define GLU_BACKWARD_VEC(ACTN, ACT, TN)                                                                    \
  KERNEL_ENTRY glu_backward_vec_##ACTN##_##TN(const TN* __restrict__ x, const TN* __restrict__ g,          \
                                              TN* __restrict__ dx, i64 rows, i64 h, int gate_first, i64 xp, \
                                              i64 gp, i64 dp) {                                             \
    glu_backward_vec_impl<ACT, TN>(x, g, dx, rows, h, gate_first, xp, gp, dp);                             \
  }
#define GLU_BACKWARD_ALL(TN)                                                                               \
  GLU_BACKWARD(silu, G_SILU, TN) GLU_BACKWARD(gelu, G_GELU, TN) GLU_BACKWARD(gelu_tanh, G_GELU_TANH, TN)   \
  GLU_BACKWARD_VEC(silu, G_SILU, TN) GLU_BACKWARD_VEC(gelu, G_GELU, TN)                                    \
  GLU_BACKWARD_VEC(gelu_tanh, G_GELU_TANH, TN)
GLU_BACKWARD_ALL(f32)
GLU_BACKWARD_ALL(f16)
GLU_BACKWARD_ALL(bf16)

// ---- casts ---------------------------------------------------------------------------------------
template <class A, class B> struct same_t { static const bool value = false; };
template <class A> struct same_t<A, A> { static const bool value = true; };
template <class D, class S>
__device__ __forceinline__ D convert(S s) {
  if constexpr (is_flt<S>::value) {
    const float f = to_f(s);
    if constexpr (is_flt<D>::value) return from_f<D>(f);
    else if constexpr (same_t<D, b8>::value) { D r; r.x = f != 0.0f; return r; }
    else return (D)(i64)truncf(f);  // toward zero, as C and numpy do
  } else {
    i64 v;
    if constexpr (same_t<S, b8>::value) v = s.x; else v = (i64)s;
    if constexpr (is_flt<D>::value) return from_f<D>((float)v);
    else if constexpr (same_t<D, b8>::value) { D r; r.x = v != 0; return r; }
    else return (D)v;
  }
}
#define CAST(SN, S, DN, D)                                                                                 \
  KERNEL_ENTRY cast_##SN##_##DN(const S* __restrict__ x, D* __restrict__ y, i64 n) {         \
    GRID_STRIDE_ILP(base, step, n) {                                                                       \
      S v[ILP];                                                                                            \
      ILP_FOR(e) {                                                                                         \
        const i64 i = base + e * step;                                                                     \
        if (i < n) v[e] = x[i];                                                                            \
      }                                                                                                    \
      ILP_FOR(e) {                                                                                         \
        const i64 i = base + e * step;                                                                     \
        if (i < n) y[i] = convert<D, S>(v[e]);                                                             \
      }                                                                                                    \
    }                                                                                                      \
  }
#define CAST_FROM(SN, S)                                                                                   \
  CAST(SN, S, f32, float) CAST(SN, S, f16, f16) CAST(SN, S, bf16, bf16) CAST(SN, S, f8e4m3, f8e4m3)       \
  CAST(SN, S, f8e5m2, f8e5m2) CAST(SN, S, i8, i8) CAST(SN, S, i32, i32) CAST(SN, S, i64, i64)             \
  CAST(SN, S, u8, u8) CAST(SN, S, bool, b8)
CAST_FROM(f32, float)
CAST_FROM(f16, f16)
CAST_FROM(bf16, bf16)
CAST_FROM(f8e4m3, f8e4m3)
CAST_FROM(f8e5m2, f8e5m2)
CAST_FROM(i8, i8)
CAST_FROM(i32, i32)
CAST_FROM(i64, i64)
CAST_FROM(u8, u8)
CAST_FROM(bool, b8)
