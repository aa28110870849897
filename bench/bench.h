/* bench.h — what sbn-bench's files share: the options, the shape table, a row of the table
 * (one path's forward + backward on one shape x dtype x layout x W), a team's buffers, the
 * run's description, and the functions of the common part (nccl-tests' common.cu):
 * options.c, data.c, check.c, timing.c, floors.c, report.c, json.c. The paths build on it:
 * syncbn.c (the library: the CPU team; coop and nccl on GPU teams) and, in CUDA builds,
 * cudnn.c, with the GPU harness (gpu.h) and the NCCL loader (nccl.c). main.c runs the rows.
 */
#ifndef SBN_BENCH_H_
#define SBN_BENCH_H_

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "bn_dtype.h" /* SBN_DTYPES: the dtypes, their names and sizes */
#include "syncbn.h"

#ifndef SBN_BENCH_HAVE_CUDA
#define SBN_BENCH_HAVE_CUDA 0
#endif

#define BENCH_DEFAULT_RANKS 2
#define BENCH_DEFAULT_ITERS 5
#define BENCH_DEFAULT_WARMUP 1
#define BENCH_DEFAULT_SCALE 8
#define BENCH_CHECK_CHANNELS 16
#define BENCH_MAX_SHAPES 256
#define BENCH_MAX_WRONG_PRINTED 5
#define BENCH_MAX_RANK_LIST 32

/* GPU mode defaults (DESIGN.md: median of >= 50 calls after a warm-up, real sizes). */
#define BENCH_GPU_DEFAULT_RANKS "1,2,4,8"
#define BENCH_GPU_DEFAULT_ITERS 50
#define BENCH_GPU_MIN_ITERS 50
#define BENCH_GPU_DEFAULT_WARMUP 5
#define BENCH_GPU_DEFAULT_SCALE 1
#define BENCH_GPU_COPY_REPS 20
#define BENCH_GPU_TIMEOUT_MS 60000 /* in-kernel peer wait: a hang fails a row in a minute */
/* The CPU reference check of every row's y and dx is what a GPU run's host spends most on
   (bench/notes/gpu-run.md): 4 channels per row, first and last included. */
#define BENCH_GPU_CHECK_CHANNELS 4
/* --quick: these shapes (of the embedded table) at these W, every dtype, layout and path of
   the defaults, and the latency table: <= 60 s on an H100/H200 (bench/notes/gpu-run.md). */
#define BENCH_QUICK_SHAPES "S1,S2,S5,S10"
#define BENCH_QUICK_RANKS "1,8"

/* Tolerances |got - ref| <= atol + rtol*|ref| (DESIGN.md; what apex and PyTorch use to test
   SyncBN). Statistics are fp32 accumulations of exactly widened inputs whatever the dtype:
   1e-5. fp32 outputs: 1e-4. fp16/bf16 outputs are computed in fp32 and stored rounded once,
   against the double reference of the ROUNDED inputs: their tolerance is a few of the
   dtype's half ulps (relative: fp16 keeps 11 significant bits, 2^-11 = 4.9e-4; bf16 8,
   2^-8 = 3.9e-3): fp16 2e-3 (the H200 runs' worst correct fp16 output used 4.3e-4 of
   error; an output rounded through bf16 on the way is wrong, where 1e-2 let it through:
   test_check's (4b)), bf16 1e-2. The
   gradient sums dweight and dbias have a bound of their own: check.c, BENCH_SUM_DEPTH. */
#define TOL_STAT 1e-5
#define TOL_F32 1e-4
#define TOL_F16 2e-3
#define TOL_BF16 1e-2
/* Additions any term of a rank's per-channel sum passes through in the library (check.c
   derives it); the team sums add W. */
#define BENCH_SUM_DEPTH 128
/* cuDNN rows: 10x for the statistics and fp32 values (see kCheckCudnn in check.c). */
#define TOL_CUDNN_STAT 1e-4
#define TOL_CUDNN_F32 1e-3
#define TOL_CUDNN_HALF 1e-2
/* The inference table (issue 13): sbnForwardInference's time against a device-to-device
   copy of x, t / (2|x| / B); the target is <= 1.1. */
