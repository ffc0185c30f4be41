// Data movement, dtype-agnostic (elements moved as 1/2/4/8-byte words): strided copies (transpose,
// slice, split, concat, broadcast, upsample), tiled 2-D transposes, fills, reflect padding, gathers (take /
// embedding), and the bit test of uploaded weights (executor: NaN / inf).

// meta = [rank, shape[rank], src_strides[rank], dst_strides[rank]] (elements); the host widens the element
// (up to 16 bytes) when the innermost run is contiguous and aligned on both sides.
struct alignas(16) u128 {
  u64 lo, hi;
};
#define COPY(BITS, U)                                                                                      \
  KERNEL_ENTRY strided_copy_u##BITS(const U* __restrict__ src, U* __restrict__ dst,          \
                                                  const i64* __restrict__ meta, i64 n) {                   \
    BWalk<2> walk(meta, THREAD_FIRST, THREAD_STEP);                                                        \
    GRID_STRIDE_ILP(base, step, n) {                                                                       \
      U v[ILP];                                                                                            \
      i64 to[ILP];                                                                                         \
      ILP_FOR(e) {                                                                                         \
        const i64 i = base + e * step;                                                                     \
        i64 off[2];                                                                                        \
        walk.offsets(i, off);                                                                              \
        walk.advance();                                                                                    \
        if (i < n) {                                                                                       \
          v[e] = src[off[0]];                                                                              \
          to[e] = off[1];                                                                                  \
        }                                                                                                  \
      }                                                                                                    \
      ILP_FOR(e) {                                                                                         \
        if (base + e * step < n) dst[to[e]] = v[e];                                                        \
      }                                                                                                    \
    }                                                                                                      \
  }

#define LAYOUT(BITS, U)                                                                                    \
  COPY(BITS, U)                                                                                            \
  KERNEL_ENTRY fill_u##BITS(U* __restrict__ dst, U value, i64 n) {                           \
    GRID_STRIDE(i, n) { dst[i] = value; }                                                                  \
  }                                                                                                        \
  /* *flag |= 1 when an element has every bit of `mask` set (a float's exponent all ones: NaN / inf) */    \
  KERNEL_ENTRY any_masked_u##BITS(const U* __restrict__ x, U mask, i64 n, int* __restrict__ flag) {        \
    int found = 0;                                                                                         \
    GRID_STRIDE(i, n) { found |= (x[i] & mask) == mask; }                                                  \
    if (__syncthreads_or(found) && threadIdx.x == 0) atomicOr(flag, 1);                                    \
  }                                                                                                        \
  /* meta = [rank, out_shape, in_shape, before, in_strides]; single reflection (pad < size) */             \
  KERNEL_ENTRY pad_reflect_u##BITS(const U* __restrict__ src, U* __restrict__ dst,           \
                                                 const i64* __restrict__ meta, i64 n) {                    \
    const int r = (int)meta[0];                                                                            \
    GRID_STRIDE(i, n) {                                                                                    \
      i64 rem = i, off = 0;                                                                                \
      for (int d = r - 1; d >= 0; --d) {                                                                   \
        const i64 sz_in = meta[1 + r + d];                                                                 \
        const i64 c = divmod(rem, meta[1 + d]);                                                            \
        i64 ci = c - meta[1 + 2 * r + d];                                                                  \
        if (ci < 0) ci = -ci;                                                                              \
        if (ci >= sz_in) ci = 2 * (sz_in - 1) - ci;                                                        \
        off += ci * meta[1 + 3 * r + d];                                                                   \
      }                                                                                                    \
      dst[i] = src[off];                                                                                   \
    }                                                                                                      \
  }                                                                                                        \
  TAKE(BITS, U, i32, int)                                                                                  \
  TAKE(BITS, U, i64, i64)

// out[o, j, k] = x[o, idx[j], k] with x viewed as [outer, axis_len, inner]; indices clamped into range.
#define TAKE(BITS, U, IN, I)                                                                               \
  KERNEL_ENTRY take_u##BITS##_##IN(const U* __restrict__ x, const I* __restrict__ idx,       \
                                                 U* __restrict__ y, i64 n, i64 n_idx, i64 axis_len,        \
                                                 i64 inner) {                                              \
    GRID_STRIDE(i, n) {                                                                                    \
      i64 t = i;                                                                                           \
      const i64 k = divmod(t, inner), j = divmod(t, n_idx), o = t;                                         \
      i64 a = (i64)idx[j];                                                                                 \
      a = a < 0 ? 0 : (a >= axis_len ? axis_len - 1 : a);                                                 \
      y[i] = x[(o * axis_len + a) * inner + k];                                                            \
    }                                                                                                      \
  }

