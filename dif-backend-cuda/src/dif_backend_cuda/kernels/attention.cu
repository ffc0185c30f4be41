// Portable scaled dot-product attention (the fallback to cuDNN's fused SDPA): online softmax in fp32,
// grouped-query heads, key-padding mask and bottom-right causal mask; a query row whose keys are all
// masked gives zeros. Block = 4 warps = 4 query rows of one (batch, head); keys stream through shared
// memory in tiles of 32 (lane j scores key j, then every lane accumulates its output channels).
// flash_attn_wide takes value head dims up to 512 (a VAE's single-head mid-block attention).
// q/k/v/o are [B, S, H, D] whose tokens are qt/kt/vt/ot elements apart (H * D when contiguous; more when
// the plan placed them as rows of a wider buffer).
typedef float f32;
#define FA_WARPS 4
#define FA_TILE 32

template <class T, int MAXDV>  // value head dims up to MAXDV (MAXDV / 32 accumulators per lane)
__device__ __forceinline__ void flash_impl(const T* __restrict__ q, const T* __restrict__ k, const T* __restrict__ v,
                                           const b8* __restrict__ mask, T* __restrict__ o, i64 sq, i64 skv, i64 hq,
                                           i64 hkv, int d, int dv, float scale, int causal, i64 qt, i64 kt,
                                           i64 vt, i64 ot) {
  extern __shared__ float smem[];
  const int dp = d + 1;  // padded rows: lane j reads row j without bank conflicts
  float* ks = smem;
  float* vs = ks + FA_TILE * dp;
  float* qs = vs + FA_TILE * dv;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const i64 b = blockIdx.z, h = blockIdx.y, qi = (i64)blockIdx.x * FA_WARPS + warp;
  const i64 hk = h / (hq / hkv);
  const bool active = qi < sq;
  float* qrow = qs + warp * d;
  if (active)
    for (int c = lane; c < d; c += 32) qrow[c] = to_f(q[(b * sq + qi) * qt + h * d + c]);
  float m = -DIF_INF, l = 0.0f, acc[MAXDV / 32];
#pragma unroll
  for (int t = 0; t < MAXDV / 32; ++t) acc[t] = 0.0f;
  const i64 last = causal ? qi + (skv - sq) : skv - 1;  // last key this row may see
  for (i64 t0 = 0; t0 < skv; t0 += FA_TILE) {
    __syncthreads();
    for (int e = threadIdx.x; e < FA_TILE * d; e += blockDim.x) {
      const int j = e / d, c = e % d;
      const i64 key = t0 + j;
      ks[j * dp + c] = key < skv ? to_f(k[(b * skv + key) * kt + hk * d + c]) : 0.0f;
    }
    for (int e = threadIdx.x; e < FA_TILE * dv; e += blockDim.x) {
      const int j = e / dv, c = e % dv;
      const i64 key = t0 + j;
      vs[j * dv + c] = key < skv ? to_f(v[(b * skv + key) * vt + hk * dv + c]) : 0.0f;
    }
    __syncthreads();
    if (!active) continue;
    const i64 key = t0 + lane;
    const bool ok = key < skv && key <= last && (mask == nullptr || mask[b * skv + key].x);
    float s = -DIF_INF;
    if (ok) {
      float dot = 0.0f;
      for (int c = 0; c < d; ++c) dot = fmaf(qrow[c], ks[lane * dp + c], dot);
      s = dot * scale;
    }
    const float mnew = fmaxf(m, warp_max(s));
    if (mnew == -DIF_INF) continue;  // nothing visible yet (uniform across the warp)
    const float corr = expf(m - mnew);
    const float p = ok ? expf(s - mnew) : 0.0f;
    l = l * corr + warp_sum(p);
#pragma unroll
    for (int t = 0; t < MAXDV / 32; ++t) acc[t] *= corr;
    for (int j = 0; j < FA_TILE; ++j) {
      const float pj = __shfl_sync(0xffffffffu, p, j);
#pragma unroll
      for (int t = 0; t < MAXDV / 32; ++t) {
        const int c = lane + 32 * t;
        if (c < dv) acc[t] = fmaf(pj, vs[j * dv + c], acc[t]);
      }
    }
    m = mnew;
  }
  if (!active) return;
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
#pragma unroll
  for (int t = 0; t < MAXDV / 32; ++t) {
    const int c = lane + 32 * t;
    if (c < dv) o[(b * sq + qi) * ot + h * dv + c] = from_f<T>(acc[t] * inv);
  }
}