#define BENCH_INFER_TARGET 1.1

/* What a row's check compares, and how closely. */
typedef struct {
  double stat, f32, f16, bf16; /* atol = rtol for statistics, fp32 values, fp16, bf16 outputs */
  double sums;            /* dweight, dbias: atol = rtol on top of the rounding bound (0: the
                             bound alone) */
  int running;            /* also running_mean, running_var and num_batches_tracked */
} bench_check_t;
extern const bench_check_t kCheckLibrary, kCheckCudnn;
/* The tolerance of an output (y, dx, dz) of dtype dt. */
static inline double bench_tol_out(const bench_check_t* how, sbnDataType_t dt) {
  return dt == sbnFloat32 ? how->f32 : dt == sbnFloat16 ? how->f16 : how->bf16;
}
extern const char* const kSumsFormula; /* the bound of dweight and dbias, as text */

/* ---- options and shapes ----------------------------------------------------------------- */
typedef enum { BENCH_GPU_AUTO = 0, BENCH_GPU_ON = 1, BENCH_GPU_OFF = 2 } bench_gpu_req_t;

/* What a row times. --paths picks among the first BENCH_GPU_PATHS (GPU mode); CPU mode has
   one path, the library's CPU team. split: with --epilogue only, the plain coop op and a
   separate activation kernel (bench/act.cu), what the fused op is measured against. */
typedef enum {
  BENCH_PATH_COOP = 0,
  BENCH_PATH_NCCL = 1,
  BENCH_PATH_CUDNN = 2,
  BENCH_PATH_SPLIT = 3,
  BENCH_PATH_CPU = 4
} bench_path_t;
#define BENCH_GPU_PATHS 4

/* --epilogue: what the rows' ops compute after the normalization. none: sbnForwardTrain /
   sbnBackward; relu: y = relu(bn(x)); add-relu: y = relu(bn(x) + z) (a ResNet block's
   last batch norm), the backward giving dz too (sbnForwardTrainEx / sbnBackwardEx).
   leaky-inplace, add-leaky-inplace: the same with leaky ReLU (BENCH_LEAKY_SLOPE), and the
   in-place backward, which takes y (and z) for x: sbnBackwardEx with x NULL, and
   sbnBackwardInPlaceEx with z and dz (the forward writes y into its own buffer, as a layer
   in place writes it over x: the same kernel and bytes, and x stays for the check). */
enum {
  BENCH_EPI_NONE = 0,
  BENCH_EPI_RELU = 1,
  BENCH_EPI_ADD_RELU = 2,
  BENCH_EPI_LEAKY_INPLACE = 3,
  BENCH_EPI_ADD_LEAKY_INPLACE = 4
};
#define BENCH_EPI_COUNT 5
#define BENCH_LEAKY_SLOPE 0.01f
extern const char* const kEpilogueNames[BENCH_EPI_COUNT];
/* The epilogue has a residual z (and the backward dz); its backward is the in-place one. */
static inline int epi_has_z(int e) {
  return e == BENCH_EPI_ADD_RELU || e == BENCH_EPI_ADD_LEAKY_INPLACE;
}
static inline int epi_inplace(int e) {
  return e == BENCH_EPI_LEAKY_INPLACE || e == BENCH_EPI_ADD_LEAKY_INPLACE;
}
/* The rows have a dz buffer: the ops' with z, and the relu split pair's g (leaky-inplace has
   neither). */
static inline int epi_has_dz(int e) {
  return e != BENCH_EPI_NONE && e != BENCH_EPI_LEAKY_INPLACE;
}

