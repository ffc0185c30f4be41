// Row kernels: reductions, rms_norm, layer_norm, softmax, l2_normalize (one work-group of WG
// work-items per row, statistics in fp32, two passes for variance) and group_norm (partial
// moments per chunk merged with Chan's formula, then a fused apply with optional silu).

// reduce over the axes described by (rshape, rstride); kept axes by (kshape, kstride).
// mode 0 sum, 1 mean, 2 max. One work-group per output element.
__kernel void reduce(gptr y, long yo, int yt, gcptr x, long xo, int xt, int8 kshape, int8 kstride,
                     int8 rshape, int8 rstride, long rcount, int mode) {
  __local float buf[WG];
  long o = get_group_id(0);
  long base = xo + strided(o, kshape, kstride);
  float acc = mode == 2 ? -INFINITY : 0.0f;
  for (long r = get_local_id(0); r < rcount; r += WG) {
    float v = ldf(x, base + strided(r, rshape, rstride), xt);
    acc = mode == 2 ? nanmax(acc, v) : acc + v;
  }
  acc = mode == 2 ? wg_max(acc, buf) : wg_sum(acc, buf);
  if (get_local_id(0) == 0) stf(y, yo + o, yt, mode == 1 ? acc / (float)rcount : acc);
}

__kernel void rms_norm(gptr y, long yo, int yt, gcptr x, long xo, int xt, gcptr w, long wo, int wt,
                       int has_w, int L, float eps, float offset, int round_first) {
  __local float buf[WG];
  long base = get_group_id(0) * (long)L;
  int l = get_local_id(0);
  float ss = 0.0f;
  for (int j = l; j < L; j += WG) {
    float v = ldf(x, xo + base + j, xt);
    ss += v * v;
  }
  float denom = sqrt(wg_sum(ss, buf) / (float)L + eps);
  for (int j = l; j < L; j += WG) {
    float t = ldf(x, xo + base + j, xt) / denom;
    if (has_w) {
      if (round_first) t = rnd(t, xt);
      t *= ldf(w, wo + j, wt) + offset;
    }
    stf(y, yo + base + j, yt, t);
  }
}

__kernel void layer_norm(gptr y, long yo, int yt, gcptr x, long xo, int xt, gcptr w, long wo,
                         int wt, gcptr b, long bo, int bt, int has_w, int has_b, int L, float eps) {
  __local float buf[WG];
  long base = get_group_id(0) * (long)L;
  int l = get_local_id(0);
  float s = 0.0f;
  for (int j = l; j < L; j += WG) s += ldf(x, xo + base + j, xt);
  float mu = wg_sum(s, buf) / (float)L;
  float q = 0.0f;
  for (int j = l; j < L; j += WG) {
    float d = ldf(x, xo + base + j, xt) - mu;
    q += d * d;
  }
  float denom = sqrt(wg_sum(q, buf) / (float)L + eps);
  for (int j = l; j < L; j += WG) {
    float t = (ldf(x, xo + base + j, xt) - mu) / denom;
    if (has_w) t *= ldf(w, wo + j, wt);
    if (has_b) t += ldf(b, bo + j, bt);
    stf(y, yo + base + j, yt, t);
  }
}

// softmax / l2_normalize along an axis of x viewed [outer, L, inner]: one work-group per
// (outer, inner) row, elements `inner` apart.
__kernel void softmax_axis(gptr y, long yo, int yt, gcptr x, long xo, int xt, int L, int inner) {
  __local float buf[WG];
  long g = get_group_id(0);
  long base = (g / inner) * (long)L * inner + g % inner;
  int l = get_local_id(0);
  float m = -INFINITY;
  for (int j = l; j < L; j += WG) m = nanmax(m, ldf(x, xo + base + (long)j * inner, xt));
  m = wg_max(m, buf);
  float s = 0.0f;
  for (int j = l; j < L; j += WG) s += exp(ldf(x, xo + base + (long)j * inner, xt) - m);
  s = wg_sum(s, buf);
  for (int j = l; j < L; j += WG) {
    long k = base + (long)j * inner;
    stf(y, yo + k, yt, exp(ldf(x, xo + k, xt) - m) / s);
  }
}

__kernel void l2norm_axis(gptr y, long yo, int yt, gcptr x, long xo, int xt, int L, int inner,
                          float eps) {
  __local float buf[WG];
  long g = get_group_id(0);
  long base = (g / inner) * (long)L * inner + g % inner;
  int l = get_local_id(0);
  float s = 0.0f;
  for (int j = l; j < L; j += WG) {
    float v = ldf(x, xo + base + (long)j * inner, xt);
    s += v * v;
  }
  float denom = fmax(sqrt(wg_sum(s, buf)), eps);
  for (int j = l; j < L; j += WG) {
    long k = base + (long)j * inner;
    stf(y, yo + k, yt, ldf(x, xo + k, xt) / denom);
  }
}

