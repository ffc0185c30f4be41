// The tiled GEMM core of the portable matrix-product kernels (prepended to linalg.cu and conv.cu): a
// 64x64 output tile per 256-thread block, 4x4 per thread, fp32 accumulation, over any A/B loaders and C
// store (strided matrices for linear/matmul, the implicit im2col of conv2d).
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

// The products over k in [k_begin, k_end) only (a split-K part); gemm_tile below is the whole range.
template <class LA, class LB, class ST>
__device__ __forceinline__ void gemm_tile_k(const LA& la, const LB& lb, const ST& st, i64 m_total, i64 n_total,
                                            i64 k_begin, i64 k_end) {
  __shared__ float as[TBK][TBM + 4];
  __shared__ float bs[TBK][TBN + 4];
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const i64 m0 = (i64)blockIdx.y * TBM, n0 = (i64)blockIdx.x * TBN;
  float acc[4][4];
#pragma unroll
  for (int i = 0; i < 4; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  for (i64 k0 = k_begin; k0 < k_end; k0 += TBK) {
    for (int e = tid; e < TBM * TBK; e += 256) {
      const int mm = e / TBK, kk = e % TBK;
      const i64 m = m0 + mm, k = k0 + kk;
      as[kk][mm] = (m < m_total && k < k_end) ? la(m, k) : 0.0f;
    }
    for (int e = tid; e < TBK * TBN; e += 256) {
      const int kk = e / TBN, nn = e % TBN;
      const i64 k = k0 + kk, n = n0 + nn;
      bs[kk][nn] = (k < k_end && n < n_total) ? lb(k, n) : 0.0f;
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

template <class LA, class LB, class ST>
__device__ __forceinline__ void gemm_tile(const LA& la, const LB& lb, const ST& st, i64 m_total, i64 n_total,
                                          i64 k_total) {
  gemm_tile_k(la, lb, st, m_total, n_total, 0, k_total);
}