typedef struct {
  bench_gpu_req_t gpu;
  int ranks_list[BENCH_MAX_RANK_LIST]; /* -w as given (GPU mode: every W; CPU mode: one) */
  int nranks_list;                     /* 0: not given */
  int ranks;                           /* CPU mode: the team size; GPU mode: the largest W */
  int iters;                           /* -1 until resolved for the mode */
  int warmup;
  int scale;
  int check_channels; /* 0: every channel; -1 until resolved for the mode */
  int quick;          /* --quick */
  const char* shapes_file;
  const char* json_file;
  const char* only;
  int dtype_on[SBN_DTYPE_COUNT]; /* indexed by sbnDataType_t */
  int layout_on[2];             /* indexed by sbnLayout_t */
  int path_on[BENCH_GPU_PATHS]; /* GPU mode, indexed by bench_path_t */
  int paths_given;              /* --paths was given */
  int epilogue;                 /* BENCH_EPI_* */
} bench_opts_t;

typedef struct {
  char id[32];
  int64_t n, c, h, w;
  char where[160];
} bench_shape_t;

extern const char* const kDtypeNames[SBN_DTYPE_COUNT]; /* sbnDataType_t order */
/* The order rows of the dtypes run in (every dtype of SBN_DTYPES once). */
extern const sbnDataType_t kDtypeOrder[]; /* SBN_DTYPE_COUNT entries (options.c checks) */
extern const char* const kLayoutNames[2]; /* sbnLayout_t order */
extern const char* const kPathNames[5];   /* bench_path_t order */

/* options.c: 0, 1 after -h (printed), or 2 after a usage error (printed). */
int opts_parse(int argc, char** argv, bench_opts_t* o);
/* The defaults of the mode that runs, and the checks that depend on it: 0 or 2. */
int opts_resolve(bench_opts_t* o, int gpu_mode, const char* why_cpu, const char* argv0);
/* Before reading any file: 0, or 2 after saying that --json names the file --shapes reads
   (the same device and inode when both exist, the same path otherwise). */
int opts_check_files(const bench_opts_t* o, const char* argv0);
/* The index of the first byte of s that is not part of well-formed UTF-8 (RFC 3629: no
   overlong forms, surrogates or values above U+10FFFF), or -1. */
long utf8_bad_at(const char* s);
/* The shape table (--shapes FILE or the embedded one) after --only: the count (>= 1), or -1
   after printing why not, naming --shapes and its value (not a readable file, a bad line,
   a repeated id, no shape rows), or --only naming none. max: at most BENCH_MAX_SHAPES. */
int shapes_load(const bench_opts_t* o, const char* argv0, bench_shape_t* shapes, int max,
                const char** source);
/* Before any work: 0, or 2 after saying that the run would take more host memory than the
   host has to give (mode resolved: o->ranks is the team size, or the largest W). */
int opts_check_memory(const bench_opts_t* o, const bench_shape_t* shapes, int nshapes, int gpu_mode,
                      const char* argv0);
/* H*W / scale, kept >= 1. */
int64_t shape_spatial(const bench_shape_t* s, int scale);

/* ---- rows --------------------------------------------------------------------------------- */
/* Timings of one op over the timed calls (us). */
typedef struct {
  double med, min, p90; /* GPU: CUDA events around the op; CPU: the wall time of the calls */
  double host_med;      /* wall time of the enqueueing calls (sbnGroupStart..sbnGroupEnd) */
} bench_times_t;

/* One table row: a path on shape x dtype x layout x W. Arrays indexed by `fwd` hold the
   backward at [0], the forward at [1]. */