#define FLASH(TN)                                                                                          \
  KERNEL_ENTRY __launch_bounds__(FA_WARPS * 32)                                              \
      flash_attn_##TN(const TN* __restrict__ q, const TN* __restrict__ k, const TN* __restrict__ v,        \
                      const b8* __restrict__ mask, TN* __restrict__ o, i64 sq, i64 skv, i64 hq, i64 hkv,    \
                      int d, int dv, float scale, int causal, i64 qt, i64 kt, i64 vt, i64 ot) {            \
    flash_impl<TN, 256>(q, k, v, mask, o, sq, skv, hq, hkv, d, dv, scale, causal, qt, kt, vt, ot);         \
  }                                                                                                        \
  KERNEL_ENTRY __launch_bounds__(FA_WARPS * 32)                                              \
      flash_attn_wide_##TN(const TN* __restrict__ q, const TN* __restrict__ k, const TN* __restrict__ v,   \
                           const b8* __restrict__ mask, TN* __restrict__ o, i64 sq, i64 skv, i64 hq,        \
                           i64 hkv, int d, int dv, float scale, int causal, i64 qt, i64 kt, i64 vt, i64 ot) { \
    flash_impl<TN, 512>(q, k, v, mask, o, sq, skv, hq, hkv, d, dv, scale, causal, qt, kt, vt, ot);         \
  }
FLASH(f32)
FLASH(f16)
FLASH(bf16)

// ---- around cuDNN's SDPA when the node has a key mask [B, Skv] ------------------------------------------
// The mask becomes an additive score bias [B, rows, Skv] (0: the key may be attended; rows = 1, or Sq
// when cuDNN wants the query axis spelled out). The bias is finite, so a
// query row whose keys are all masked comes out of cuDNN as a plain average instead of NaN; the second
// kernel then zeroes exactly those rows, as the op defines. Causal (only with Sq == Skv on this path):
// row i is fully masked when the batch row's first valid key comes after i.
#define SDPA_MASKED_BIAS -30000.0f  // exp of it underflows to 0 in fp32; finite in f16 and bf16
#define SDPA_MASK(TN)                                                                                      \
  KERNEL_ENTRY sdpa_mask_bias_##TN(const b8* __restrict__ mask, TN* __restrict__ bias, i64 n,  \
                                                 i64 skv, i64 rows) {                                      \
    for (i64 i = THREAD_FIRST; i < n; i += THREAD_STEP) {                                                  \
      const i64 key = i / skv / rows * skv + i % skv; /* bias [B, rows, Skv] from mask [B, Skv] */          \
      bias[i] = from_f<TN>(mask[key].x ? 0.0f : SDPA_MASKED_BIAS);                                         \
    }                                                                                                      \
  }                                                                                                        \
  KERNEL_ENTRY sdpa_zero_masked_rows_##TN(const b8* __restrict__ mask, TN* __restrict__ o, i64 sq, \
                                                        i64 skv, i64 width, i64 ot, int causal) {         \
    const i64 b = blockIdx.x;                                                                              \
    float first = (float)skv;                                                                              \
    for (i64 j = threadIdx.x; j < skv; j += blockDim.x)                                                    \
      if (mask[b * skv + j].x) first = fminf(first, (float)j);                                             \
    first = -block_max(-first);                                                                            \
    const i64 rows = causal ? (i64)fminf(first, (float)sq) : (first >= (float)skv ? sq : 0);               \
    for (i64 e = threadIdx.x; e < rows * width; e += blockDim.x) {                                         \
      const i64 r = e / width;                                                                             \
      o[(b * sq + r) * ot + (e - r * width)] = from_f<TN>(0.0f);                                           \
    }                                                                                                      \
  }
SDPA_MASK(f32)
SDPA_MASK(f16)
SDPA_MASK(bf16)

