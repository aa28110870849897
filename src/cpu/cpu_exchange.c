/* cpu_exchange.c — the cross-rank exchange of the CPU team.
 *
 * The protocol and the records are the GPU's (kernels/bn_mailbox.h, DESIGN.md), with the
 * compiler's atomics for the memory ordering:
 *   step 0: op k of a rank uses mailbox parity k & 1 (double buffering by epoch parity);
 *   step 1: for each chunk of 32 channels, write count, signature and data into this
 *           rank's record, then store the record's epoch k with release: the flag is
 *           published after the data;
 *   step 2: for every rank, load its chunk-0 record's epoch with acquire until it equals
 *           k (then its data is visible), bounded by the team's timeout;
 *   step 3: check every rank published the same op (the signatures of chunk 0), then
 *           wait for the other chunks of every rank.
 * Every rank waits for every rank's chunk 0 before it may fail on a mismatch: that is
 * what keeps the double buffering sound (bn_mailbox.h), as in the GPU's gather_chunk.
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

/* A test's hooks (tests/test_poll_order.c builds this file with SBN_TEST_POLL_HOOK; the
   library's own build has none): after the two loads of a poll; where the deadline has
   passed, after the epoch's read and before the team's abort; and each nap's length */
#ifdef SBN_TEST_POLL_HOOK
void sbn_test_poll_hook(const uint32_t* epoch, uint32_t k);
void sbn_test_deadline_hook(const uint32_t* epoch, uint32_t k);
void sbn_test_nap_hook(int64_t nap_ns);
#define POLL_HOOK(epoch, k) sbn_test_poll_hook(epoch, k)
#define DEADLINE_HOOK(epoch, k) sbn_test_deadline_hook(epoch, k)
#define NAP_HOOK(nap) sbn_test_nap_hook(nap)
#else
#define POLL_HOOK(epoch, k) ((void)0)
#define DEADLINE_HOOK(epoch, k) ((void)0)
#define NAP_HOOK(nap) ((void)0)
#endif

/* Waits until *epoch == k. Spins briefly, then yields, then sleeps (longer as the op's
   waits go on: *since_ns), so W ranks on fewer cores make progress. Returns sbnSuccess,
   the team's abort reason, or sbnTimeout.
   The abort word is read BEFORE the epoch: a rank destroyed right after its last op
   aborts the team, and a peer still waiting in that op must find the records the rank
   saw (sbnCommDestroy's promise: the usual teardown fails no op). An abort seen first
   orders everything its rank saw before the epoch read after it; read after the epoch,
   an abort stored between the two reads failed the op (sbnAborted, nothing written; rare,
   and held open by test_poll_order). */
static sbnResult_t wait_epoch(sbn_team_t* t, const uint32_t* epoch, uint32_t k,
                              int64_t deadline_ns, int* expired, int64_t* since_ns) {
  int64_t since = *since_ns; /* when the op's waiting began to yield (0: not yet) */
  for (uint64_t spin = 0;; spin++) {
    int reason = atomic_load_explicit(&t->abort_reason, memory_order_acquire);
    const uint32_t seen = __atomic_load_n(epoch, __ATOMIC_ACQUIRE);
    POLL_HOOK(epoch, k);
    if (seen == k) return sbnSuccess;
    if (reason != sbnSuccess) return (sbnResult_t)reason;
    if (spin < 64) continue;
    const int64_t now = now_ns();
    if (since == 0) *since_ns = since = now;
    if (now - since < 1000000) {
      sched_yield(); /* the first ms */
    } else {
      /* then naps that grow with the wait, a 16th of it up to 1 ms, none past the
         deadline: a rank that waits long for a late peer wakes ~1000 times a second (naps
         of 20 us woke it tens of thousands of times: a fifth of a core for each waiting
         rank, for up to the timeout) and sees the peer's record at most a 16th of its
         wait later than it came. By the clock, not by a count of polls: a loaded machine
         (each yield a few ms) naps as soon. */
      int64_t nap = (now - since) / 16;
      if (nap > 1000000) nap = 1000000;
      if (nap > deadline_ns - now) nap = deadline_ns > now ? deadline_ns - now : 0;
      struct timespec ts = {0, (long)nap};
      NAP_HOOK(nap);
      if (nap > 0) nanosleep(&ts, NULL);
    }
    if (now_ns() > deadline_ns) {
      if (__atomic_load_n(epoch, __ATOMIC_ACQUIRE) == k) return sbnSuccess;
      DEADLINE_HOOK(epoch, k);
      sbn_team_abort(t, sbnTimeout);
      /* the abort word, then the epoch again, as above: the peer may have published,
         finished and been destroyed since the epoch was read, whose departure aborted the
         team first: the op completes (test_poll_order holds a rank here until that has
         happened). Where the abort that took effect is a timeout (this wait's), the team
         is aborted whatever came since: the call says so (sbnTimeout), where it would
         succeed and leave the team aborted unsaid. */
      reason = atomic_load_explicit(&t->abort_reason, memory_order_acquire);
      if (reason != sbnTimeout && __atomic_load_n(epoch, __ATOMIC_ACQUIRE) == k)
        return sbnSuccess; /* published since */
      *expired = 1;
      return (sbnResult_t)reason;
    }
  }
}