typedef struct bench_row {
  const bench_shape_t* shape;
  int64_t spatial; /* H*W after --scale */
  sbnDataType_t dtype;
  sbnLayout_t layout;
  int W; /* ranks of the team */
  bench_path_t path;
  int epilogue; /* BENCH_EPI_*: the run's */
  const struct bench_row* coop; /* the row t/coop compares with (NULL: none) */
  int skipped;    /* did not run, not a failure (cuDNN absent or refusing); see note */
  int done;       /* finished: in the totals, the table and the JSON */
  char note[400]; /* what the path did or why it did not run ("" when nothing to say) */
  bench_times_t t[2];
  int64_t checked; /* values compared */
  int64_t wrong;   /* values outside tolerance, or bitwise guarantees broken */
  double worst;    /* largest |got - ref| / tolerance */
  char worst_what[96];
  char error[384];    /* non-empty: a call failed; the row was not checked */
  char kernel[2][24]; /* what ran: sbnCommGetKernel ("onchip", "stream", ..., "host", "cpu"),
                         "cudnn"; "" when nothing ran */
  int inference;      /* a row of the inference table (W = 1, no team): t[1] holds the times
                         of sbnForwardInference (coop: device memory, cpu: host memory) or
                         cudnnBatchNormalizationForwardInference (cudnn), kernel[1] what ran;
                         t[0] those of a copy of x into y timed the same way on the same
                         buffers (coop: cudaMemcpyAsync device to device, cpu: memcpy; unused
                         in cudnn rows, which take their coop row's); kernel[0] unused */
} bench_row_t;

/* ---- a team's buffers (data.c) -------------------------------------------------------------- */
typedef struct {
  int W;
  sbnTensorDesc_t desc;
  void **x, **y, **dy, **dx;                    /* [W] of (N, C, spatial) */
  float *weight, *bias;                         /* [C], shared by the ranks */
  float **rm, **rv, **save_mean, **save_invstd; /* [W] of [C] */
  float **dweight, **dbias;                     /* [W] of [C] */
  int64_t* nbt;                                 /* [W] */
  int epilogue;                                 /* BENCH_EPI_* (bufs_alloc_epilogue) */
  void **z, **dz; /* [W]: the residual (add-relu), its gradient (add-relu; the split
                     path's g for relu); NULL without them */
} bench_team_bufs_t;

size_t dtype_size(sbnDataType_t t);
/* Bytes of one tensor of d. */
size_t tensor_bytes(const sbnTensorDesc_t* d);
/* The row's tensor: (N, C, spatial) of its dtype and layout. */
sbnTensorDesc_t row_desc(const bench_row_t* r);
/* malloc that returns a pointer for 0 bytes too (empty ranks) */
void* bmalloc(size_t bytes);
uint64_t splitmix64(uint64_t z);
/* The host memory bufs_alloc and bufs_init take for W ranks of d (an estimate, in double:
   the shapes may be absurd). */
double bufs_bytes(int W, const sbnTensorDesc_t* d);
/* Host buffers of W ranks: 0, or -1 when out of memory (nothing left allocated). */
int bufs_alloc(bench_team_bufs_t* b, int W, const sbnTensorDesc_t* d);
void bufs_free(bench_team_bufs_t* b);
/* The epilogue's tensors of b (allocated by bufs_alloc): z (epi_has_z) and dz
   (epi_has_dz); 0, or -1 when out of memory (b freed). Before bufs_init, which fills z. */
int bufs_alloc_epilogue(bench_team_bufs_t* b, int epilogue);
/* Running stats := (0, 1), num_batches_tracked := 0. */
void bufs_reset_state(bench_team_bufs_t* b);
/* The inputs of every rank (x, dy, weight, bias) from the shape's id; 0 or -1 (memory). */
int bufs_init(bench_team_bufs_t* b, const char* shape_id);
/* The running statistics the inference rows are given (not bufs_init's (0, 1), which would
   leave the mean and the variance untested): running_mean[c] = 0.1 * ((c mod 41) - 20),
   running_var[c] = 1 + 0.05 * (c mod 37), exact in fp32 to the rounding of the constants. */
void infer_stats_fill(float* rm, float* rv, int64_t c);
extern const char* const kInferStatsFormula; /* the same, as text */

/* ---- checking (check.c) ---------------------------------------------------------------------- */
/* Bits kept from the NCHW row of a shape x dtype for the NHWC row to compare with (CPU team):
   rank 0's statistics and gradient sums [C], and its y and dx on the checked channels. */