// upsample_nearest x2 of rows of w values (w % 4 == 0, 4-value aligned): a thread reads 4 values of source row r
// and writes the 8 they become to output rows 2r and 2r + 1 (row-major [N, C, 2H, 2W]: source row r = (n, c, h)
// lands on output rows 2r and 2r + 1), as 4-value vector stores. The strided copy would move 2-byte elements.
#define UPSAMPLE2X(BITS, U)                                                                                \
  KERNEL_ENTRY upsample2x_u##BITS(const U* __restrict__ x, U* __restrict__ y, i64 rows, i64 w) { \
    struct alignas(4 * sizeof(U)) Quad {                                                                   \
      U v[4];                                                                                              \
    };                                                                                                     \
    const i64 quads = w / 4;                                                                               \
    GRID_STRIDE(t, rows * quads) {                                                                         \
      const i64 r = t / quads, q = t - r * quads;                                                          \
      const Quad in = *reinterpret_cast<const Quad*>(x + r * w + 4 * q);                                   \
      const Quad lo = {{in.v[0], in.v[0], in.v[1], in.v[1]}}, hi = {{in.v[2], in.v[2], in.v[3], in.v[3]}}; \
      Quad* top = reinterpret_cast<Quad*>(y + 4 * r * w + 8 * q);                                          \
      Quad* bottom = reinterpret_cast<Quad*>(y + (4 * r + 2) * w + 8 * q);                                 \
      top[0] = lo;                                                                                         \
      top[1] = hi;                                                                                         \
      bottom[0] = lo;                                                                                      \
      bottom[1] = hi;                                                                                      \
    }                                                                                                      \
  }
// A batched 2-D transpose through a 32x32 shared-memory tile: src [batch][rows][cols] (row stride src_row,
// batch stride src_batch), dst [batch][cols][rows] (row stride dst_row, batch stride dst_batch). The strided copy
// walks the destination in order, so its reads jump a whole source row per element (13 ms for one
// 32x4608x4608 fp32 attention matrix on the H200); here a tile is read along source rows and written along
// destination rows, both coalesced. The tile's extra column keeps the column reads free of bank conflicts.
#define TRANSPOSE_TILE(BITS, U)                                                                            \
  KERNEL_ENTRY transpose_tile_u##BITS(const U* __restrict__ src, U* __restrict__ dst, i64 rows, i64 cols,  \
                                      i64 src_row, i64 dst_row, i64 src_batch, i64 dst_batch) {            \
    __shared__ U tile[32][33];                                                                             \
    src += (i64)blockIdx.z * src_batch;                                                                    \
    dst += (i64)blockIdx.z * dst_batch;                                                                    \
    const i64 r0 = (i64)blockIdx.y * 32, c0 = (i64)blockIdx.x * 32;                                        \
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {                                                   \
      const i64 r = r0 + k, c = c0 + threadIdx.x;                                                          \
      if (r < rows && c < cols) tile[k][threadIdx.x] = src[r * src_row + c];                               \
    }                                                                                                      \
    __syncthreads();                                                                                       \
    for (int k = threadIdx.y; k < 32; k += blockDim.y) {                                                   \
      const i64 c = c0 + k, r = r0 + threadIdx.x;                                                          \
      if (c < cols && r < rows) dst[c * dst_row + r] = tile[threadIdx.x][k];                               \
    }                                                                                                      \
  }
TRANSPOSE_TILE(8, unsigned char)
TRANSPOSE_TILE(16, unsigned short)
TRANSPOSE_TILE(32, unsigned int)
TRANSPOSE_TILE(64, u64)

UPSAMPLE2X(16, unsigned short)
UPSAMPLE2X(32, unsigned int)

LAYOUT(8, unsigned char)
LAYOUT(16, unsigned short)
LAYOUT(32, unsigned int)
LAYOUT(64, u64)
COPY(128, u128)
