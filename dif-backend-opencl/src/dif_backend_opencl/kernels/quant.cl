// Quantized ops (dif.ops.quant): symmetric per-row quantization. The W8A8 GEMM is linalg.cl's with
// its scale epilogue, the int4 GEMM linalg.cl's with its nibble-unpacking weight loads; fp8 e4m3
// values are uchar bits converted by ldf / stf (common.cl).

// a / b rounded to nearest as IEEE division is: OpenCL lets fp32 `/` be 2.5 ulp off (GPUs use
// that unless built with -cl-fp32-correctly-rounded-divide-sqrt), and one ulp in x / scale moves a
// value across a rounding boundary of the quantized grid. Steps to the neighbour while that makes
// the remainder a - q * b (computed with one rounding by fma) smaller: the nearest quotient has the
// smallest remainder, and a quotient of floats is never exactly halfway between two.
inline float div_rn(float a, float b) {
  float q = a / b;
  for (int i = 0; i < 3; ++i) {
    float r = fma(-q, b, a);
    float next = nextafter(q, ((r > 0.0f) == (b > 0.0f)) ? INFINITY : -INFINITY);
    if (!(fabs(fma(-next, b, a)) < fabs(r))) break;
    q = next;
  }
  return q;
}

// quantize_rows over rows of L (one work-group each): scale = amax / qmax (1 for an all-zero row)
// to s[row] (fp32), q = x / scale clipped to +-qmax, then rounded to nearest even (rint for i8,
// the encoder for f8e4m3): the reference's saturating quantizer.
__kernel void quantize_rows(gptr q, long qo, int qt, __global float* s, long so, gcptr x, long xo,
                            int xt, int L, float qmax) {
  __local float buf[WG];
  long row = get_group_id(0);
  long base = row * (long)L;
  int l = get_local_id(0);
  float m = 0.0f;
  for (int j = l; j < L; j += WG) m = fmax(m, fabs(ldf(x, xo + base + j, xt)));
  m = wg_max(m, buf);
  float scale = m > 0.0f ? div_rn(m, qmax) : 1.0f;
  if (l == 0) s[so + row] = scale;
  for (int j = l; j < L; j += WG) {
    float v = clamp(div_rn(ldf(x, xo + base + j, xt), scale), -qmax, qmax);
    stf(q, qo + base + j, qt, qt == DT_I8 ? rint(v) : v);  // clip then rint = rint then clip: qmax is whole
  }
}

// sdpa_fp8 emulated (dif.ops.attention.sdpa_fp8): the per-tensor scale of x's n values to s[so], amax / 448 (1 for
// an all-zero tensor); one work-group.
__kernel void tensor_scale(__global float* s, long so, gcptr x, long xo, int xt, long n) {
  __local float buf[WG];
  int l = get_local_id(0);
  float m = 0.0f;
  for (long j = l; j < n; j += WG) m = fmax(m, fabs(ldf(x, xo + j, xt)));
  m = wg_max(m, buf);
  if (l == 0) s[so] = m > 0.0f ? div_rn(m, 448.0f) : 1.0f;
}

// y = e4m3(x / s[so]), times s[so] when `scaled`, stored in y's dtype: x's values on the e4m3 grid at a tensor's
// scale (fp32 for the emulated fp8 attention; e4m3 itself for rms_norm_rope_quant, whose scale is known beforehand)
__kernel void quantize_tensor(gptr y, long yo, int yt, gcptr x, long xo, int xt, __global const float* s, long so,
                              int scaled, long n) {
  long i = get_global_id(0);
  if (i >= n) return;
  float sc = s[so];
  float v = rnd(clamp(div_rn(ldf(x, xo + i, xt), sc), -448.0f, 448.0f), DT_F8E4M3);
  stf(y, yo + i, yt, scaled ? v * sc : v);
}

// rms_norm_rope_quant (dif.ops.quant.norm_bound_scale): s[so] = root * m / 448, m the largest |w + offset| over the
// four weights of `dim` values (w repeated where fewer share the scale), root = sqrt(dim) (the host's, correctly
// rounded); 1 when m is 0. One work-group.
__kernel void norm_bound_scale(__global float* s, long so, gcptr w0, long o0, int t0, gcptr w1, long o1, int t1,
                               gcptr w2, long o2, int t2, gcptr w3, long o3, int t3, int dim, float offset,
                               float root) {
  __local float buf[WG];
  int l = get_local_id(0);
  float m = 0.0f;
  for (int j = l; j < dim; j += WG) {
    m = fmax(m, fabs(ldf(w0, o0 + j, t0) + offset));
    m = fmax(m, fabs(ldf(w1, o1 + j, t1) + offset));
    m = fmax(m, fabs(ldf(w2, o2 + j, t2) + offset));
    m = fmax(m, fabs(ldf(w3, o3 + j, t3) + offset));
  }
  m = wg_max(m, buf);
  if (l == 0) s[so] = m > 0.0f ? div_rn(root * m, 448.0f) : 1.0f;
}

// y = x * s[so] in fp32: e4m3 values quantized by their producer (sdpa_fp8_qk's q and k) at their scale
__kernel void scale_tensor(__global float* y, long yo, gcptr x, long xo, int xt, __global const float* s, long so,
                           long n) {
  long i = get_global_id(0);
  if (i >= n) return;
  y[yo + i] = ldf(x, xo + i, xt) * s[so];
}

// the attention's fp32 result y at v's scale s[so] rounded to e4m3, stored in o's dtype
__kernel void fp8_round_out(gptr o, long oo, int ot, __global const float* y, long yo, __global const float* s,
                            long so, long n) {
  long i = get_global_id(0);
  if (i >= n) return;
  float sv = s[so];
  stf(o, oo + i, ot, rnd(clamp(div_rn(y[yo + i], sv), -448.0f, 448.0f), DT_F8E4M3) * sv);
}
