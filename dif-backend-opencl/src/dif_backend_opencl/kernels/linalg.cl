// Tiled GEMM used by linear, matmul, conv2d (im2col) and the sdpa fallback:
//   C[z][m, n] = alpha * sum_k A[z][m, k] * B[z][k, n] (+ bias), fp32 accumulation, and the
// epilogues of the fused ops: times rs[m] * cs[n] before the bias (scaled_linear's row and output
// channel scales, fp32), and + R[z][m, n] after rounding to C's storage type (linear_add's
// residual, laid out like C: the add reads the product as the unfused program stored it).
// Operands are strided views (A(m,k) at a + m*sam + k*sak, B(k,n) at b + k*sbk + n*sbn, C(m,n)
// at c + m*ldc + n), so transposed weights ([out, in] for linear) and head-strided attention
// tensors need no copy. With group > 0, B is int4_linear's weight instead: B(k,n) = (nibble(n, k)
// - 8) * bs[n, k / group], nibble k of row n the low half of byte n*K/2 + k/2 for even k, the high
// half for odd k, rounded to A's storage type as the reference rounds it; the weight is unpacked
// in the tile loads and never stored wider. Batch z = get_group_id(2) decomposes over bshape
// (row-major, 4 dims) with per-operand element strides. Work-group 16x16, each work-item a 4x4 register block of a
// 64x64 tile; 16-deep k slices staged in local memory, loaded along whichever axis is contiguous.

#define TM 64
#define TN 64
#define TK 16
#define LS 16

__kernel __attribute__((reqd_work_group_size(LS, LS, 1))) void gemm(
    gptr c, long co, int ct, gcptr a, long ao, int at, gcptr b, long bo, int bt, gcptr bias,
    long biaso, int biast, int bias_mode, __global const float* rs, long rso,
    __global const float* cs, long cso, int scaled, gcptr r, long ro, int rt, int has_r, int M,
    int N, int K, long sam, long sak, long sbk, long sbn, long ldc, int4 bshape, long4 bsa,
    long4 bsb, long4 bsc, float alpha, __global const uchar* bq, long bqo, gcptr bs, long bso,
    int bst, int group) {
  __local float As[TK][TM];
  __local float Bs[TK][TN];
  int tx = get_local_id(0), ty = get_local_id(1);
  int tid = ty * LS + tx;
  int m0 = get_group_id(1) * TM, n0 = get_group_id(0) * TN;
  long z = get_group_id(2);
  long z3 = z % bshape.s3;
  z /= bshape.s3;
  long z2 = z % bshape.s2;
  z /= bshape.s2;
  long z1 = z % bshape.s1, z0 = z / bshape.s1;
  long oa = ao + z0 * bsa.s0 + z1 * bsa.s1 + z2 * bsa.s2 + z3 * bsa.s3;
  long ob = bo + z0 * bsb.s0 + z1 * bsb.s1 + z2 * bsb.s2 + z3 * bsb.s3;
  long oc = co + z0 * bsc.s0 + z1 * bsc.s1 + z2 * bsc.s2 + z3 * bsc.s3;
  float acc[4][4];
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 4; ++j) acc[i][j] = 0.0f;
  for (int k0 = 0; k0 < K; k0 += TK) {
    for (int e = tid; e < TM * TK; e += LS * LS) {
      int mm, kk;
      if (sak == 1) { kk = e % TK; mm = e / TK; } else { mm = e % TM; kk = e / TM; }
      int gm = m0 + mm, gk = k0 + kk;
      As[kk][mm] = (gm < M && gk < K) ? ldf(a, oa + gm * sam + gk * sak, at) : 0.0f;
    }
    for (int e = tid; e < TK * TN; e += LS * LS) {
      int nn, kk;
      if (sbk == 1) { kk = e % TK; nn = e / TK; } else { nn = e % TN; kk = e / TN; }
      int gn = n0 + nn, gk = k0 + kk;
      if (!(gn < N && gk < K)) {
        Bs[kk][nn] = 0.0f;
      } else if (group > 0) {
        uchar byte = bq[bqo + (long)gn * (K / 2) + gk / 2];
        int nib = (gk & 1) ? (byte >> 4) : (byte & 15);
        float scale = ldf(bs, bso + (long)gn * (K / group) + gk / group, bst);
        Bs[kk][nn] = rnd((float)(nib - 8) * scale, at);  // 4 x 11 bits: exact in fp32 before the rounding
      } else {
        Bs[kk][nn] = ldf(b, ob + gk * sbk + gn * sbn, bt);
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < TK; ++kk) {
      float ar[4], br[4];
      for (int i = 0; i < 4; ++i) ar[i] = As[kk][ty + i * LS];
      for (int j = 0; j < 4; ++j) br[j] = Bs[kk][tx + j * LS];
      for (int i = 0; i < 4; ++i)
        for (int j = 0; j < 4; ++j) acc[i][j] += ar[i] * br[j];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  for (int i = 0; i < 4; ++i) {
    int gm = m0 + ty + i * LS;
    if (gm >= M) continue;
    for (int j = 0; j < 4; ++j) {
      int gn = n0 + tx + j * LS;
      if (gn >= N) continue;
      float v = acc[i][j] * alpha;
      if (scaled) v = v * rs[rso + gm] * cs[cso + gn];
      if (bias_mode == 1) v += ldf(bias, biaso + gn, biast);
      if (bias_mode == 2) v += ldf(bias, biaso + gm, biast);
      long ci = oc + gm * ldc + gn;
      if (has_r) v = rnd(v, ct) + ldf(r, ro - co + ci, rt);
      stf(c, ci, ct, v);
    }
  }
}
