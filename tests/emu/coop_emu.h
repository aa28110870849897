/* coop_emu.h — run the cooperative kernels of kernels/coop.cu on CPU threads (see
 * cuda_emu.h). For tests only. */
#ifndef SYNCBN_TESTS_COOP_EMU_H_
#define SYNCBN_TESTS_COOP_EMU_H_

#include "coop_args.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Runs `grid` blocks of SBN_GPU_THREADS threads of the kernel for (kind, dtype, tile)
   with *args, and returns when all have returned (0). Blocking; launches that must run at
   the same time (ranks of one team) are started from separate host threads. */
/* The emulation's stand-in for an NCCL symmetric window (the `nccl` transport): each
   rank's part by rank; the kernels address byte `off` of rank q's part as part[q] + off. */
typedef struct {
  char* part[SBN_GPU_MAX_RANKS];
} sbn_emu_window_t;

int sbn_emu_launch(int kind, int dtype, int tile, const sbn_coop_args_t* args, unsigned grid);
/* The same for one stage of the host-driven path (SBN_HOST_STATS ... SBN_HOST_APPLY). */
int sbn_emu_launch_host(int stage, int kind, int dtype, int tile, const sbn_coop_args_t* args,
                        unsigned grid);

/* What the notify kernel does for sbnCommAbort on an NCCL team (kernels/coop.cu,
   push_failure): rank `rank`'s failure word = code in every rank's part of args->win. */
void sbn_emu_push_failure(const sbn_coop_args_t* args, int rank, int code);

#ifdef __cplusplus
}
#endif
#endif /* SYNCBN_TESTS_COOP_EMU_H_ */
