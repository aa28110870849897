/* cpu_exchange.c — the cross-rank exchange of the CPU team.
 *
 * The protocol is the GPU's (DESIGN.md), with C11 atomics for the memory ordering:
 *   step 0: op k of a rank uses mailbox parity k & 1 (double buffering by epoch parity);
 *   step 1: write count, signature and payload into this rank's slot, then store the
 *           epoch k with release: the flag is published after the data;
 *   step 2: for every rank, load its slot's epoch with acquire until it equals k (then its
 *           data is visible), bounded by the team's timeout;
 *   step 3: check every rank published the same op (signature and channel count).
 * Epochs are per-rank counters advanced by the op itself: nothing comes from the caller.
 */
#include <sched.h>
#include <string.h>
#include <time.h>

#include "cpu.h"

static int64_t now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* Waits until *epoch == k. Spins briefly, then yields, then sleeps, so W ranks on fewer
   cores make progress. Returns sbnSuccess, the team's abort reason, or sbnTimeout. */
static sbnResult_t wait_epoch(sbn_team_t* t, _Atomic uint64_t* epoch, uint64_t k,
                              int64_t deadline_ns) {
  for (uint64_t spin = 0;; spin++) {
    if (atomic_load_explicit(epoch, memory_order_acquire) == k) return sbnSuccess;
    int reason = atomic_load_explicit(&t->abort_reason, memory_order_acquire);
    if (reason != sbnSuccess) return (sbnResult_t)reason;
    if (spin < 64) continue;
    if (spin < 4096) {
      sched_yield();
    } else {
      struct timespec ts = {0, 20000}; /* 20 us */
      nanosleep(&ts, NULL);
    }
    if ((spin & 15) == 0 && now_ns() > deadline_ns) {
      if (atomic_load_explicit(epoch, memory_order_acquire) == k) return sbnSuccess;
      sbn_team_abort(t, sbnTimeout);
      return (sbnResult_t)atomic_load(&t->abort_reason);
    }
  }
}

sbnResult_t sbn_cpu_exchange(sbnComm_t comm, uint32_t sig, int64_t c, int floats_per_channel,
                             int64_t count, const float* local, sbn_peer_entry_t* peers) {
  sbn_team_t* t = comm->team;
  uint64_t k = comm->epoch + 1;
  int parity = (int)(k & 1);

  /* step 1: publish */
  sbn_mailbox_t* mine = &t->mail[comm->rank * 2 + parity];
  mine->count = count;
  mine->op = sig;
  mine->c = c;
  memcpy(mine->payload, local, (size_t)(floats_per_channel * c) * sizeof(float));
  atomic_store_explicit(&mine->epoch, k, memory_order_release);
  comm->epoch = k;

  /* step 2: wait for every rank */
  int64_t deadline = now_ns() + t->cfg.timeout_ms * 1000000;
  for (int q = 0; q < t->nranks; q++) {
    sbn_mailbox_t* slot = &t->mail[q * 2 + parity];
    sbnResult_t r = wait_epoch(t, &slot->epoch, k, deadline);
    if (r == sbnTimeout)
      return sbn_fail(comm, r,
                      "rank %d waited %lld ms for rank %d (op %llu of the team); the team is "
                      "aborted. Every rank must make the same calls (SBN_TIMEOUT_MS sets the wait)",
                      comm->rank, (long long)t->cfg.timeout_ms, q, (unsigned long long)k);
    if (r != sbnSuccess)
      return sbn_fail(comm, r, "rank %d: the team was aborted (%s) while waiting for rank %d",
                      comm->rank, sbnGetResultName(r), q);
    peers[q].count = slot->count;
    peers[q].payload = slot->payload;
  }

  /* step 3: every rank must run the same op */
  for (int q = 0; q < t->nranks; q++) {
    const sbn_mailbox_t* slot = &t->mail[q * 2 + parity];
    if (slot->op != sig || slot->c != c)
      return sbn_fail(comm, sbnInvalidUsage,
                      "op mismatch: rank %d runs op 0x%x with C=%lld, rank %d runs op 0x%x with "
                      "C=%lld (every rank must call the same op with the same C, dtype, layout)",
                      comm->rank, sig, (long long)c, q, slot->op, (long long)slot->c);
  }
  return sbnSuccess;
}
