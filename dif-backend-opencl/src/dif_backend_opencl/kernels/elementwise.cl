// Elementwise kernels: unary math, broadcasting binaries / compares / where / modulate, glu, rope.
// One work-item per output element; `n` guards the rounded-up global size. Binary operands are
// addressed through `strided` unless bit k of `flat` says operand k is contiguous like the output.

#define UNARY(NAME, EXPR)                                                                        \
  __kernel void un_##NAME(gptr y, long yo, int yt, gcptr x, long xo, int xt, long n, float p0, \
                          float p1) {                                                          \
    long i = get_global_id(0);                                                                 \
    if (i >= n) return;                                                                        \
    float v = ldf(x, xo + i, xt);                                                              \
    stf(y, yo + i, yt, (EXPR));                                                                \
  }

UNARY(neg, -v)
UNARY(abs, fabs(v))
UNARY(exp, exp(v))
UNARY(log, log(v))
UNARY(sqrt, sqrt(v))
UNARY(rsqrt, rsqrt(v))
UNARY(reciprocal, 1.0f / v)
UNARY(square, v * v)
UNARY(sin, sin(v))
UNARY(cos, cos(v))
UNARY(tanh, tanh(v))
UNARY(sigmoid, sigm(v))
UNARY(silu, v * sigm(v))
UNARY(relu, (v < 0.0f ? 0.0f : v))
UNARY(round, rint(v))  /* ties to even (the default rounding mode) */
UNARY(gelu, gelu_erf(v))
UNARY(gelu_tanh, gelu_tanh(v))
UNARY(clamp, (v < p0 ? p0 : (v > p1 ? p1 : v)))
UNARY(affine, v * p0 + p1)
UNARY(convert, v)

// integer-domain unary (cast between integer types, neg/abs of ints)
#define UNARY_I(NAME, EXPR)                                                                      \
  __kernel void uni_##NAME(gptr y, long yo, int yt, gcptr x, long xo, int xt, long n) {        \
    long i = get_global_id(0);                                                                 \
    if (i >= n) return;                                                                        \
    long v = ldl(x, xo + i, xt);                                                               \
    stl(y, yo + i, yt, (EXPR));                                                                \
  }

UNARY_I(convert, v)
UNARY_I(neg, -v)
UNARY_I(abs, (v < 0 ? -v : v))

// float -> integer: truncate toward zero (as C, numpy and torch do)
__kernel void un_trunc(gptr y, long yo, int yt, gcptr x, long xo, int xt, long n) {
  long i = get_global_id(0);
  if (i >= n) return;
  stl(y, yo + i, yt, (long)trunc(ldf(x, xo + i, xt)));
}

#define IDX(k, i, shape, st) (((flat >> (k)) & 1) ? (i) : strided((i), (shape), (st)))

#define BINARY(NAME, EXPR)                                                                        \
  __kernel void bin_##NAME(gptr y, long yo, int yt, gcptr a, long ao, int at, gcptr b, long bo,  \
                           int bt, long n, int8 shape, int8 sa, int8 sb, int flat) {             \
    long i = get_global_id(0);                                                                  \
    if (i >= n) return;                                                                         \
    float u = ldf(a, ao + IDX(0, i, shape, sa), at);                                            \
    float w = ldf(b, bo + IDX(1, i, shape, sb), bt);                                            \
    stf(y, yo + i, yt, (EXPR));                                                                 \
  }

BINARY(add, u + w)
BINARY(sub, u - w)
BINARY(mul, u * w)
BINARY(div, u / w)
BINARY(maximum, ((isnan(u) || u > w) ? u : w))
BINARY(minimum, ((isnan(u) || u < w) ? u : w))
BINARY(pow, pow(u, w))
BINARY(less, (u < w ? 1.0f : 0.0f))
BINARY(greater, (u > w ? 1.0f : 0.0f))
BINARY(equal, (u == w ? 1.0f : 0.0f))

#define BINARY_I(NAME, EXPR)                                                                      \
  __kernel void bini_##NAME(gptr y, long yo, int yt, gcptr a, long ao, int at, gcptr b, long bo, \
                            int bt, long n, int8 shape, int8 sa, int8 sb, int flat) {            \
    long i = get_global_id(0);                                                                  \
    if (i >= n) return;                                                                         \
    long u = ldl(a, ao + IDX(0, i, shape, sa), at);                                             \
    long w = ldl(b, bo + IDX(1, i, shape, sb), bt);                                             \
    stl(y, yo + i, yt, (EXPR));                                                                 \
  }

