// Portable matrix products on CUDA cores (fp32 accumulation): strided/batched GEMM for `linear` and
// `matmul` when cuBLASLt is absent or cannot take the layout (the tile loop is gemm_tile.cuh).

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
  KERNEL_ENTRY gemm_##TN(const TN* __restrict__ a, const TN* __restrict__ b,                 \
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