typedef struct {
  int valid;
  const bench_shape_t* shape;
  sbnDataType_t dtype;
  int64_t c, packed_numel;
  float *save_mean, *save_invstd, *dweight, *dbias;
  unsigned char *y, *dx;
} bench_layout_keep_t;
void keep_free(bench_layout_keep_t* k);

/* The host memory check_row takes for W ranks of d (keep: also the bits it keeps). */
double check_bytes(int W, const sbnTensorDesc_t* d, int kmax, int keep);
/* Checks the outputs of the last calls (`calls` forwards, then as many backwards, on the
   same inputs; b: host memory) against the reference; see check.c. */
void check_row(bench_row_t* row, const bench_team_bufs_t* b, int calls, int kmax,
               bench_layout_keep_t* keep, sbnGradMode_t grad_mode, const bench_check_t* how);
/* An inference row's check (b: host memory, rank 0 after one call): y against the double
   reference (sbn_ref_inference) on kmax channels spread over C, from the running statistics
   of infer_stats_fill, at bench_tol_out(how, dtype); and rank 0's
   running_mean and running_var bitwise infer_stats_fill's (the call only reads them). Out of
   memory sets row->error. */
void check_inference(bench_row_t* row, const bench_team_bufs_t* b, int kmax, const bench_check_t* how);

/* 64-bit digests of every output of a check run, rank by rank: the nccl row is compared
   bitwise with the coop row of the same inputs without a second copy of y and dx (GBs). */
enum {
  DIG_Y,
  DIG_DX,
  DIG_SAVE_MEAN,
  DIG_SAVE_INVSTD,
  DIG_RM,
  DIG_RV,
  DIG_DWEIGHT,
  DIG_DBIAS,
  DIG_NBT,
  DIG_DZ, /* an --epilogue with z (epi_has_z; 0 when absent) */
  DIG_COUNT
};
typedef struct {
  int valid, W;
  uint64_t d[SBN_MAX_GPU_TEAM_RANKS][DIG_COUNT];
  double worst;          /* the row's largest |got - ref| / tolerance (its check) */
  char worst_what[96];   /* and where */
} bench_digest_t;
void digest_team(bench_digest_t* dg, const bench_team_bufs_t* b);
/* Every output of b against the digests `ref`: one `wrong` per buffer whose bits differ. */
void digest_compare(bench_row_t* row, const bench_digest_t* ref, const bench_team_bufs_t* b);

/* ---- timing (timing.c) -------------------------------------------------------------------------
 */
double now_us(void);
/* Sorts v. */
double median(double* v, int n);
/* Median, min and p90 (nearest rank) of n samples; sorts v. */
void times_stats(double* v, int n, double* med, double* mn, double* p90);
/* Queues (GPU) or runs (CPU team) one forward (fwd != 0) or backward of a row's path;
   returns the wall time of the calls in us, or -1 with err set. */
typedef double (*bench_op_fn)(void* ctx, int fwd, char* err, size_t cap);
/* warmup + iters calls of op; samples[iters] := the wall time of each timed one. 0 or -1. */
int time_wall(bench_op_fn op, void* ctx, int fwd, const bench_opts_t* o, double* samples, char* err,
              size_t cap);
/* Timings of one op from the samples (sorts them): into t, or into the row's t[fwd]. */
void times_set(bench_times_t* t, double* op_us, double* host_us, int iters);
void row_set_times(bench_row_t* row, int fwd, double* op_us, double* host_us, int iters);

/* ---- floors (floors.c)
 * --------------------------------------------------------------------------- */
