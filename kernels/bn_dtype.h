/* bn_dtype.h — fp16 / bf16 <-> fp32 conversions, bit-exact on host and device.
 *
 * Widening is exact. Narrowing rounds to nearest, ties to even, with IEEE overflow to
 * infinity and NaN kept NaN (quiet), matching __float2half_rn / __float2bfloat16_rn.
 */
#ifndef SYNCBN_BN_DTYPE_H_
#define SYNCBN_BN_DTYPE_H_

#include <stdint.h>
#include <string.h>

#include "bn_math.h" /* SBN_HD */

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

#endif /* SYNCBN_BN_DTYPE_H_ */
