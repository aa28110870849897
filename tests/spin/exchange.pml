/* exchange.pml — a model of the cooperative kernels' cross-rank exchange, for SPIN.
 * docs/MODEL.md sets each part beside the kernel code it stands for (kernels/coop_kernel.cuh,
 * kernels/coop_exchange.cuh). Memory is sequentially consistent here: the ordering of the
 * publish and the polls is the emulator's weak model's job (tests/emu/emu_rt.h).
 *
 * W ranks, G blocks per rank (block b publishes chunk b and waits for every rank's
 * chunk b), OPS kernels per rank launched in stream order. Each kernel reads its op's
 * epoch from device state (so a replayed graph is the next op), meets the rank's other
 * blocks at the rank barrier, publishes its record into every rank's mailbox at parity
 * epoch % 2 (data, then the flag), and waits for every rank's record of its chunk.
 *
 * Options (spin -D...): TIMEOUTS (every wait may give up: sbnTimeout), ABORT (the host
 * may set the abort word at any time), PEER_STOPS (the last rank launches one op fewer:
 * a peer that never arrives), SINGLE_BUFFER (the mutant: one record per source, no
 * parity), SOLO (the kernels' solo ops: no rank barrier; the blocks only arrive, and
 * block 0 advances the epoch at its end once every block of the op has arrived), MIXED
 * (the even ranks solo, the odd ones with the rank barrier: a team whose ranks' shapes
 * differ, or whose ranks run different kernels, the small kernel for teams beside the
 * stream kernel), MIXED_ODD (the odd ranks solo: with PEER_STOPS, the rank that stops is
 * a solo one), NO_ARRIVAL_WAIT (with SOLO or MIXED, the mutant: a solo rank's block 0
 * advances the epoch without that check),
 * IGNORE_SEEN (the mutant: a kernel queued behind a failure publishes anyway),
 * B0_BARRIER_TIMEOUT (only block 0's barrier may give up, nothing else times out: a block
 * of the rank that arrives after block 0 timed out, late, still passes it and publishes,
 * and the rank's epoch stays where it was), WAITER (with G >= 3: the last block of each
 * rank publishes nothing and waits for chunk G - 2, which block G - 2 publishes: a block
 * whose units lie in a chunk another block of its rank publishes), WAITER_BLIND (the
 * mutant: that block does not look at `seen`), ADV_ON_TIMEOUT (the mutant: block 0
 * advances the epoch though its barrier gave up), SOLO_ADV_ON_TIMEOUT (the mutant: a solo
 * rank's block 0 advances it though not every block arrived).
 *
 * Checked: (1) no rank merges a record written for another op (assertion in the wait);
 * (2) no record is overwritten before its reader read it, unless that reader has failed
 * (assertion in the publish); (3) every wait ends — success, timeout or abort: no invalid
 * end state (SPIN's deadlock check) in every configuration that has a way out;
 * (4) agreement: with no failure injected every op of every rank succeeds; with failures,
 * no block succeeds in an op after the first op that failed anywhere, and a kernel queued
 * behind a failure publishes nothing (through assertion 2: a kernel that ignored `seen`
 * fails it); (5) every block of op k reads epoch
 * k - 1 (the epoch is advanced only after all the op's blocks read it), unless an op
 * failed before.
 */
#ifndef W
#define W 2
#endif
#ifndef G
#define G 1
#endif
#ifndef OPS
#define OPS 3
#endif

/* whether rank r's kernels run solo ops (coop_kernel.cuh: `solo`, decided per rank from its
   own geometry: one slice per chunk, or G == 1), so that in a team of uneven ranks some
   ranks meet at their rank barrier and others only arrive */
#if defined(SOLO)
#define SOLO_RANK(r) 1
#elif defined(MIXED)
#define SOLO_RANK(r) ((r) % 2 == 0)
#elif defined(MIXED_ODD)
#define SOLO_RANK(r) ((r) % 2 == 1)
#else
#define SOLO_RANK(r) 0
#endif

#ifdef SINGLE_BUFFER
#define PAR(k) 0
#else
#define PAR(k) ((k) % 2)
#endif
/* record (src, parity, chunk) of a mailbox; mailboxes by destination */
#define NREC (W * 2 * G)
#define RIDX(src, k, chunk) (((src) * 2 + PAR(k)) * G + (chunk))

#define OK 0
#define TIMEOUT 2
#define ABORTED 3

typedef Rec {
  byte flag; /* the epoch of the op that wrote it (sbn_mail_rec_t.epoch) */
  byte data; /* stands for sig, count and data: the op they were written for */
};
typedef Box {
  Rec rec[NREC];
  bit pending[NREC]; /* published, not yet read by this mailbox's rank */
};
Box mail[W];

byte epoch[W];     /* sbn_rank_state_t.epoch: ops this rank has run (device memory) */
byte arrived[W];   /* the rank barrier's arrivals, over all ops */
byte err[W + 1];   /* the error words: err[r] by rank r's kernels, err[W] by the host */
byte done[W];      /* blocks of rank r whose kernel ended, over all ops (stream order) */
byte failed[W * OPS]; /* the first error a block of rank r recorded in op k (0: none) */
byte fail_op;      /* the first op in which any rank recorded an error (0: none) */

#if W == 2
#define ANY_ERR (err[0] != 0 || err[1] != 0 || err[2] != 0)
#elif W == 3
#define ANY_ERR (err[0] != 0 || err[1] != 0 || err[2] != 0 || err[3] != 0)
#else
#error "W is 2 or 3"
#endif