/* Waits for rank q's record of chunk j of op k; the failure, recorded on comm. */
static sbnResult_t wait_record(sbnComm_t comm, int q, int j, uint32_t k, int64_t deadline,
                               int64_t* since) {
  sbn_team_t* t = comm->team;
  sbn_cpu_team_t* ct = sbn_cpu_team(t);
  const sbn_mail_rec_t* rec = &ct->mail[sbn_mail_index(q, k, j, ct->nchunks_max)];
  int expired = 0;
  sbnResult_t r = wait_epoch(t, &rec->epoch, k, deadline, &expired, since);
  if (r == sbnTimeout && expired)
    return sbn_fail(comm, r,
                    "rank %d waited %lld ms for rank %d (op %u of the team); the team is "
                    "aborted. Every rank must make the same calls (SBN_TIMEOUT_MS sets the wait)",
                    comm->rank, (long long)t->cfg.timeout_ms, q, (unsigned)k);
  if (r == sbnTimeout) /* a rank that came later than another, whose wait ran out first */
    return sbn_fail(comm, r,
                    "rank %d waited for rank %d (op %u of the team) when another rank's wait of "
                    "%lld ms ran out; the team is aborted. Every rank must make the same calls "
                    "(SBN_TIMEOUT_MS sets the wait)",
                    comm->rank, q, (unsigned)k, (long long)t->cfg.timeout_ms);
  if (r == sbnSuccess) return sbnSuccess;
  const int gone = sbn_team_departed(t);
  if (r == sbnAborted && gone >= 0)
    return sbn_fail(comm, r,
                    "rank %d of the team was destroyed (sbnCommDestroy) while rank %d waited for "
                    "rank %d (op %u of the team); the team is aborted: no op of it can "
                    "complete, destroy the comm",
                    gone, comm->rank, q, (unsigned)k);
  return sbn_fail(comm, r, "rank %d: the team was aborted (%s) while waiting for rank %d",
                  comm->rank, sbnGetResultName(r), q);
}

sbnResult_t sbn_cpu_exchange(sbnComm_t comm, uint32_t sig, int floats_per_channel,
                             int64_t count, const float* local, sbn_cpu_peers_t* peers) {
  sbn_team_t* t = comm->team;
  sbn_cpu_team_t* ct = sbn_cpu_team(t);
  sbn_cpu_rank_t* me = sbn_cpu_rank(comm);
  const uint32_t k = me->epoch + 1;
  const int64_t c = sbn_sig_c(sig);
  const int nchunks = sbn_mail_chunks(c);

  /* step 1: publish, chunk by chunk */
  for (int j = 0; j < nchunks; j++) {
    sbn_mail_rec_t* rec = &ct->mail[sbn_mail_index(comm->rank, k, j, ct->nchunks_max)];
    rec->sig = sig;
    rec->count = count;
    memset(rec->data, 0, sizeof rec->data);
    for (int64_t ci = (int64_t)j * SBN_MAIL_CHUNK; ci < c && ci < (int64_t)(j + 1) * SBN_MAIL_CHUNK; ci++)
      memcpy(rec->data + SBN_MAIL_REC_FLOATS * (ci % SBN_MAIL_CHUNK), local + floats_per_channel * ci,
             (size_t)floats_per_channel * sizeof(float));
    __atomic_store_n(&rec->epoch, k, __ATOMIC_RELEASE);
  }
  me->epoch = k;

  /* step 2: wait for every rank's records, chunk 0 of every rank first: every op has
     it, so ranks running ops with different C meet there; step 3 needs it of all ranks
     before any rank may leave (a rank that left at the first mismatch it saw could reach
     op k + 2 and overwrite its op-k records while a peer still waits for them) */
  const int64_t deadline = now_ns() + t->cfg.timeout_ms * 1000000;
  int64_t since = 0; /* the op's waits nap by how long it has waited in all (wait_epoch) */
  for (int q = 0; q < t->nranks; q++) {
    sbnResult_t r = wait_record(comm, q, 0, k, deadline, &since);
    if (r != sbnSuccess) return r;
  }
  /* step 3: every rank must run the same op (bn_op.h: sbn_sig_same_op, and the
     layouts that matter alike; every rank sees every signature, so all decide alike); a
     peer's chunks past its own C never come */
  int by_layout[3] = {-1, -1, -1}; /* a rank of each sbn_sig_layouts value */
  for (int q = 0; q < t->nranks; q++) {
    const uint32_t theirs = ct->mail[sbn_mail_index(q, k, 0, ct->nchunks_max)].sig;
    by_layout[sbn_sig_layouts(theirs)] = q;
    int other = !sbn_sig_same_op(theirs, sig) ? comm->rank : -1;
    if (other < 0 && by_layout[1] >= 0 && by_layout[2] >= 0) other = by_layout[q == by_layout[1] ? 2 : 1];
    if (other >= 0) {
      const uint32_t os = ct->mail[sbn_mail_index(other, k, 0, ct->nchunks_max)].sig;
      char m[480];
      return sbn_fail(comm, sbnInvalidUsage,
                      "%s (every rank must make the same calls, with the same C, dtype, layout "
                      "and activation)",
                      sbn_sig_mismatch(other, os, q, theirs, m, sizeof m));
    }
  }
  for (int q = 0; q < t->nranks; q++)
    for (int j = 1; j < nchunks; j++) {
      sbnResult_t r = wait_record(comm, q, j, k, deadline, &since);
      if (r != sbnSuccess) return r;
    }
  peers->mail = ct->mail;
  peers->nchunks_max = ct->nchunks_max;
  peers->epoch = k;
  return sbnSuccess;
}
