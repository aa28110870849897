/* bn_dtype.h — the element types: one table (SBN_DTYPES) of every dtype the library
 * runs, and the fp16 / bf16 <-> fp32 conversions, bit-exact on host and device.
 *
 * Widening is exact. Narrowing rounds to nearest, ties to even, with IEEE overflow to
 * infinity and NaN kept NaN (quiet), matching __float2half_rn / __float2bfloat16_rn.
 */
#ifndef SYNCBN_BN_DTYPE_H_
#define SYNCBN_BN_DTYPE_H_

#include <stdint.h>
#include <string.h>

#include "bn_math.h" /* SBN_HD */
#include "syncbn.h"   /* sbnDataType_t */

SBN_HD uint32_t sbn_f32_bits(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  return u;
}

SBN_HD float sbn_f32_from_bits(uint32_t u) {
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

SBN_HD float sbn_bf16_to_f32(uint16_t h) { return sbn_f32_from_bits((uint32_t)h << 16); }

SBN_HD uint16_t sbn_f32_to_bf16(float f) {
  uint32_t u = sbn_f32_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u); /* NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest even; overflow carries to inf */
  return (uint16_t)(u >> 16);
}

SBN_HD float sbn_f16_to_f32(uint16_t h) {
  uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t man = h & 0x3ffu;
  if (exp == 0x1fu) return sbn_f32_from_bits(sign | 0x7f800000u | (man << 13)); /* inf/NaN */
  if (exp == 0) {
    /* zero or subnormal: man * 2^-24, exact in fp32 */
    float v = (float)man * 5.9604644775390625e-08f;
    return sign ? -v : v;
  }
  return sbn_f32_from_bits(sign | ((exp + 112u) << 23) | (man << 13));
}

SBN_HD uint16_t sbn_f32_to_f16(float f) {
  uint32_t u = sbn_f32_bits(f);
  uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
  uint32_t abs = u & 0x7fffffffu;
  if (abs > 0x7f800000u) return (uint16_t)(sign | 0x7e00u); /* NaN */
  if (abs >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: inf */
  if (abs < 0x38800000u) {
    /* below 2^-14: fp16 subnormal (or zero), value = round(|f| * 2^24) * 2^-24 */
    if (abs < 0x33000000u) return sign; /* < 2^-25: rounds to 0 (ties to even at 2^-25) */
    uint32_t man = (abs & 0x7fffffu) | 0x800000u;
    uint32_t shift = 126u - (abs >> 23); /* 14..24 for exponents -25..-15 */
    uint32_t q = man >> shift;
    uint32_t rem = man & ((1u << shift) - 1u);
    uint32_t half = 1u << (shift - 1u);
    if (rem > half || (rem == half && (q & 1u))) q += 1u;
    return (uint16_t)(sign | q);
  }
  /* normal: rebias exponent, round the 13 dropped mantissa bits to nearest even */
  uint32_t r = abs - 0x38000000u; /* exponent bias 127 -> 15 */
  r += 0xfffu + ((r >> 13) & 1u);
  return (uint16_t)(sign | (r >> 13));
}

/* ---- the dtypes: one row each ------------------------------------------------------------ */
/* X(value, bytes, name, tag, bits); bits: the significand's precision (the unit roundoff
   is 2^-bits). Generated from it: the count, validity, sizes, names and unit roundoffs
   below, the CPU team's element loops (src/cpu/cpu_reduce.c), the kernels' element traits
   (Dt<> in kernels/coop_mem.cuh) and their kernel tables (kernels/coop.cu). `tag` names
   the row's conversions: sbn_<tag>_get / sbn_<tag>_put here, <tag>_bits_to_f32 /
   f32_to_<tag>_bits in coop_mem.cuh (device intrinsics, the same bits). A new dtype is a
   value in syncbn.h's sbnDataType_t, a row here, and its conversions. */
#define SBN_DTYPES(X)               \
  X(sbnFloat32, 4, "fp32", f32, 24) \
  X(sbnFloat16, 2, "fp16", f16, 11) \
  X(sbnBFloat16, 2, "bf16", bf16, 8)

#define SBN_DT_COUNT_(value, bytes, name, tag, bits) +1
enum { SBN_DTYPE_COUNT = 0 SBN_DTYPES(SBN_DT_COUNT_) };
#undef SBN_DT_COUNT_
/* the values are 0 .. SBN_DTYPE_COUNT - 1: tables are indexed by them */
#define SBN_DT_CHECK_(value, bytes, name, tag, bits) \
  typedef char sbn_dtype_check_##tag[(int)(value) >= 0 && (int)(value) < SBN_DTYPE_COUNT ? 1 : -1];
SBN_DTYPES(SBN_DT_CHECK_)
#undef SBN_DT_CHECK_

SBN_HD int sbn_dtype_valid(int dt) { return dt >= 0 && dt < SBN_DTYPE_COUNT; }

/* constexpr in C++: the kernels size their held registers by it (coop_plan.h) */
#ifdef __cplusplus
#define SBN_DT_CONSTEXPR constexpr
#else
#define SBN_DT_CONSTEXPR
#endif
SBN_HD SBN_DT_CONSTEXPR int sbn_dtype_size(int dt) {
  switch (dt) {
#define SBN_DT_CASE_(value, bytes, name, tag, bits) \
  case value: return bytes;
    SBN_DTYPES(SBN_DT_CASE_)
#undef SBN_DT_CASE_
  }
  return 0;
}

SBN_HD const char* sbn_dtype_name(int dt) {
  switch (dt) {
#define SBN_DT_CASE_(value, bytes, name, tag, bits) \
  case value: return name;
    SBN_DTYPES(SBN_DT_CASE_)
#undef SBN_DT_CASE_
  }
  return "unknown";
}

/* The unit roundoff of a dtype (round to nearest: a value's relative error when stored):
   2^-24 fp32, 2^-11 fp16, 2^-8 bf16. */
SBN_HD float sbn_dtype_unit(int dt) {
  switch (dt) {
#define SBN_DT_CASE_(value, bytes, name, tag, bits) \
  case value: return 1.0f / (float)(1u << (bits));
    SBN_DTYPES(SBN_DT_CASE_)
#undef SBN_DT_CASE_
  }
  return 1.0f;
}

/* The least positive value of a dtype (its least subnormal): 2^-149 fp32, 2^-24 fp16,
   2^-133 bf16; below half of it a value stores as 0. */
SBN_HD float sbn_dtype_least(int dt) {
  return dt == sbnFloat16 ? 0x1p-24f : dt == sbnBFloat16 ? 0x1p-133f : 0x1p-149f;
}

/* Element i of a tensor as fp32, and fp32 stored as element i (rounded to nearest even). */
SBN_HD float sbn_f32_get(const void* p, int64_t i) { return ((const float*)p)[i]; }
SBN_HD void sbn_f32_put(void* p, int64_t i, float v) { ((float*)p)[i] = v; }
SBN_HD float sbn_f16_get(const void* p, int64_t i) { return sbn_f16_to_f32(((const uint16_t*)p)[i]); }
SBN_HD void sbn_f16_put(void* p, int64_t i, float v) { ((uint16_t*)p)[i] = sbn_f32_to_f16(v); }
SBN_HD float sbn_bf16_get(const void* p, int64_t i) { return sbn_bf16_to_f32(((const uint16_t*)p)[i]); }
SBN_HD void sbn_bf16_put(void* p, int64_t i, float v) { ((uint16_t*)p)[i] = sbn_f32_to_bf16(v); }

#endif /* SYNCBN_BN_DTYPE_H_ */
