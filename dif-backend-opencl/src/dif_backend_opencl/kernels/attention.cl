// Fused attention (flash style, online softmax) for head dims HD (q/k) and HDV (v), set at
// build time so each work-item keeps its query row and output accumulator in registers.
// One work-item per query, BQ queries per work-group for one (batch, head); keys and values
// stream through local memory BK at a time. GQA: query head h reads kv head h / (Hq / Hkv).
// key_mask (True = attend) and causal (key j visible to query i when j <= i + Skv - Sq) are
// applied per key; a query that sees no key writes zeros, as the reference does.

#ifndef HD
#define HD 64
#endif
#ifndef HDV
#define HDV 64
#endif
#define BQ 32
#define BK 16

__kernel __attribute__((reqd_work_group_size(BQ, 1, 1))) void flash_attention(
    gptr o, long oo, int ot, gcptr q, long qo, int qt, gcptr k, long ko, int kt, gcptr v, long vo,
    int vt, gcptr mask, long mo, int mt, int has_mask, int Sq, int Skv, int Hq, int Hkv,
    float scale, int causal) {
  __local float Ks[BK][HD];
  __local float Vs[BK][HDV];
  int lq = get_local_id(0);
  int qi = get_group_id(0) * BQ + lq;
  int bh = get_group_id(1);
  int b = bh / Hq, h = bh % Hq;
  int hk = h / (Hq / Hkv);
  bool active = qi < Sq;
  float qr[HD], acc[HDV];
  long qbase = qo + (((long)b * Sq + (active ? qi : 0)) * Hq + h) * HD;
  for (int d = 0; d < HD; ++d) qr[d] = ldf(q, qbase + d, qt);
  for (int d = 0; d < HDV; ++d) acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  int visible = causal ? min(Skv, qi + (Skv - Sq) + 1) : Skv;
  for (int k0 = 0; k0 < Skv; k0 += BK) {
    for (int e = lq; e < BK * HD; e += BQ) {
      int j = e / HD, d = e % HD;
      Ks[j][d] = k0 + j < Skv ? ldf(k, ko + (((long)b * Skv + k0 + j) * Hkv + hk) * HD + d, kt) : 0.0f;
    }
    for (int e = lq; e < BK * HDV; e += BQ) {
      int j = e / HDV, d = e % HDV;
      Vs[j][d] = k0 + j < Skv ? ldf(v, vo + (((long)b * Skv + k0 + j) * Hkv + hk) * HDV + d, vt) : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    if (active && k0 < visible) {
      float s[BK];
      float tmax = -INFINITY;
      for (int j = 0; j < BK; ++j) {
        int kj = k0 + j;
        bool ok = kj < visible && (!has_mask || ldl(mask, mo + (long)b * Skv + kj, mt) != 0);
        float dot = 0.0f;
        for (int d = 0; d < HD; ++d) dot += qr[d] * Ks[j][d];
        s[j] = ok ? dot * scale : -INFINITY;
        tmax = fmax(tmax, s[j]);
      }
      if (tmax > -INFINITY) {
        float mnew = fmax(m, tmax);
        float corr = exp(m - mnew);
        l *= corr;
        for (int d = 0; d < HDV; ++d) acc[d] *= corr;
        for (int j = 0; j < BK; ++j) {
          if (s[j] == -INFINITY) continue;
          float p = exp(s[j] - mnew);
          l += p;
          for (int d = 0; d < HDV; ++d) acc[d] += p * Vs[j][d];
        }
        m = mnew;
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (!active) return;
  long obase = oo + (((long)b * Sq + qi) * Hq + h) * HDV;
  for (int d = 0; d < HDV; ++d) stf(o, obase + d, ot, l > 0.0f ? acc[d] / l : 0.0f);
}