/* What one op of a row moved and how close it came to the copy bandwidth B (GB/s). */
typedef struct {
  double bytes_rank, bytes_total;      /* effective bytes: floor (b)'s traffic */
  double gbps_rank, gbps_total;        /* NaN when the row has no time */
  double floor_a_bytes, floor_b_bytes; /* the lower bounds, all W ranks' bytes */
  double floor_a_us, floor_b_us;       /* at B; NaN when B is not measured (CPU mode) */
  double pct_a, pct_b;                 /* floor / median time x 100; NaN when unknown */
} bench_op_derived_t;
/* Bytes of one rank's x. */
double row_x_bytes(const bench_row_t* r);
bench_op_derived_t op_derived(const bench_row_t* r, int fwd, double B);
extern const char* const kBytesFormula; /* the text of what op_derived computes */
extern const char* const kFloorFormula;
extern const char* const kRatioFormula; /* t/coop (report.c) */
/* An inference row: what the call must move (read x, write y) and its time against B. */
typedef struct {
  double bytes;    /* 2|x|: read x + write y (W = 1) */
  double gbps;     /* bytes / median time; NaN when the row has no time */
  double floor_us; /* bytes / B: a device-to-device copy of x; NaN when B is not measured */
  double ratio;    /* median time / floor_us ("x a copy of x", target <= BENCH_INFER_TARGET);
                      NaN when either is unknown */
  double copy_us;  /* the median time of a copy of x into y, timed as the call (t[0]; a cudnn
                      row: its coop row's); NaN when there is none */
  double t_over_copy; /* median time / copy_us: the target's measure against a copy that pays
                         its own launch; NaN when either is unknown */
} bench_infer_derived_t;
bench_infer_derived_t infer_derived(const bench_row_t* r, double B);
extern const char* const kInferFormula; /* the text of what infer_derived computes */

/* ---- the run, reporting (report.c) and JSON (json.c)
 * ---------------------------------------------- */
/* A library loaded at run time (GPU mode: NCCL for its version, cuDNN for its rows). */
typedef struct {
  int loaded;        /* dlopen succeeded */
  long long version; /* -1: unknown */
  char from[320];    /* what was loaded */
  char why[400];     /* non-empty: not loaded, or not usable, and why */
} bench_lib_info_t;

/* The GPU of GPU mode, as the report and the JSON describe it. */
typedef struct {
  int index;
  char name[256];
  char pci[32];
  int sms, cc_major, cc_minor, driver, runtime, l2_bytes;
  char nvidia_driver[32]; /* the kernel module's version, "580.159.04" ("" when unknown) */
  size_t mem_total;
  size_t copy_bytes;  /* of the bandwidth copy */
  double copy_us;     /* its median time */
  double copy_gbps;   /* B = 2 * copy_bytes / copy_us (read + write), GB/s */
  size_t flush_bytes; /* written before every timed call: evicts the L2 */
} bench_device_info_t;

/* --json's file: checked before any work. A regular file (or a new one) is written whole
   after every row, into a temporary file beside it renamed over it, so that it is valid
   JSON whenever a run is cut short; anything else (a pipe, /dev/stdout) once, at the end. */
typedef struct {
  const char* path;
  char target[4096]; /* the file written: path, or what the symbolic link path names */
  char tmp[4112];    /* target + ".tmpPID" */
  FILE* f;           /* not a regular file: open until written or discarded */
  int created;       /* json_open made the file (it did not exist) */
  int written;       /* a version of the file has been written */
} bench_json_t;

typedef struct {
  int version; /* sbnGetVersion */
  char date[32];
  long cores;
  const char* shapes_source;
  int nshapes;
  double total_s;
  char why_cpu[320];              /* CPU mode: why not the GPU path */
  char device[400];               /* CPU mode: the device line */
  double B;                       /* copy bandwidth (GB/s); NaN: not measured (CPU mode) */
  const bench_device_info_t* dev; /* GPU mode; NULL in CPU mode */
  bench_lib_info_t nccl, cudnn;   /* GPU mode */
  const char* algo_env;           /* SBN_ALGO as the caller had it; NULL when unset */
  int lat_w;                      /* the latency table covers W = 1..lat_w */
  int infer;                      /* the run has an inference table (not with --epilogue) */
  double t_start;                 /* now_us() at the start */
  double t_last;                  /* now_us() when the plan was printed or the last row ended */
  int planned, finished;          /* rows of every table: planned, finished so far */
  int json_failed;                /* --json's file could not be written: the run fails */
  int table_failed;               /* the table could not be written to stdout: the run fails */
  int gpu_failed;                 /* GPU mode failed before it had a device (device: why) */
  bench_json_t json;              /* --json; path NULL without it */
} bench_run_t;

