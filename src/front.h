/* front.h — what the front's files (comm.c, ops.c, group.c) share: the open group of the
 * calling thread, and running one validated op. Backends never include this. */
#ifndef SYNCBN_FRONT_H_
#define SYNCBN_FRONT_H_

#include "internal.h"

/* groups (group.c) */
SBN_INTERNAL int sbn_group_active(void);
SBN_INTERNAL sbnResult_t sbn_group_enqueue(const sbn_op_t* op);
/* Records that a call inside the current group failed (sbnGroupEnd then runs nothing). */
SBN_INTERNAL void sbn_group_mark_failed(sbnResult_t r);
/* Whether comm has ops queued in this thread's open group. */
SBN_INTERNAL int sbn_group_has_comm(sbnComm_t comm);

/* Runs one validated op of a rank now, on the calling thread (group.c): the team's check
   of the op alone, then its run (a CPU team's blocks until the team meets). */
SBN_INTERNAL sbnResult_t sbn_op_run(const sbn_op_t* op);

#endif /* SYNCBN_FRONT_H_ */