/* record_error: the first cause stays (coop_exchange.cuh) */
inline record_error(r, op, code) {
  d_step {
    if
    :: err[r] == 0 -> err[r] = code
    :: else -> skip
    fi;
    if
    :: failed[r * OPS + op - 1] == 0 -> failed[r * OPS + op - 1] = code
    :: else -> skip
    fi;
    if
    :: fail_op == 0 || op < fail_op -> fail_op = op
    :: else -> skip
    fi
  }
}

/* the chunk block b publishes (or none) and the chunk it waits for */
#ifdef WAITER
#define PUBS(b) ((b) < G - 1)
#define CH(b) (PUBS(b) -> (b) : (G - 2))
#else
#define PUBS(b) 1
#define CH(b) (b)
#endif

proctype Block(byte r; byte b) {
  byte op = 1, k, q, d, dst, st;
  bit seen;
  do
  :: op > OPS -> break
#ifdef PEER_STOPS
  :: op == OPS && r == W - 1 -> break /* this rank never launches its last op */
#endif
  :: else ->
    (done[r] >= G * (op - 1)); /* the rank's previous kernel has ended */
    /* every block reads the epoch before the barrier, and the failure words at its start
       (coop_kernel.cuh: sbn_coop_kernel, `looks`) */
    d_step { k = epoch[r] + 1; seen = ANY_ERR; st = OK }
    assert(k == op || fail_op != 0); /* (5) */
    if
    :: SOLO_RANK(r) -> arrived[r]++ /* rank_arrive: a red, after the reads; nobody waits */
    :: else ->
      /* stage 2: the rank barrier, bounded by the deadline */
      arrived[r]++;
      if
      :: arrived[r] >= G * op -> skip
#ifdef TIMEOUTS
      :: true -> st = TIMEOUT
#endif
#ifdef B0_BARRIER_TIMEOUT
      :: b == 0 -> st = TIMEOUT
#endif
      fi
    fi;
    if
    :: st != OK ->
#ifdef ADV_ON_TIMEOUT
      if
      :: b == 0 && !SOLO_RANK(r) -> epoch[r] = k
      :: else -> skip
      fi;
#endif
      record_error(r, op, st); goto next_op
    :: else -> skip
    fi;
    if
    :: !SOLO_RANK(r) && b == 0 -> epoch[r] = k /* block 0 advances the epoch after the barrier, aborted or not */
    :: else -> skip
    fi;
    if
#if defined(WAITER_BLIND)
    :: seen && PUBS(b) -> record_error(r, op, ABORTED); goto advance
#elif !defined(IGNORE_SEEN)
    :: seen -> record_error(r, op, ABORTED); goto advance
#endif
    :: else -> skip
    fi;
    dst = (PUBS(b) -> 0 : W);
    do
    :: dst == W -> break
    :: dst < W ->
      /* (2): the record this overwrites was read, or its reader has failed */
      assert(mail[dst].pending[RIDX(r, k, CH(b))] == 0 || err[dst] != 0);
      d_step {
        mail[dst].rec[RIDX(r, k, CH(b))].data = k;
        mail[dst].pending[RIDX(r, k, CH(b))] = 1
      }
      mail[dst].rec[RIDX(r, k, CH(b))].flag = k; /* st.release.sys after the data */
      dst++
    od;
    /* stage 4: every rank's record of its chunk */
    q = 0;
    do
    :: q == W -> break
    :: q < W ->
      if
      :: mail[r].rec[RIDX(q, k, CH(b))].flag == k ->
        d = mail[r].rec[RIDX(q, k, CH(b))].data; /* the data after the flag */
        assert(d == k);                          /* (1) */
        mail[r].pending[RIDX(q, k, CH(b))] = 0;
        q++
      :: ANY_ERR -> st = ABORTED; break
#ifdef TIMEOUTS
      :: true -> st = TIMEOUT; break
#endif
      fi
    od;
    if
    :: st != OK -> record_error(r, op, st)
    :: else -> assert(fail_op == 0 || op <= fail_op) /* (4) */
    fi;
advance:
    /* a solo rank's block 0, aborted or not: every block of the op arrived, then the epoch
       (rank_arrivals_done, bounded by the deadline) */
    if
    :: SOLO_RANK(r) && b == 0 ->
      if
#ifdef NO_ARRIVAL_WAIT
      :: true -> epoch[r] = k
#else
      :: arrived[r] >= G * op -> epoch[r] = k
#endif
#ifdef TIMEOUTS
      :: true ->
#ifdef SOLO_ADV_ON_TIMEOUT
        epoch[r] = k;
#endif
        record_error(r, op, TIMEOUT)
#endif
      fi
    :: else -> skip
    fi;
next_op:
    done[r]++;
    op++
  od
}

#ifdef ABORT
proctype Host() {
  if
  :: err[W] = ABORTED /* sbnCommAbort, at any moment */
  :: skip
  fi
}
#endif

init {
  byte r = 0, b, i = 0;
  atomic {
    do
    :: r == W -> break
    :: r < W ->
      b = 0;
      do
      :: b == G -> break
      :: b < G -> run Block(r, b); b++
      od;
      r++
    od;
#ifdef ABORT
    run Host()
#endif
  }
  (_nr_pr == 1); /* every block (and the host) has ended */
#if !defined(TIMEOUTS) && !defined(ABORT) && !defined(PEER_STOPS) && !defined(B0_BARRIER_TIMEOUT)
  /* (4) without failures: every op of every rank succeeded */
  do
  :: i == W * OPS -> break
  :: i < W * OPS -> assert(failed[i] == 0); i++
  od
#endif
}
