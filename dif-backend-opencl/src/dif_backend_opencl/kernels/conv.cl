// Convolution: a direct 3x3 kernel (stride 1, dilation 1, one group: the VAE's workhorse) and
// im2col for everything else (the GEMM in linalg.cl then multiplies weights by the columns).

#define TW 16
#define TH 16
#define OCB 8
#define CB 4

// y[n, o, oy, ox] = bias[o] + sum_{c, ky, kx} w[o, c, ky, kx] * x[n, c, oy + ky - pt, ox + kx - pl]
// Work-group: a 16x16 output tile x OCB output channels; CB input channels staged per step.
// Global size (16 * tiles_x * tiles_y, 16 * ceil(O / OCB), N): group dim 0 = spatial tile,
// dim 1 = output-channel block, dim 2 = image.
__kernel __attribute__((reqd_work_group_size(TW, TH, 1))) void conv3x3(
    gptr y, long yo, int yt, gcptr x, long xo, int xt, gcptr w, long wo, int wt, gcptr bias,
    long bo, int bt, int has_bias, int C, int H, int W, int O, int Ho, int Wo, int pt, int pl) {
  __local float tile[CB][TH + 2][TW + 2];
  __local float wl[OCB][CB][9];
  int tx = get_local_id(0), ty = get_local_id(1);
  int tid = ty * TW + tx;
  int tiles_x = (Wo + TW - 1) / TW;
  int gx = get_group_id(0) % tiles_x, gy = get_group_id(0) / tiles_x;
  int ob = get_group_id(1) * OCB;
  int n = get_group_id(2);
  int ox = gx * TW + tx, oy = gy * TH + ty;
  float acc[OCB];
  for (int i = 0; i < OCB; ++i) acc[i] = 0.0f;
  for (int c0 = 0; c0 < C; c0 += CB) {
    for (int e = tid; e < CB * (TH + 2) * (TW + 2); e += TW * TH) {
      int cc = e / ((TH + 2) * (TW + 2));
      int r = e % ((TH + 2) * (TW + 2));
      int yy = r / (TW + 2), xx = r % (TW + 2);
      int iy = gy * TH + yy - pt, ix = gx * TW + xx - pl, c = c0 + cc;
      bool in = c < C && iy >= 0 && iy < H && ix >= 0 && ix < W;
      tile[cc][yy][xx] = in ? ldf(x, xo + (((long)n * C + c) * H + iy) * W + ix, xt) : 0.0f;
    }
    for (int e = tid; e < OCB * CB * 9; e += TW * TH) {
      int oc = e / (CB * 9), r = e % (CB * 9);
      int cc = r / 9, t = r % 9;
      bool in = ob + oc < O && c0 + cc < C;
      wl[oc][cc][t] = in ? ldf(w, wo + ((long)(ob + oc) * C + c0 + cc) * 9 + t, wt) : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int cc = 0; cc < CB; ++cc)
      for (int ky = 0; ky < 3; ++ky)
        for (int kx = 0; kx < 3; ++kx) {
          float xv = tile[cc][ty + ky][tx + kx];
          for (int i = 0; i < OCB; ++i) acc[i] += xv * wl[i][cc][ky * 3 + kx];
        }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (ox >= Wo || oy >= Ho) return;
  for (int i = 0; i < OCB; ++i) {
    int o = ob + i;
    if (o >= O) break;
    float v = acc[i] + (has_bias ? ldf(bias, bo + o, bt) : 0.0f);
    stf(y, yo + (((long)n * O + o) * Ho + oy) * Wo + ox, yt, v);
  }
}

// Columns of output pixels [p0, p0 + pc) of one image and group: col[(c*kh + i)*kw + j][p]
// (fp32, contiguous rows of pc) = x[c, oy*sh - pt + i*dh, ox*sw - pl + j*dw] or 0 outside.
__kernel void im2col(__global float* col, long colo, gcptr x, long xo, int xt, long n, int H,
                     int W, int kh, int kw, int sh, int sw, int pt, int pl, int dh, int dw, int Wo,
                     int p0, int pc) {
  long i = get_global_id(0);
  if (i >= n) return;
  int p = (int)(i % pc);
  long r = i / pc;
  int j = (int)(r % kw);
  int ii = (int)((r / kw) % kh);
  long c = r / ((long)kw * kh);
  int pp = p0 + p;
  int oy = pp / Wo, ox = pp % Wo;
  int iy = oy * sh - pt + ii * dh, ix = ox * sw - pl + j * dw;
  bool in = iy >= 0 && iy < H && ix >= 0 && ix < W;
  col[colo + i] = in ? ldf(x, xo + (c * H + iy) * W + ix, xt) : 0.0f;
}
