// dif OpenCL prelude: prepended to every kernel source (see library.py). It defines the storage
// type codes (DT_*), loads that widen any storage type to fp32 (or to long for integer paths),
// stores that narrow back with round-to-nearest-even, and index helpers for strided views.
//
// Every kernel takes buffers as `gptr` (bytes) + an element offset + a dtype code, so one
// compiled program serves f32, f16, bf16 and the integer types: a uniform switch is cheaper
// than compiling every kernel for every dtype combination. OpenCL has no bf16 type: bf16 is
// stored as ushort (the top half of an fp32). f16 uses vload_half / vstore_half_rte, which are
// core OpenCL (no cl_khr_fp16 needed, since arithmetic is always fp32). No fp8 type either:
// f8e4m3 (e4m3fn: no infinities, one NaN per sign) is stored as uchar bits, decoded and encoded
// below exactly as ml_dtypes.float8_e4m3fn converts.
// Never built with -cl-fast-relaxed-math: exp/rsqrt precision matters in norms and softmax.

#define DT_F32 0
#define DT_F16 1
#define DT_BF16 2
#define DT_I32 3
#define DT_I64 4
#define DT_I8 5
#define DT_U8 6
#define DT_BOOL 7
#define DT_F8E4M3 8

#ifndef WG
#define WG 64  // work-group size of the row/reduction kernels (power of two; set by the host)
#endif

typedef __global uchar* gptr;
typedef __global const uchar* gcptr;

inline float bf16_to_f32(ushort h) { return as_float(((uint)h) << 16); }

inline ushort f32_to_bf16(float f) {
  uint u = as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (ushort)((u >> 16) | 0x40u);  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return (ushort)(u >> 16);
}

inline float f8e4m3_to_f32(uchar b) {
  uint sign = (uint)(b & 0x80u) << 24;
  uint e = (b >> 3) & 0xfu, m = b & 7u;
  if (e == 15u && m == 7u) return as_float(sign | 0x7fc00000u);  // the format's NaN
  if (e == 0u) return as_float(sign | as_uint((float)m * 0x1p-9f));  // subnormal: m * 2^-9
  return as_float(sign | ((e + 120u) << 23) | (m << 20));  // exponent bias 7 -> 127
}

// Round to nearest even, as ml_dtypes' cast does: NaN and magnitudes beyond 464 (the tie between
// 448, the largest finite value, and the absent 480) become NaN. A saturating quantizer clips to
// +-448 first (kernels/quant.cl), as the reference does.
inline uchar f32_to_f8e4m3(float f) {
  uint u = as_uint(f);
  uchar sign = (uchar)((u >> 24) & 0x80u);
  float a = fabs(f);
  if (!(a <= 464.0f)) return sign | 0x7fu;
  if (a < 0x1p-6f) return sign | (uchar)rint(a * 0x1p9f);  // subnormal (8 is 2^-6's code)
  u = as_uint(a);
  u += 0x7ffffu + ((u >> 20) & 1u);  // drop 20 mantissa bits, ties to even (a carry bumps e)
  return sign | (uchar)((u >> 20) - (120u << 3));
}

inline float ldf(gcptr p, long i, int dt) {
  switch (dt) {
    case DT_F16: return vload_half((size_t)i, (__global const half*)p);
    case DT_BF16: return bf16_to_f32(((__global const ushort*)p)[i]);
    case DT_I32: return (float)((__global const int*)p)[i];
    case DT_I64: return (float)((__global const long*)p)[i];
    case DT_I8: return (float)((__global const char*)p)[i];
    case DT_U8: case DT_BOOL: return (float)p[i];
    case DT_F8E4M3: return f8e4m3_to_f32(p[i]);
    default: return ((__global const float*)p)[i];
  }
}