// group_norm stage 1: rows of length L (one (n, group) each, contiguous), split in `parts`
// chunks; each work-group writes (count, mean, M2) of its chunk to stats[so + (row*parts+part)*3].
__kernel void gn_partial(__global float* stats, long so, gcptr x, long xo, int xt, long L,
                         int parts) {
  __local float buf[WG];
  long g = get_group_id(0);
  long row = g / parts, part = g % parts;
  long chunk = (L + parts - 1) / parts;
  long lo = part * chunk, hi = min(L, lo + chunk);
  long base = xo + row * L;
  int l = get_local_id(0);
  float s = 0.0f;
  for (long j = lo + l; j < hi; j += WG) s += ldf(x, base + j, xt);
  float cnt = (float)max(hi - lo, 0L);
  float tot = wg_sum(s, buf);
  float mu = cnt > 0.0f ? tot / cnt : 0.0f;
  float q = 0.0f;
  for (long j = lo + l; j < hi; j += WG) {
    float d = ldf(x, base + j, xt) - mu;
    q += d * d;
  }
  q = wg_sum(q, buf);
  if (l == 0) {
    stats[so + g * 3] = cnt;
    stats[so + g * 3 + 1] = mu;
    stats[so + g * 3 + 2] = q;
  }
}

// group_norm stage 2: merge the parts of each row into (mean, sqrt(var + eps)) at ms[mso + row*2].
__kernel void gn_merge(__global float* ms, long mso, __global const float* stats, long so, int rows,
                       int parts, float eps) {
  int row = get_global_id(0);
  if (row >= rows) return;
  float n = 0.0f, mean = 0.0f, m2 = 0.0f;
  for (int p = 0; p < parts; ++p) {
    __global const float* st = stats + so + ((long)row * parts + p) * 3;
    float nb = st[0];
    if (nb == 0.0f) continue;
    float nab = n + nb, delta = st[1] - mean;
    mean += delta * nb / nab;
    m2 += st[2] + delta * delta * n * nb / nab;
    n = nab;
  }
  ms[mso + row * 2] = mean;
  ms[mso + row * 2 + 1] = sqrt(m2 / n + eps);
}

// group_norm stage 3: y = (x - mean) / denom * w[c] + b[c], then silu if `silu`.
__kernel void gn_apply(gptr y, long yo, int yt, gcptr x, long xo, int xt, __global const float* ms,
                       long mso, gcptr w, long wo, int wt, gcptr b, long bo, int bt, long n, long L, int S,
                       int C, int silu) {
  long i = get_global_id(0);
  if (i >= n) return;
  long row = i / L;
  int c = (int)((i / S) % C);
  float t = (ldf(x, xo + i, xt) - ms[mso + row * 2]) / ms[mso + row * 2 + 1];
  t = t * ldf(w, wo + c, wt) + ldf(b, bo + c, bt);
  if (silu) t = t * sigm(t);
  stf(y, yo + i, yt, t);
}

// The softmax numerators of one row of scores p (in place): exp(p * scale - row max) where attended, 0 elsewhere;
// returns their sum. One work-group per row (of Sq query rows per head).
inline float attn_numerators(__global float* p, long row, int Sq, int Skv, float scale, gcptr mask, long mo,
                             int mt, int has_mask, int causal, __local float* buf) {
  int qi = (int)(row % Sq);
  int l = get_local_id(0);
  int limit = causal ? min(Skv, qi + (Skv - Sq) + 1) : Skv;
  float m = -INFINITY;
  for (int j = l; j < limit; j += WG)
    if (!has_mask || ldl(mask, mo + j, mt) != 0) m = fmax(m, p[j] * scale);
  m = wg_max(m, buf);
  float t = 0.0f;
  for (int j = l; j < Skv; j += WG) {
    bool ok = j < limit && (!has_mask || ldl(mask, mo + j, mt) != 0) && m > -INFINITY;
    float e = ok ? exp(p[j] * scale - m) : 0.0f;
    p[j] = e;
    t += e;
  }
  return wg_sum(t, buf);
}

// Attention scores fallback (head_dim too large for the fused kernel): in place on fp32
// scores [rows = heads * Sq, Skv] of one batch element: scale, key mask, causal mask, softmax.
// A row with every key masked becomes zeros.
__kernel void attn_softmax(__global float* s, long so, int Sq, int Skv, float scale, gcptr mask,
                           long mo, int mt, int has_mask, int causal) {
  __local float buf[WG];
  long row = get_group_id(0);
  __global float* p = s + so + row * Skv;
  float t = attn_numerators(p, row, Sq, Skv, scale, mask, mo, mt, has_mask, causal, buf);
  for (int j = get_local_id(0); j < Skv; j += WG) p[j] = t > 0.0f ? p[j] / t : 0.0f;
}

// attn_softmax for sdpa_fp8 (emulated, dif.ops.attention.sdpa_fp8): each numerator e in [0, 1] rounded to e4m3 at
// scale 1/448, times v's scale sc[sco] / 448 and over the unrounded row sum, so that the product with v's
// e4m3 values (unscaled) is the attention's output
__kernel void attn_softmax_fp8(__global float* s, long so, int Sq, int Skv, float scale, gcptr mask, long mo,
                               int mt, int has_mask, int causal, __global const float* sc, long sco) {
  __local float buf[WG];
  long row = get_group_id(0);
  __global float* p = s + so + row * Skv;
  float t = attn_numerators(p, row, Sq, Skv, scale, mask, mo, mt, has_mask, causal, buf);
  float f = sc[sco] / 448.0f;
  for (int j = get_local_id(0); j < Skv; j += WG) p[j] = t > 0.0f ? rnd(p[j] * 448.0f, DT_F8E4M3) * f / t : 0.0f;
}
