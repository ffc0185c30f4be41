// Portable matrix products on CUDA cores (fp32 accumulation): strided/batched GEMM for `linear` and
// `matmul` when cuBLASLt is absent or cannot take the layout, and conv2d as an implicit GEMM (the
// im2col matrix is never stored). 64x64 output tile per 256-thread block, 4x4 per thread.
typedef float f32;
#define TBM 64
#define TBN 64
#define TBK 16

template <class T>
struct MatLoad {
  const T* p;
  i64 sr, sc;
  __device__ __forceinline__ float operator()(i64 r, i64 c) const { return to_f(p[r * sr + c * sc]); }
};

template <class LA, class LB, class ST>
__device__ __forceinline__ void gemm_tile(const LA& la, const LB& lb, const ST& st, i64 m_total, i64 n_total,
                                          i64 k_total) {
  __shared__ float as[TBK][TBM + 4];
  __shared__ float bs[TBK][TBN + 4];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const i64 m0 = (i64)blockIdx.y * TBM, n0 = (i64)blockIdx.x * TBN;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  for (i64 k0 = 0; k0 < k_total; k0 += TBK) {
    for (int e = tid; e < TBM * TBK; e += 256) {
      const int mm = e / TBK, kk = e % TBK;
      const i64 m = m0 + mm, k = k0 + kk;
      as[kk][mm] = (m < m_total && k < k_total) ? la(m, k) : 0.0f;
    }
    for (int e = tid; e < TBK * TBN; e += 256) {
      const int kk = e / TBN, nn = e % TBN;
      const i64 k = k0 + kk, n = n0 + nn;
      bs[kk][nn] = (k < k_total && n < n_total) ? lb(k, n) : 0.0f;
    }
    __syncthreads();
#pragma unroll
    for (int kk = 0; kk < TBK; ++kk) {
      float a[4], b[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) a[i] = as[kk][ty * 4 + i];
#pragma unroll
      for (int j = 0; j < 4; ++j) b[j] = bs[kk][tx * 4 + j];
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(a[i], b[j], acc[i][j]);
    }
    __syncthreads();
  }
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const i64 m = m0 + ty * 4 + i, n = n0 + tx * 4 + j;
      if (m < m_total && n < n_total) st(m, n, acc[i][j]);
    }
}

template <class T>
struct RowStore {
  T* c;
  const T* bias;
  i64 ldc;
  __device__ __forceinline__ void operator()(i64 m, i64 n, float v) const {
    if (bias != nullptr) v += to_f(bias[n]);
    c[m * ldc + n] = from_f<T>(v);
  }
};

// c[z, m, n] = sum_k a[z](m, k) * b[z](k, n) (+ bias[n]); batch offsets of a and b from meta
// (see bcast_offsets), c [batch, m, n] with rows ldc elements apart (n when contiguous).
#define GEMM(TN)                                                                                           \
  extern "C" __global__ void gemm_##TN(const TN* __restrict__ a, const TN* __restrict__ b,                 \
                                       const TN* __restrict__ bias, TN* __restrict__ c,                    \
                                       const i64* __restrict__ meta, i64 batch, i64 m, i64 n, i64 k,       \
                                       i64 sam, i64 sak, i64 sbk, i64 sbn, i64 ldc) {                      \
    for (i64 z = blockIdx.z; z < batch; z += gridDim.z) {                                                  \
      i64 off[2];                                                                                          \
      bcast_offsets<2>(z, meta, off);                                                                      \
      MatLoad<TN> la{a + off[0], sam, sak};                                                                \
      MatLoad<TN> lb{b + off[1], sbk, sbn};                                                                \
      RowStore<TN> st{c + z * m * ldc, bias, ldc};                                                         \
      gemm_tile(la, lb, st, m, n, k);                                                                      \
    }                                                                                                      \
  }
GEMM(f32)
GEMM(f16)
GEMM(bf16)

// ---- conv2d as implicit GEMM per group: [Og, Cg*kh*kw] x [Cg*kh*kw, N*Ho*Wo] -----------------------
struct ConvGeom {
  i64 c, h, w, o, kh, kw, ho, wo, sh, sw, pt, pl, dh, dw, groups;
};
template <class T>
struct ConvLoadB {
  const T* x;
  ConvGeom g;
  i64 grp;
  __device__ __forceinline__ float operator()(i64 k, i64 p) const {
    const i64 hw = g.ho * g.wo, img = p / hw, r = p % hw, oy = r / g.wo, ox = r % g.wo;
    const i64 taps = g.kh * g.kw, ch = k / taps, t = k % taps, ky = t / g.kw, kx = t % g.kw;
    const i64 iy = oy * g.sh - g.pt + ky * g.dh, ix = ox * g.sw - g.pl + kx * g.dw;
    if (iy < 0 || iy >= g.h || ix < 0 || ix >= g.w) return 0.0f;
    const i64 cg = g.c / g.groups;
    return to_f(x[((img * g.c + grp * cg + ch) * g.h + iy) * g.w + ix]);
  }
};
template <class T>
struct ConvStore {
  T* y;
  const T* bias;
  ConvGeom g;
  i64 grp;
  __device__ __forceinline__ void operator()(i64 m, i64 p, float v) const {
    const i64 og = g.o / g.groups, oc = grp * og + m, hw = g.ho * g.wo, img = p / hw, r = p % hw;
    if (bias != nullptr) v += to_f(bias[oc]);
    y[(img * g.o + oc) * hw + r] = from_f<T>(v);
  }
};
#define CONV(TN)                                                                                           \
  extern "C" __global__ void conv2d_##TN(const TN* __restrict__ x, const TN* __restrict__ w,                \
                                         const TN* __restrict__ bias, TN* __restrict__ y, i64 n_img, i64 c, \
                                         i64 h, i64 wd, i64 o, i64 kh, i64 kw, i64 ho, i64 wo, i64 sh,      \
                                         i64 sw, i64 pt, i64 pl, i64 dh, i64 dw, i64 groups) {              \
    const ConvGeom g{c, h, wd, o, kh, kw, ho, wo, sh, sw, pt, pl, dh, dw, groups};                         \
    const i64 grp = blockIdx.z, og = o / groups, kt = (c / groups) * kh * kw;                              \
    MatLoad<TN> la{w + grp * og * kt, kt, 1};                                                              \
    ConvLoadB<TN> lb{x, g, grp};                                                                           \
    ConvStore<TN> st{y, bias, g, grp};                                                                     \
    gemm_tile(la, lb, st, og, n_img * ho * wo, kt);                                                        \
  }
CONV(f32)
CONV(f16)
CONV(bf16)