BINARY_I(add, u + w)
BINARY_I(sub, u - w)
BINARY_I(mul, u * w)
BINARY_I(maximum, (u > w ? u : w))
BINARY_I(minimum, (u < w ? u : w))
BINARY_I(less, (long)(u < w))
BINARY_I(greater, (long)(u > w))
BINARY_I(equal, (long)(u == w))

// where(cond, a, b): integer path moves values exactly; the float path is exact too because
// every float storage type round-trips through fp32.
__kernel void where_f(gptr y, long yo, int yt, gcptr c, long co, int ct, gcptr a, long ao, int at,
                      gcptr b, long bo, int bt, long n, int8 shape, int8 sc, int8 sa, int8 sb,
                      int flat) {
  long i = get_global_id(0);
  if (i >= n) return;
  long ic = IDX(0, i, shape, sc);
  if (ldl(c, co + ic, ct) != 0)
    stf(y, yo + i, yt, ldf(a, ao + IDX(1, i, shape, sa), at));
  else
    stf(y, yo + i, yt, ldf(b, bo + IDX(2, i, shape, sb), bt));
}

__kernel void where_i(gptr y, long yo, int yt, gcptr c, long co, int ct, gcptr a, long ao, int at,
                      gcptr b, long bo, int bt, long n, int8 shape, int8 sc, int8 sa, int8 sb,
                      int flat) {
  long i = get_global_id(0);
  if (i >= n) return;
  long ic = IDX(0, i, shape, sc);
  if (ldl(c, co + ic, ct) != 0)
    stl(y, yo + i, yt, ldl(a, ao + IDX(1, i, shape, sa), at));
  else
    stl(y, yo + i, yt, ldl(b, bo + IDX(2, i, shape, sb), bt));
}

// modulate(x, scale, shift) = x * (1 + scale) + shift
__kernel void modulate(gptr y, long yo, int yt, gcptr x, long xo, int xt, gcptr s, long so, int st,
                       gcptr t, long to, int tt, long n, int8 shape, int8 sx, int8 ss, int8 stt,
                       int flat) {
  long i = get_global_id(0);
  if (i >= n) return;
  float v = ldf(x, xo + IDX(0, i, shape, sx), xt);
  float sc = ldf(s, so + IDX(1, i, shape, ss), st);
  float sh = ldf(t, to + IDX(2, i, shape, stt), tt);
  stf(y, yo + i, yt, v * (1.0f + sc) + sh);
}

// glu over rows of 2*h: first -> act(a) * b, second -> a * act(b)
__kernel void glu(gptr y, long yo, int yt, gcptr x, long xo, int xt, long n, int h, int code,
                  int gate_first) {
  long i = get_global_id(0);
  if (i >= n) return;
  long r = i / h, j = i - r * h;
  float a = ldf(x, xo + r * 2 * h + j, xt);
  float b = ldf(x, xo + r * 2 * h + h + j, xt);
  stf(y, yo + i, yt, gate_first ? act(a, code) * b : a * act(b, code));
}

// rope on x[B, S, H, D] with cos/sin [S, R]; mode 0 = pairs (interleaved), 1 = half.
__kernel void rope(gptr y, long yo, int yt, gcptr x, long xo, int xt, gcptr c, long cofs, int ct,
                   gcptr s, long sofs, int st, long n, int S, int H, int D, int R, int half_mode) {
  long i = get_global_id(0);
  if (i >= n) return;
  int d = (int)(i % D);
  float v = ldf(x, xo + i, xt);
  if (d >= R) {
    stf(y, yo + i, yt, v);
    return;
  }
  int pos = (int)((i / ((long)D * H)) % S);
  float cv = ldf(c, cofs + (long)pos * R + d, ct);
  float sv = ldf(s, sofs + (long)pos * R + d, st);
  float other;
  if (half_mode) {
    int h2 = R / 2;
    other = d < h2 ? -ldf(x, xo + i + h2, xt) : ldf(x, xo + i - h2, xt);
  } else {
    other = (d & 1) == 0 ? -ldf(x, xo + i + 1, xt) : ldf(x, xo + i - 1, xt);
  }
  stf(y, yo + i, yt, v * cv + other * sv);
}