/* The rows of a run (planned before any runs, marked done as they finish) and the totals
   of the finished ones. */
typedef struct {
  bench_row_t* rows;
  int nrows;
  bench_row_t* lat; /* latency rows of W = 1..lat_w: lat_row(); shape NULL where not planned */
  int nlat;
  bench_row_t* inf; /* inference rows, in run order (per shape x dtype x layout: coop, cudnn;
                       CPU mode: cpu) */
  int ninf;
  const bench_row_t** order; /* GPU mode: every planned row in run order (main_row_next's
                                interleaving, then the latency rows); NULL: the table order
                                (rows, latency, inference), which CPU mode runs */
  int64_t wrong, checked;
  int failed, skipped;
  const bench_row_t* worst;
} bench_results_t;

/* "S1 fp32 NCHW W=8 coop": how the messages and the summary name a row. */
const char* row_label(const bench_row_t* r, char* buf, size_t cap);
/* A row with timings: it ran and did not fail. */
int row_timed(const bench_row_t* r);
/* Appends "; text" (or text) to a row's note, cut at its size. */
void row_note_append(bench_row_t* row, const char* text);
/* Latency row of (W, q: 0 tiny, 1 empty, path coop or nccl), NULL where it did not run. */
bench_row_t* lat_slot(bench_row_t* lat, int W, int q, int path);
const bench_row_t* lat_row(const bench_row_t* lat, int W, int q, int path);
/* The latency table of W = 1..lat_w (report_footer's), to stdout. */
void print_latency(const bench_row_t* lat, int lat_w);
/* Adds a finished row to the totals. */
void results_add(bench_results_t* res, const bench_row_t* r);
/* "2.28.9" from the library's version code; "unknown" when negative. */
void format_nccl_version(long long v, char* buf, size_t cap);
void format_cudnn_version(long long v, char* buf, size_t cap);
/* The NVIDIA driver's version from the first line of /proc/driver/nvidia/version ("NVRM
   version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  ...", or "... Open Kernel Module for
   x86_64  570.86.15 ..."): the first word of digits and dots after "Kernel Module" into buf;
   0 if found, -1 (buf "") otherwise. */
int parse_nvidia_driver(const char* line, char* buf, size_t cap);

/* The table (nccl-tests style): the header, a row as soon as it is done, the latency table,
   the inference table and the footer; the last line says OK or FAILED. */
void report_header(const bench_opts_t* o, const bench_run_t* run);
void report_row(const bench_run_t* run, const bench_row_t* r);
/* On stderr: the planned rows, one line each, and then one line per finished row with the
   seconds since the previous one finished and since the start. */
void report_plan(bench_run_t* run, const bench_results_t* res);
void report_progress(bench_run_t* run, const bench_row_t* r);
void report_footer(const bench_run_t* run, const bench_results_t* res);
void report_end(const char* json_path, int status);

/* Checks that path can be written (created if missing, nothing truncated yet; a regular
   file also needs its temporary file beside it): 0, or -1 with errno. */
int json_open(bench_json_t* j, const char* path);
/* Writes the run so far (complete: the run has ended) as JSON (json.c has the schema): a
   regular file after every call, anything else only when complete. 0, or -1 with errno. */
int json_write(bench_json_t* j, const bench_opts_t* o, const bench_run_t* run,
               const bench_results_t* res, int complete);
/* A run that ended before its JSON: closes j's file, and removes it when json_open created
   it and no row was written into it. */
void json_discard(bench_json_t* j);

#endif
