/* paths.h — what main.c runs: each path's entry points (one file per path: syncbn.c, and in
 * CUDA builds cudnn.c) and the runtime loaders of the GPU mode's libraries (nccl.c). A path
 * fills the rows it is given (times, kernel, check, error or note); it never prints. */
#ifndef SBN_BENCH_PATHS_H_
#define SBN_BENCH_PATHS_H_

#include "bench.h"

/* syncbn.c: one CPU-team row on comms (o->ranks ranks): allocate, fill, time forward then
   backward (each call one group, wall clock), check. keep: the NCHW row's bits for the NHWC
   row of the same shape x dtype. */
void syncbn_cpu_row(bench_row_t* row, sbnComm_t* comms, const bench_opts_t* o,
                    bench_layout_keep_t* keep);
/* syncbn.c: one inference row of CPU mode (W = 1): rank 0's inputs of the row's shape x
   dtype x layout, the running statistics of infer_stats_fill; sbnForwardInference on host
   memory timed on the wall clock, then one more call on a poisoned y, checked. */
void syncbn_cpu_infer_row(bench_row_t* row, const bench_opts_t* o);

#if SBN_BENCH_HAVE_CUDA
#include "gpu.h"

/* syncbn.c: with a device present, can the library make a GPU team there? 1 yes; 0
   unsupported (device without cooperative launch...: CPU mode, why says so); -1 another
   failure. */
int syncbn_gpu_probe(char* why, size_t cap);
/* syncbn.c: the library rows of one W: rows[BENCH_PATH_COOP] and rows[BENCH_PATH_NCCL] (NULL
   when that path is off), run one after the other on the same device buffers, with the
   inputs of ranks 0..W-1 of host_all (generated for the largest W: rank r's data do not
   depend on W); the nccl row must have the coop row's bits. */
void syncbn_gpu_rows(bench_row_t* const rows[BENCH_GPU_PATHS], bench_gpu_t* g, const bench_opts_t* o,
                     const bench_team_bufs_t* host_all, int64_t max_c);
/* syncbn.c: one coop inference row (W = 1, no team): sbnForwardInference on device copies
   of rank 0's inputs of host_all and the running statistics of infer_stats_fill (written
   into host_all's rank 0 running_mean and running_var), on the bench stream; timed as the
   other rows, then one more call on a poisoned y, copied back and checked. */
void syncbn_gpu_infer_row(bench_row_t* row, bench_gpu_t* g, const bench_opts_t* o,
                          const bench_team_bufs_t* host_all);

/* cudnn.c: libcudnn.so.9 loaded at run time (the one next to the cudnn.h CMake found
   first); info says what was loaded and, when the rows cannot run, why. */
typedef struct bench_cudnn bench_cudnn_t;
bench_cudnn_t* cudnn_load(bench_lib_info_t* info);
void cudnn_unload(bench_cudnn_t* c);
/* One cuDNN row (W = 1: one GPU, no sync) on rank 0's inputs of host_all. A combination
   cuDNN does not support, or cuDNN not usable, makes a skipped row (note says why). */
void cudnn_row(bench_row_t* row, bench_gpu_t* g, const bench_opts_t* o,
               const bench_team_bufs_t* host_all, bench_cudnn_t* cu);
/* One cuDNN inference row: cudnnBatchNormalizationForwardInference (CUDNN_BATCHNORM_SPATIAL)
   on rank 0's inputs of host_all with the running statistics of infer_stats_fill, as
   syncbn_gpu_infer_row; skipped (note says why) where cuDNN is not usable or refuses it. */
void cudnn_infer_row(bench_row_t* row, bench_gpu_t* g, const bench_opts_t* o,
                     const bench_team_bufs_t* host_all, bench_cudnn_t* cu);

/* nccl.c: NCCL's version, for the record (virtual teams make no NCCL call). */
void nccl_load(bench_lib_info_t* info);

/* dynlib.c: dlopen of names[0] then names[1] ("" skipped): the first that loads, its name
   in from; NULL with why = every dlerror() text. */
void* lib_open(const char* const names[2], char* from, size_t fcap, char* why, size_t wcap);
/* dlsym into the function pointer `fn` of fn_size bytes: 0, or -1 with why set. */
int lib_sym(void* lib, const char* name, void* fn, size_t fn_size, char* why, size_t wcap);
#endif

#endif
