/* bn_op.h — what an op is, defined once for the host (src/), the CPU team and the kernels:
 * its kind and its signature, the word every rank publishes with its records so that
 * ranks running different ops find out instead of mixing their statistics.
 *
 * Plain C; __host__ __device__ under nvcc (SBN_HD, bn_math.h).
 */
#ifndef SYNCBN_BN_OP_H_
#define SYNCBN_BN_OP_H_

#include <stdint.h>

#include "bn_dtype.h"
#include "bn_math.h" /* SBN_HD */
#include "syncbn.h"

/* The kinds of op that exchange statistics. The values index the kernels' tables. */
enum { SBN_OP_FORWARD = 0, SBN_OP_BACKWARD = 1, SBN_OP_KINDS = 2 };

/* The signature of an op: kind, layout, dtype and C in one 32-bit word (bits 31-30
   kind, 29 layout, 28-27 the epilogue's activation (sbn_sig_with_act; 0 identity),
   26-24 dtype, 23-0 C). Ranks exchange it with their records; two ops are the same op
   iff their signatures are equal. C < 2^24 (max_channels is at most 2^20,
   src/config.c). */
#define SBN_SIG_C_BITS 24
SBN_HD uint32_t sbn_op_sig(int kind, int dtype, int layout, int64_t c) {
  return (uint32_t)kind << 30 | (uint32_t)layout << 29 | (uint32_t)dtype << SBN_SIG_C_BITS |
         ((uint32_t)c & ((1u << SBN_SIG_C_BITS) - 1u));
}
SBN_HD int sbn_sig_kind(uint32_t sig) { return (int)(sig >> 30); }
SBN_HD int sbn_sig_layout(uint32_t sig) { return (int)(sig >> 29 & 1u); }
SBN_HD int sbn_sig_dtype(uint32_t sig) { return (int)(sig >> SBN_SIG_C_BITS & 7u); }
SBN_HD uint32_t sbn_sig_with_act(uint32_t sig, int act) { return sig | ((uint32_t)act & 3u) << 27; }
SBN_HD int sbn_sig_act(uint32_t sig) { return (int)(sig >> 27 & 3u); }
SBN_HD int64_t sbn_sig_c(uint32_t sig) { return (int64_t)(sig & ((1u << SBN_SIG_C_BITS) - 1u)); }

#endif /* SYNCBN_BN_OP_H_ */
