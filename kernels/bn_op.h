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
   kind, 29 layout, 28-27 the epilogue's activation (sbn_sig_with_act; 0 identity), 26
   SBN_SIG_ANY_LAYOUT, 25-24 dtype, 23-21 the rank's call number mod 7 or 7, unnumbered
   (sbn_sig_with_call, sbn_sig_unnumbered), 20-0 C). Ranks exchange it with their
   records; two ops are the same op as sbn_sig_same_op and sbn_sig_layouts say. C < 2^21 (max_channels is at most
   2^20, src/config.c). */
#define SBN_SIG_C_BITS 21
#define SBN_SIG_DTYPE_SHIFT 24
/* The call number: every op call a rank makes on its comm, refused at its arguments or
   not, counts (src/ops.c), so a call refused on some ranks only puts the ranks out of
   step, and the refused rank's next op differs from the op its peers wait in (instead
   of pairing with it). Mod 7: a rank refused 7 times in a row while its peers wait
   pairs again. The eighth value, SBN_SIG_UNNUMBERED, matches any number: a kernel
   captured into a CUDA graph carries it (src/gpu/gpu_launch.c), since a replay keeps
   the arguments of its capture and would fail with a peer's later eager op under
   another number; and so does a GPU virtual team's launch (one launch runs every rank:
   its ranks cannot be out of step). */
#define SBN_SIG_CALL_SHIFT 21
#define SBN_SIG_CALLS 7u
#define SBN_SIG_UNNUMBERED 7u
/* A rank whose layout is immaterial: no values (n = 0), planes of one value (spatial 1)
   or one channel; its bytes are the same in NCHW and NHWC (an empty batch or 1x1 planes
   of a channels_last model, which PyTorch may stride either way), so it matches its
   peers' layout, whichever it is. */
#define SBN_SIG_ANY_LAYOUT (1u << 26)
#define SBN_SIG_LAYOUT_BIT (1u << 29)
SBN_HD uint32_t sbn_op_sig(int kind, int dtype, int layout, int64_t c) {
  return (uint32_t)kind << 30 | (uint32_t)layout << 29 | (uint32_t)dtype << SBN_SIG_DTYPE_SHIFT |
         ((uint32_t)c & ((1u << SBN_SIG_C_BITS) - 1u));
}
/* The signature of a rank's op on its tensors (n values of `spatial` each per channel). */
SBN_HD uint32_t sbn_op_sig_of(int kind, int dtype, int layout, int64_t n, int64_t c,
                              int64_t spatial) {
  const uint32_t any = (n == 0 || spatial == 1 || c == 1) ? SBN_SIG_ANY_LAYOUT : 0u;
  return sbn_op_sig(kind, dtype, layout, c) | any;
}
/* Ranks run the same op when their signatures agree but for the layout (sbn_sig_core)
   and the call number (sbn_sig_same_but_call), their numbers agree where given
   (sbn_sig_call_bit), and the layouts that matter agree: across all ranks' signatures, sbn_sig_layouts' bits
   OR'ed together are not both set (1: NCHW, 2: NHWC; 0 where the layout is immaterial).
   Order-free, so every rank that sees all the signatures comes to the same verdict. */
SBN_HD uint32_t sbn_sig_core(uint32_t sig) { return sig & ~(SBN_SIG_ANY_LAYOUT | SBN_SIG_LAYOUT_BIT); }
SBN_HD int sbn_sig_layouts(uint32_t sig) {
  return (sig & SBN_SIG_ANY_LAYOUT) ? 0 : (sig & SBN_SIG_LAYOUT_BIT) ? 2 : 1;
}
SBN_HD int sbn_sig_kind(uint32_t sig) { return (int)(sig >> 30); }
SBN_HD int sbn_sig_layout(uint32_t sig) { return (int)(sig >> 29 & 1u); }
SBN_HD int sbn_sig_dtype(uint32_t sig) { return (int)(sig >> SBN_SIG_DTYPE_SHIFT & 3u); }
SBN_HD uint32_t sbn_sig_with_act(uint32_t sig, int act) { return sig | ((uint32_t)act & 3u) << 27; }
SBN_HD int sbn_sig_act(uint32_t sig) { return (int)(sig >> 27 & 3u); }
#define SBN_SIG_CALL_MASK (7u << SBN_SIG_CALL_SHIFT)
SBN_HD uint32_t sbn_sig_without_call(uint32_t sig) { return sig & ~SBN_SIG_CALL_MASK; }
SBN_HD uint32_t sbn_sig_with_call(uint32_t sig, uint32_t call) {
  return sbn_sig_without_call(sig) | (call % SBN_SIG_CALLS) << SBN_SIG_CALL_SHIFT;
}
SBN_HD uint32_t sbn_sig_unnumbered(uint32_t sig) { return sig | SBN_SIG_CALL_MASK; }
SBN_HD uint32_t sbn_sig_call(uint32_t sig) { return sig >> SBN_SIG_CALL_SHIFT & 7u; }
/* Whether two ranks' signatures name the same op but for the call number (and their
   layouts: sbn_sig_layouts). */
SBN_HD int sbn_sig_same_but_call(uint32_t a, uint32_t b) {
  return (sbn_sig_core(a ^ b) & ~SBN_SIG_CALL_MASK) == 0u;
}
/* A signature's call number as a bit (0: unnumbered). Ranks are in step when the OR of
   their bits has at most one bit set (sbn_sig_calls_apart): order-free, as
   sbn_sig_layouts, so every rank that sees all the signatures decides alike. (A compare
   of each peer's number with a rank's own would not be: an unnumbered rank matches two
   numbered ones that differ.) */
SBN_HD uint32_t sbn_sig_call_bit(uint32_t sig) {
  const uint32_t c = sbn_sig_call(sig);
  return c == SBN_SIG_UNNUMBERED ? 0u : 1u << c;
}
SBN_HD int sbn_sig_calls_apart(uint32_t bits) { return (bits & (bits - 1u)) != 0u; }
/* Two ranks' signatures name the same op at the same call (or one is unnumbered). A
   pairwise compare: transitive only among numbered signatures (a CPU team's). */
SBN_HD int sbn_sig_same_op(uint32_t a, uint32_t b) {
  return sbn_sig_same_but_call(a, b) && !sbn_sig_calls_apart(sbn_sig_call_bit(a) | sbn_sig_call_bit(b));
}
SBN_HD int64_t sbn_sig_c(uint32_t sig) { return (int64_t)(sig & ((1u << SBN_SIG_C_BITS) - 1u)); }

#endif /* SYNCBN_BN_OP_H_ */
