/* front.h — what the front's files (comm.c, ops.c, group.c) share: the open group of the
 * calling thread, and running one validated op. Backends never include this. */
#ifndef SYNCBN_FRONT_H_
#define SYNCBN_FRONT_H_

#include "internal.h"

/* groups (group.c) */
SBN_INTERNAL int sbn_group_active(void);
SBN_INTERNAL sbnResult_t sbn_group_enqueue(const sbn_op_t* op);
/* Records that a call inside the current group failed (sbnGroupEnd then runs nothing, and
   its message gives the first such call's detail: comm's last error, or with NULL or an
   invalid comm the calling thread's). */
SBN_INTERNAL void sbn_group_mark_failed(sbnResult_t r, sbnComm_t comm);
/* Whether comm has ops queued in this thread's open group. */
SBN_INTERNAL int sbn_group_has_comm(sbnComm_t comm);

/* A comm's calls must not overlap: an op, a split or a destroy claims the comm for the
   calling thread (inside a group: until sbnGroupEnd has run the group, or the thread
   exits with it open), and a call from another thread meanwhile is refused with
   sbnInvalidUsage (nothing done). Two threads driving one rank would otherwise pair
   their ops across the team at random, or free a comm under a waiting call.
   sbn_comm_claim sets *claimed when this call took the comm (not when this thread's
   open group held it already); sbn_comm_unclaim gives it back. */
SBN_INTERNAL sbnResult_t sbn_comm_claim(sbnComm_t comm, const char* fn, int* claimed);
SBN_INTERNAL void sbn_comm_unclaim(sbnComm_t comm);
/* The tail of an op's or a split's call, r its checks' result so far: inside a group, the
   op queued (the group then holds the comm until its end) or the group marked failed;
   outside, run(op) now. A claim this call took (claimed) is given back unless the op was
   queued. */
SBN_INTERNAL sbnResult_t sbn_call_finish(const sbn_op_t* op, sbnResult_t r, int claimed,
                                         sbnResult_t (*run)(const sbn_op_t* op));

/* The calls that wait for other ranks (an op, sbnGroupEnd, a split, a destroy) run with
   the calling thread's cancellation disabled: a pthread_cancel takes effect at the
   thread's next cancellation point after the call, which returns as it would have
   (bounded by the team's timeout), instead of leaving a lock held or the team
   half-run. */
static inline int sbn_nocancel_begin(void) {
  int old = PTHREAD_CANCEL_ENABLE;
  pthread_setcancelstate(PTHREAD_CANCEL_DISABLE, &old);
  return old;
}
static inline void sbn_nocancel_end(int old) { pthread_setcancelstate(old, NULL); }

/* Runs one validated op of a rank now, on the calling thread (group.c): the team's check
   of the op alone, then its run (a CPU team's blocks until the team meets). */
SBN_INTERNAL sbnResult_t sbn_op_run(const sbn_op_t* op);

#endif /* SYNCBN_FRONT_H_ */
