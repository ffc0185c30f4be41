// Fused ops made by dif's optimizer passes (dif.ops.fused): the norm / rope / residual glue around
// the GEMMs in one pass over memory. Each rounds its intermediate to the storage type the unfused
// program stored it in (`rnd`), so results match the unfused kernels to the last rounding.
// Broadcast operands are addressed through `strided` unless bit k of `flat` says operand k is
// contiguous like the output.

#define IDX(k, i, shape, st) (((flat >> (k)) & 1) ? (i) : strided((i), (shape), (st)))

// norm_modulate: one work-group per row of L; kind 0 = layer_norm, 1 = rms_norm (no affine),
// then y = rnd(norm(x)) * (1 + scale) + shift with scale / shift broadcast to x.
__kernel void norm_modulate(gptr y, long yo, int yt, gcptr x, long xo, int xt, gcptr s, long so,
                            int st, gcptr t, long to, int tt, int L, int rms, float eps,
                            int8 shape, int8 ss, int8 stt, int flat) {
  __local float buf[WG];
  long base = get_group_id(0) * (long)L;
  int l = get_local_id(0);
  float mu = 0.0f;
  if (!rms) {
    float acc = 0.0f;
    for (int j = l; j < L; j += WG) acc += ldf(x, xo + base + j, xt);
    mu = wg_sum(acc, buf) / (float)L;
  }
  float q = 0.0f;
  for (int j = l; j < L; j += WG) {
    float d = ldf(x, xo + base + j, xt) - mu;
    q += d * d;
  }
  float denom = sqrt(wg_sum(q, buf) / (float)L + eps);
  // The innermost collapsed dim is a multiple of L, so within a row an operand's offset moves by
  // its innermost stride: one index decomposition per row, not per element.
  long s0 = so + IDX(0, base, shape, ss), t0 = to + IDX(1, base, shape, stt);
  for (int j = l; j < L; j += WG) {
    float v = rnd((ldf(x, xo + base + j, xt) - mu) / denom, xt);
    float sc = ldf(s, s0 + (long)j * ss.s7, st);
    float sh = ldf(t, t0 + (long)j * stt.s7, tt);
    stf(y, yo + base + j, yt, v * (1.0f + sc) + sh);
  }
}

// gated_residual: y = x + rnd(gate * v), all three broadcast to the output.
__kernel void gated_residual(gptr y, long yo, int yt, gcptr x, long xo, int xt, gcptr g, long go,
                             int gt, gcptr v, long vo, int vt, long n, int8 shape, int8 sx, int8 sg,
                             int8 sv, int flat) {
  long i = get_global_id(0);
  if (i >= n) return;
  float a = ldf(x, xo + IDX(0, i, shape, sx), xt);
  float m = ldf(g, go + IDX(1, i, shape, sg), gt) * ldf(v, vo + IDX(2, i, shape, sv), vt);
  stf(y, yo + i, yt, a + rnd(m, gt));
}

// rms_norm_rope on x[B, S, H, D]: one work-group per (b, s, h) row of D = HD channels (HD is a
// build define, so the normalized row fits in local memory); rms_norm with weight over the row,
// rounded to x's storage type, then rope of the leading R channels with cos / sin [S, R]
// (mode 0 = pairs, 1 = half); channels >= R pass the normalized value through.
#ifdef HD
__kernel void rms_norm_rope(gptr y, long yo, int yt, gcptr x, long xo, int xt, gcptr w, long wo,
                            int wt, gcptr c, long cofs, int ct, gcptr sn, long sofs, int snt, int S,
                            int H, int R, int half_mode, float eps, float offset, int round_first) {
  __local float buf[WG];
  __local float row[HD];
  long r = get_group_id(0);
  long base = r * HD;
  int l = get_local_id(0);
  float ss = 0.0f;
  for (int j = l; j < HD; j += WG) {
    float v = ldf(x, xo + base + j, xt);
    row[j] = v;
    ss += v * v;
  }
  float denom = sqrt(wg_sum(ss, buf) / (float)HD + eps);
  for (int j = l; j < HD; j += WG) {
    float t = row[j] / denom;
    if (round_first) t = rnd(t, xt);
    row[j] = rnd(t * (ldf(w, wo + j, wt) + offset), xt);
  }
  barrier(CLK_LOCAL_MEM_FENCE);  // the rotation reads partner channels of other work-items
  int pos = (int)((r / H) % S);
  int h2 = R / 2;
  for (int j = l; j < HD; j += WG) {
    float v = row[j];
    if (j < R) {
      float other = half_mode ? (j < h2 ? -row[j + h2] : row[j - h2])
                              : ((j & 1) == 0 ? -row[j + 1] : row[j - 1]);
      v = v * ldf(c, cofs + (long)pos * R + j, ct) + other * ldf(sn, sofs + (long)pos * R + j, snt);
    }
    stf(y, yo + base + j, yt, v);
  }
}
#endif

// adamw_update (dif.ops.optim): one AdamW step of f32 master weights p and moments m, v with the f32
// gradient g; step_size, root_bc2 and decay are one-element device values. Each operation rounded on
// its own, as the chain of core ops it stands for.
__kernel void adamw_update(gptr po, long poo, int pot, gptr mo, long moo, int mot, gptr vo, long voo, int vot,
                           gcptr p, long pof, int pt, gcptr g, long go, int gt, gcptr m, long mof, int mt,
                           gcptr v, long vof, int vt, gcptr ss, long sso, int sst, gcptr rb, long rbo, int rbt,
                           gcptr dk, long dko, int dkt, long n, float b1, float c1, float b2, float c2,
                           float eps) {
  long i = get_global_id(0);
  if (i >= n) return;
  float gi = ldf(g, go + i, gt);
  float mi = ldf(m, mof + i, mt) * b1 + gi * c1;
  float g2 = gi * gi;
  float vi = ldf(v, vof + i, vt) * b2 + g2 * c2;
  float denom = sqrt(vi) / ldf(rb, rbo, rbt) + eps;
  float step = ldf(ss, sso, sst) * (mi / denom);
  stf(po, poo + i, pot, ldf(p, pof + i, pt) * ldf(dk, dko, dkt) - step);
  stf(mo, moo + i, mot, mi);
  stf(vo, voo + i, vot, vi);
}