// ---- cuDNN's SDPA over the attended keys only (a key mask, not causal) ---------------------------------
// A score bias sends cuDNN to a slower kernel (about a third more time on Krea 2's 4,608 keys). The result
// does not depend on the order of the keys, so each batch row's attended keys are gathered first, in
// order, its masked keys after them, and cuDNN's padding mask attends over the first seq_kv[b] of them.
// sdpa_key_order: one block per batch row; src[b, i] = the key that goes to slot i; seq_q[b] = Sq.
KERNEL_ENTRY sdpa_key_order(const b8* __restrict__ mask, int* __restrict__ src, int* __restrict__ seq_q,
                            int* __restrict__ seq_kv, i64 sq, i64 skv) {
  __shared__ int before[1024];  // per thread: attended keys up to and including its segment (a scan)
  const i64 b = blockIdx.x;
  const b8* m = mask + b * skv;
  int* s = src + b * skv;
  const i64 per = (skv + blockDim.x - 1) / blockDim.x;  // each thread a contiguous segment, in key order
  const i64 lo = min((i64)threadIdx.x * per, skv), hi = min(lo + per, skv);
  int mine = 0;
  for (i64 j = lo; j < hi; ++j) mine += m[j].x ? 1 : 0;
  before[threadIdx.x] = mine;
  __syncthreads();
  for (int off = 1; off < (int)blockDim.x; off <<= 1) {  // inclusive scan over the threads
    const int add = (int)threadIdx.x >= off ? before[threadIdx.x - off] : 0;
    __syncthreads();
    before[threadIdx.x] += add;
    __syncthreads();
  }
  const int total = before[blockDim.x - 1];
  int attended = before[threadIdx.x] - mine;   // attended keys before this segment: their slots come first
  int masked = total + (int)lo - attended;     // masked keys before it: their slots follow all attended ones
  for (i64 j = lo; j < hi; ++j) s[m[j].x ? attended++ : masked++] = (int)j;
  if (threadIdx.x == 0) {
    seq_q[b] = (int)sq;
    seq_kv[b] = total;
  }
}
// k, v rows (token strides kt, vt) gathered in src's order into dense kp [B, Skv, kw], vp [B, Skv, vw]
#define SDPA_GATHER(TN)                                                                                    \
  KERNEL_ENTRY sdpa_gather_keys_##TN(const TN* __restrict__ k, const TN* __restrict__ v,                   \
                                     const int* __restrict__ src, TN* __restrict__ kp, TN* __restrict__ vp, \
                                     i64 skv, i64 kw, i64 vw, i64 kt, i64 vt, i64 n) {                      \
    for (i64 e = THREAD_FIRST; e < n; e += THREAD_STEP) {                                                  \
      const i64 w = kw + vw, r = e / w, c = e - r * w;                                                     \
      const i64 from = r / skv * skv + src[r];                                                             \
      if (c < kw)                                                                                          \
        kp[r * kw + c] = k[from * kt + c];                                                                 \
      else                                                                                                 \
        vp[r * vw + c - kw] = v[from * vt + c - kw];                                                       \
    }                                                                                                      \
  }
SDPA_GATHER(f16)
SDPA_GATHER(bf16)
SDPA_GATHER(f8e4m3)  // sdpa_fp8: the e4m3 copies of k and v
// The same in 16-byte units, whatever the dtype, where every row and row stride is a whole number of them (the
// lowering checks): one vector load and store per thread and 32-bit index arithmetic, where the kernels above
// move two bytes per thread and divide in 64 bits. ku, vu: units of a k / v row; kt, vt: token strides in units.
KERNEL_ENTRY sdpa_gather_keys_16b(const uint4* __restrict__ k, const uint4* __restrict__ v,
                                  const int* __restrict__ src, uint4* __restrict__ kp, uint4* __restrict__ vp,
                                  int skv, int ku, int vu, i64 kt, i64 vt, int n) {
  const int w = ku + vu;
  for (int e = blockIdx.x * blockDim.x + threadIdx.x; e < n; e += gridDim.x * blockDim.x) {
    const int r = e / w, c = e - r * w;
    const i64 from = (i64)(r / skv * skv + src[r]);
    if (c < ku)
      kp[(i64)r * ku + c] = k[from * kt + c];
    else
      vp[(i64)r * vu + (c - ku)] = v[from * vt + (c - ku)];
  }
}
