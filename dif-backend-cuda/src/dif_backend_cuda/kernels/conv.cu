// Portable conv2d on CUDA cores when cuDNN is absent or ineligible: an implicit GEMM per group (the
// im2col matrix is never stored; the tile loop is gemm_tile.cuh, MatLoad loads the weights).

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
  KERNEL_ENTRY conv2d_##TN(const TN* __restrict__ x, const TN* __restrict__ w,                \
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

// ---- split-K: the implicit GEMM when its output is a few tiles and its reduction long ------------------
// (a weight gradient: 8x8x3x3 outputs, each a sum over batch x 128 x 128 taps). blockIdx.z = split * groups +
// group; a split sums taps [split * k_chunk, (split + 1) * k_chunk) into fp32 partials [split, O, N*Ho*Wo];
// conv2d_finish adds the splits in order (so every run gives the same bits), then the bias.
struct PartialStore {
  float* part;
  i64 o, p, og, grp, split;
  __device__ __forceinline__ void operator()(i64 m, i64 q, float v) const {
    part[(split * o + grp * og + m) * p + q] = v;
  }
};
#define CONV_SPLIT(TN)                                                                                      \
  KERNEL_ENTRY conv2d_split_##TN(const TN* __restrict__ x, const TN* __restrict__ w, float* __restrict__ part, \
                                 i64 n_img, i64 c, i64 h, i64 wd, i64 o, i64 kh, i64 kw, i64 ho, i64 wo,     \
                                 i64 sh, i64 sw, i64 pt, i64 pl, i64 dh, i64 dw, i64 groups, i64 k_chunk) {  \
    const ConvGeom g{c, h, wd, o, kh, kw, ho, wo, sh, sw, pt, pl, dh, dw, groups};                          \
    const i64 grp = blockIdx.z % groups, split = blockIdx.z / groups, og = o / groups;                      \
    const i64 kt = (c / groups) * kh * kw, k0 = split * k_chunk, k1 = k0 + k_chunk < kt ? k0 + k_chunk : kt; \
    MatLoad<TN> la{w + grp * og * kt, kt, 1};                                                               \
    ConvLoadB<TN> lb{x, g, grp};                                                                            \
    PartialStore st{part, o, n_img * ho * wo, og, grp, split};                                              \
    gemm_tile_k(la, lb, st, og, n_img * ho * wo, k0, k1);                                                   \
  }
#define CONV_FINISH(TN)                                                                                     \
  KERNEL_ENTRY conv2d_finish_##TN(const float* __restrict__ part, const TN* __restrict__ bias,               \
                                  TN* __restrict__ y, i64 o, i64 p, i64 hw, i64 splits) {                   \
    const i64 total = o * p;                                                                                \
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) { \
      float v = 0.0f;                                                                                       \
      for (i64 s = 0; s < splits; ++s) v += part[s * total + i];                                            \
      const i64 oc = i / p, q = i % p, img = q / hw, r = q % hw;                                            \
      if (bias != nullptr) v += to_f(bias[oc]);                                                             \
      y[(img * o + oc) * hw + r] = from_f<TN>(v);                                                           \
    }                                                                                                       \
  }
CONV_SPLIT(f32)
CONV_SPLIT(f16)
CONV_SPLIT(bf16)
CONV_FINISH(f32)
CONV_FINISH(f16)
CONV_FINISH(bf16)

// ---- im2col for one image: col[p, (ch, ky, kx)] (row-major [Ho*Wo, C*kh*kw]) --------------------------
// The patch matrix of a convolution at a small output size, which one cuBLASLt GEMM then multiplies by the
// weight (lower/conv.py `_gemm_form`); zeros where a tap falls in the padding.
#define IM2COL(TN)                                                                                          \
  KERNEL_ENTRY im2col_##TN(const TN* __restrict__ x, TN* __restrict__ col, i64 c, i64 h, i64 wd, i64 kh,     \
                           i64 kw, i64 ho, i64 wo, i64 sh, i64 sw, i64 pt, i64 pl, i64 dh, i64 dw) {         \
    const i64 taps = kh * kw, k_all = c * taps, total = ho * wo * k_all;                                     \
    for (i64 i = blockIdx.x * (i64)blockDim.x + threadIdx.x; i < total; i += (i64)gridDim.x * blockDim.x) { \
      const i64 p = i / k_all, k = i % k_all, oy = p / wo, ox = p % wo;                                      \
      const i64 ch = k / taps, t = k % taps, ky = t / kw, kx = t % kw;                                       \
      const i64 iy = oy * sh - pt + ky * dh, ix = ox * sw - pl + kx * dw;                                    \
      col[i] = (iy < 0 || iy >= h || ix < 0 || ix >= wd) ? from_f<TN>(0.0f) : x[(ch * h + iy) * wd + ix];    \
    }                                                                                                        \
  }
IM2COL(f32)
IM2COL(f16)
IM2COL(bf16)
