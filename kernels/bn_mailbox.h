/* bn_mailbox.h — the layout of the records ranks exchange, defined once for the CPU team
 * (src/cpu/cpu_exchange.c) and the GPU kernels (kernels/coop_exchange.cuh).
 *
 * A record carries what one rank publishes for SBN_MAIL_CHUNK channels of one op. The
 * publisher writes count, sig and data, then stores `epoch` with release; a reader waits
 * until `epoch` equals the op's epoch (acquire), then reads the rest. The CPU team waits
 * for chunk 0 of EVERY rank before it compares signatures or leaves the op on a
 * mismatch: leaving earlier would let it run two ops ahead of a peer still reading. A
 * GPU block waits for its chunk j of every rank (whose records carry the signature: one
 * round trip for signature and data); a peer running an op with fewer chunks is seen by
 * the rank's block of chunk 0, whose failure (the rank's stop word) ends the other
 * blocks' waits; a GPU rank that leaves on a mismatch records the failure, and its later
 * kernels publish nothing (coop_exchange.cuh, "failures"), so it cannot run ahead. Records live in
 * mailboxes [src][parity][chunk]; parity is the op's epoch & 1 (double buffering: a rank
 * can overwrite parity p only at op k + 2, after every rank published op k + 1, which
 * each does only after it finished reading op k). The CPU team has one mailbox that every
 * rank reads; a GPU rank has its own, into which every rank pushes.
 *
 * Plain C; __host__ __device__ under nvcc.
 */
#ifndef SYNCBN_BN_MAILBOX_H_
#define SYNCBN_BN_MAILBOX_H_

#include <stdint.h>

#define SBN_MAIL_CHUNK 32     /* channels per record (on the GPU: one warp, lane = channel) */
#define SBN_MAIL_REC_FLOATS 4 /* floats per channel: forward (mean_hi, mean_lo, m2, unused),
                                 backward: the GPU's compensated sums (sum_dy hi, lo,
                                 sum_dy_xmu hi, lo), the CPU team's (sum_dy, sum_dy_xmu) */

/* 528 bytes, 16-byte aligned. data[SBN_MAIL_REC_FLOATS * i + f]: float f of the chunk's
   channel i. */
typedef struct {
  uint32_t epoch; /* the op's epoch: 1, 2, ... per rank (0: never published). 32 bits:
                     a team runs at most 2^32 - 1 ops (at 10 us an op, 12 hours of
                     nothing but SyncBN); at the wrap a chunk never used before could
                     match its zeroed record */
  uint32_t sig;   /* sbn_op_sig (bn_op.h): ranks running different ops see it */
  int64_t count;  /* n * spatial of the publishing rank */
  float data[SBN_MAIL_CHUNK * SBN_MAIL_REC_FLOATS];
} sbn_mail_rec_t;

#ifdef __CUDACC__
#define SBN_MAIL_HD __host__ __device__ __forceinline__
#else
#define SBN_MAIL_HD inline
#endif

/* Records per (src, parity) of a mailbox sized for max_channels. */
static SBN_MAIL_HD int sbn_mail_chunks(int64_t max_channels) {
  return (int)((max_channels + SBN_MAIL_CHUNK - 1) / SBN_MAIL_CHUNK);
}
/* The record of (src, the op with epoch `epoch`, chunk) in a mailbox. */
static SBN_MAIL_HD int64_t sbn_mail_index(int src, uint32_t epoch, int chunk, int nchunks_max) {
  return ((int64_t)src * 2 + (int64_t)(epoch & 1u)) * nchunks_max + chunk;
}

#endif /* SYNCBN_BN_MAILBOX_H_ */