inline void stf(gptr p, long i, int dt, float v) {
  switch (dt) {
    case DT_F16: vstore_half_rte(v, (size_t)i, (__global half*)p); break;
    case DT_BF16: ((__global ushort*)p)[i] = f32_to_bf16(v); break;
    case DT_I32: ((__global int*)p)[i] = (int)v; break;
    case DT_I64: ((__global long*)p)[i] = (long)v; break;
    case DT_I8: ((__global char*)p)[i] = (char)(int)v; break;
    case DT_U8: p[i] = (uchar)(int)v; break;
    case DT_BOOL: p[i] = (uchar)(v != 0.0f); break;
    case DT_F8E4M3: p[i] = f32_to_f8e4m3(v); break;
    default: ((__global float*)p)[i] = v;
  }
}

inline long ldl(gcptr p, long i, int dt) {
  switch (dt) {
    case DT_I32: return (long)((__global const int*)p)[i];
    case DT_I64: return ((__global const long*)p)[i];
    case DT_I8: return (long)((__global const char*)p)[i];
    case DT_U8: case DT_BOOL: return (long)p[i];
    default: return (long)ldf(p, i, dt);
  }
}

inline void stl(gptr p, long i, int dt, long v) {
  switch (dt) {
    case DT_I32: ((__global int*)p)[i] = (int)v; break;
    case DT_I64: ((__global long*)p)[i] = v; break;
    case DT_I8: ((__global char*)p)[i] = (char)v; break;
    case DT_U8: p[i] = (uchar)v; break;
    case DT_BOOL: p[i] = (uchar)(v != 0); break;
    default: stf(p, i, dt, (float)v);
  }
}

// v rounded to storage type dt and widened again (what a store + load would give).
inline float rnd(float v, int dt) {
  if (dt == DT_BF16) return bf16_to_f32(f32_to_bf16(v));
  if (dt == DT_F8E4M3) return f8e4m3_to_f32(f32_to_f8e4m3(v));
  if (dt == DT_F16) {
    ushort h;
    vstore_half_rte(v, 0, (__private half*)&h);
    return vload_half(0, (__private const half*)&h);
  }
  return v;
}

// Element offset of linear index i of a row-major `shape` (rank <= 8, padded in front with 1s)
// in a view with element `strides`.
inline long strided(long i, int8 shape, int8 strides) {
  int s[8] = {shape.s0, shape.s1, shape.s2, shape.s3, shape.s4, shape.s5, shape.s6, shape.s7};
  int t[8] = {strides.s0, strides.s1, strides.s2, strides.s3, strides.s4, strides.s5, strides.s6, strides.s7};
  long off = 0;
  for (int d = 7; d >= 0 && i > 0; --d) {
    long q = i / s[d];
    off += (i - q * s[d]) * (long)t[d];
    i = q;
  }
  return off;
}

inline float sigm(float v) {
  float e = exp(-fabs(v));  // split by sign so exp never overflows
  return v >= 0.0f ? 1.0f / (1.0f + e) : e / (1.0f + e);
}

inline float gelu_erf(float v) { return 0.5f * v * (1.0f + erf(v * 0.70710678118654752f)); }

inline float gelu_tanh(float v) {
  return 0.5f * v * (1.0f + tanh(0.79788456080286536f * (v + 0.044715f * v * v * v)));
}

// act codes shared by glu and fused epilogues: 0 silu, 1 gelu (erf), 2 gelu (tanh), 3 none
inline float act(float v, int code) {
  switch (code) {
    case 0: return v * sigm(v);
    case 1: return gelu_erf(v);
    case 2: return gelu_tanh(v);
    default: return v;
  }
}

// Sum / max over the WG work-items of a work-group (local size must be exactly WG).
inline float wg_sum(float v, __local float* buf) {
  int l = get_local_id(0);
  buf[l] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = WG / 2; s > 0; s >>= 1) {
    if (l < s) buf[l] += buf[l + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  float r = buf[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}

inline float nanmax(float a, float b) { return (isnan(a) || a > b) ? a : b; }

inline float wg_max(float v, __local float* buf) {
  int l = get_local_id(0);
  buf[l] = v;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = WG / 2; s > 0; s >>= 1) {
    if (l < s) buf[l] = nanmax(buf[l], buf[l + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  float r = buf[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  return r;
}
