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
