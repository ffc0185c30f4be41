// Layout kernels: pure data movement by element size (1, 2, 4, 8 bytes), so they serve every
// dtype without conversion. One strided copy covers transpose, slice, split, concat (strided
// destination), broadcast_to (zero source strides) and upsample_nearest (a 6-d view with zero
// strides); pad, take and fill have their own kernels.

#define LAYOUT(N, T)                                                                              \
  __kernel void copy##N(__global T* y, long yo, __global const T* x, long xo, long n, int8 shape, \
                        int8 ys, int8 xs, int flat) {                                             \
    long i = get_global_id(0);                                                                  \
    if (i >= n) return;                                                                         \
    long di = (flat & 1) ? i : strided(i, shape, ys);                                           \
    long si = (flat & 2) ? i : strided(i, shape, xs);                                           \
    y[yo + di] = x[xo + si];                                                                    \
  }                                                                                             \
                                                                                                \
  __kernel void fill##N(__global T* y, long yo, long n, ulong bits) {                           \
    long i = get_global_id(0);                                                                  \
    if (i >= n) return;                                                                         \
    y[yo + i] = (T)bits;                                                                        \
  }                                                                                             \
                                                                                                \
  /* pad: out shape `os`, in shape `is` (both padded in front), `before` pads; mode 0 constant \
     (bits), 1 reflect (mirror without repeating the edge). Input is contiguous. */            \
  __kernel void pad##N(__global T* y, long yo, __global const T* x, long xo, long n, int8 os,   \
                       int8 is, int8 before, int mode, ulong bits) {                           \
    long i = get_global_id(0);                                                                  \
    if (i >= n) return;                                                                         \
    int o[8] = {os.s0, os.s1, os.s2, os.s3, os.s4, os.s5, os.s6, os.s7};                        \
    int in[8] = {is.s0, is.s1, is.s2, is.s3, is.s4, is.s5, is.s6, is.s7};                       \
    int b[8] = {before.s0, before.s1, before.s2, before.s3,                                     \
                before.s4, before.s5, before.s6, before.s7};                                    \
    long rest = i, src = 0, stride = 1;                                                         \
    for (int d = 7; d >= 0; --d) {                                                              \
      long q = rest / o[d];                                                                     \
      long k = rest - q * o[d] - b[d];                                                          \
      rest = q;                                                                                 \
      if (k < 0 || k >= in[d]) {                                                                \
        if (mode == 0) {                                                                        \
          y[yo + i] = (T)bits;                                                                  \
          return;                                                                               \
        }                                                                                       \
        k = k < 0 ? -k : 2 * (long)(in[d] - 1) - k;                                             \
      }                                                                                         \
      src += k * stride;                                                                        \
      stride *= in[d];                                                                          \
    }                                                                                           \
    y[yo + i] = x[xo + src];                                                                    \
  }                                                                                             \
                                                                                                \
  /* take: x viewed [outer, A, inner], idx [m] -> y [outer, m, inner]; indices clamp to range */ \
  __kernel void take##N(__global T* y, long yo, __global const T* x, long xo, gcptr idx, long io, \
                        int it, long n, int A, int m, int inner) {                              \
    long i = get_global_id(0);                                                                  \
    if (i >= n) return;                                                                         \
    long k = i % inner;                                                                         \
    long j = (i / inner) % m;                                                                   \
    long o = i / ((long)inner * m);                                                             \
    long a = ldl(idx, io + j, it);                                                              \
    a = a < 0 ? 0 : (a >= A ? A - 1 : a);                                                       \
    y[yo + i] = x[xo + (o * A + a) * inner + k];                                                \
  }

LAYOUT(1, uchar)
LAYOUT(2, ushort)
LAYOUT(4, uint)
LAYOUT(8, ulong)
