/* sbn-bench — times SyncBN forward and backward on real per-GPU shapes and checks every
 * result against the double-precision reference (reference/sbn_ref.c).
 *
 * For each shape of bench/shapes.tsv (embedded at build time; --shapes overrides) x dtype
 * x layout, every rank of a team of W holds that shape's tensor (N, C, H*W): the shapes
 * are per GPU. Inputs come from a deterministic hash of each element's logical index
 * (generated on the host). Every row is checked: y, save_mean, save_invstd, the running
 * stats, dx, dweight and dbias against the reference on up to 16 channels spread over C,
 * plus the bitwise guarantees (every rank has the same statistics).
 *
 * Two modes; the header says which one ran and why (--gpu auto|on|off, default auto):
 *
 * GPU mode — the build has CUDA (SBN_BENCH_HAVE_CUDA) and cudaGetDeviceCount > 0: VIRTUAL
 *   teams, W ranks on GPU 0 (sbnCommInitVirtual), for every W of -w (default 1,2,4,8), and
 *   per row one of three paths (--paths, default all):
 *   - coop: the library's cooperative kernel (SBN_ALGO=coop), ONE cooperative launch per op
 *     for all W ranks with the exchange inside it;
 *   - nccl: the library's host-driven path (SBN_ALGO=nccl; PyTorch's op sequence), the same
 *     calls on the same buffers. The library reads SBN_ALGO at every call, so the bench sets
 *     it around the calls of the row (and puts the caller's value back at the end). On a
 *     virtual team there is no NCCL collective (NCCL refuses two ranks on one GPU): stats
 *     kernel, publish kernel, a gather kernel in place of ncclAllGather, apply kernel; at
 *     W = 1 no NCCL call either. Its results must be bitwise those of the coop row (checked);
 *   - cudnn (W = 1 only): cudnnBatchNormalizationForwardTrainingEx / BackwardEx, bnOps
 *     CUDNN_BATCHNORM_OPS_BN, mode CUDNN_BATCHNORM_SPATIAL_PERSISTENT, or
 *     CUDNN_BATCHNORM_SPATIAL where cuDNN refuses it; a single GPU, no sync: the speed a
 *     user gives up nothing to. libcudnn.so.9 is loaded with dlopen at run time (the build
 *     only needs cudnn.h, found by CMake: SBN_BENCH_HAVE_CUDNN_H), so sbn-bench runs where
 *     cuDNN is absent and the row says why; a combination cuDNN does not support is a row
 *     that says so, not a failure. Workspace and reserve space are allocated once, outside
 *     the timing.
 *   Every rank holds the full per-GPU shape, so a W-rank row moves W x one GPU's bytes
 *   through one GPU: the table gives GB/s per rank and in total. Real sizes (--scale 1).
 *   Method (docs/DESIGN.md, "Benchmark methodology"), the same for every path: forward =
 *   sbnForwardTrain (affine, running stats, default params), backward = sbnBackward with
 *   sbnGradGlobal (cuDNN: the same eps and momentum); --warmup calls (default 5), then -i
 *   calls (default 50) timed with CUDA events recorded around the op only; before every
 *   call a cudaMemsetAsync of >= 2x the L2 size flushes the L2 (outside the events).
 *   Median, min and p90 per op. The device-to-device copy bandwidth B is measured in the
 *   same run (cudaMemcpyAsync of 1 GiB, 256 MiB when memory is short; median of 20;
 *   B = 2*bytes/time) and gives each row's floors, |x| = bytes of ALL W ranks' x (they
 *   share the GPU): forward (a) 3|x|/B (x read twice, y written), (b) 2|x|/B; backward
 *   (a) 5|x|/B (x and dy read twice, dx written), (b) 3|x|/B. Speed ratios t/coop =
 *   t_path / t_coop of the same shape, dtype, layout and W (> 1: coop is faster).
 *   After the timed calls, one more forward + backward on freshly uploaded inputs, reset
 *   running stats and NaN-poisoned outputs is copied back and checked as in CPU mode (with
 *   team gradient sums, identical on every rank); cuDNN rows on y, dx, save_mean,
 *   save_invstd, dweight and dbias at their own tolerance (TOL_CUDNN_*). Then a latency
 *   table for every W from 1 to the largest of -w, coop and nccl: a tiny op (N=4, C=512,
 *   1x1, fp32 NCHW, like S10) and an empty one (n=0 on every rank, C=512), forward and
 *   backward: the cost of the launches and the exchange; empty(W) - empty(1) is what the
 *   exchange with W-1 peers adds. The default W list is not trimmed for the large shapes:
 *   by the byte count, the GPU time of the whole default run is seconds on an H100 (at
 *   W=8, S8 fp32 is 1.2 GB per tensor); host-side input generation (threaded; once per
 *   shape x dtype x layout, for the largest W), copies and the checks dominate: estimated
 *   3-5 minutes (not measured on a GPU machine yet).
 *
 * CPU mode — otherwise (a build without CUDA, no device, --gpu off): the CPU team (ranks
 *   are host threads), W = -w (default 2), shapes scaled down by --scale (default 8).
 *   Each timed call is one group (sbnGroupStart; the op for ranks 0..W-1; sbnGroupEnd),
 *   timed on the wall clock; median of -i calls (default 5) after --warmup (default 1).
 *   Also checks that NCHW and NHWC of the same data give the same bits (a CPU-team
 *   guarantee only).
 *
 *   sbn-bench                         GPU: W 1,2,4,8, full size; CPU: W=2, scale 8
 *   sbn-bench --scale 1 --only S5 -i 20 --json s5.json
 *   sbn-bench --gpu on -w 2,8 --only S8 --dtype bf16 --layout NHWC
 *   sbn-bench --gpu on -w 1 --paths coop,cudnn --json cudnn.json
 *
 * Exit status: 0 when every call succeeded and nothing was wrong, 1 otherwise, 2 on a
 * usage error (including --gpu on without a usable GPU). A cuDNN row that could not run
 * (cuDNN not loadable, or the combination not supported) is neither.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "bn_dtype.h"
#include "sbn_bench_build.h" /* generated: sbn_bench_shapes_tsv[], SBN_BENCH_COMMIT */
#include "sbn_ref.h"
#include "syncbn.h"

#ifndef SBN_BENCH_HAVE_CUDA
#define SBN_BENCH_HAVE_CUDA 0
#endif
#if SBN_BENCH_HAVE_CUDA
#include <cuda_runtime_api.h>
#include <dlfcn.h>
#include <limits.h>
#endif
#ifndef SBN_BENCH_HAVE_CUDNN_H
#define SBN_BENCH_HAVE_CUDNN_H 0
#endif
#if SBN_BENCH_HAVE_CUDA && SBN_BENCH_HAVE_CUDNN_H
#include <cudnn.h> /* types only: every cuDNN function is resolved with dlsym */
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

/* Tolerances |got - ref| <= atol + rtol*|ref| (DESIGN.md; what apex and PyTorch use to test
   SyncBN). Statistics are fp32 accumulations of exactly widened inputs whatever the dtype:
   1e-5. fp32 outputs and the fp32 gradient sums: 1e-4. fp16/bf16 outputs are stored
   rounded (bf16 keeps 8 significant bits: half an ulp is 2e-3 relative), so 1e-2 against
   the double reference of the ROUNDED inputs. */
#define TOL_STAT 1e-5
#define TOL_F32 1e-4
#define TOL_HALF 1e-2

/* What a row's check compares, and how closely. */
typedef struct {
  double stat, f32, half; /* atol = rtol for statistics, fp32 values, fp16/bf16 outputs */
  int running;            /* also running_mean, running_var and num_batches_tracked */
} bench_check_t;
static const bench_check_t kCheckLibrary = {TOL_STAT, TOL_F32, TOL_HALF, 1};

/* ---- options, shapes, rows ------------------------------------------------------------ */
typedef enum { BENCH_GPU_AUTO = 0, BENCH_GPU_ON = 1, BENCH_GPU_OFF = 2 } bench_gpu_req_t;

typedef struct {
  bench_gpu_req_t gpu;
  int ranks_list[BENCH_MAX_RANK_LIST]; /* -w as given (GPU mode: every W; CPU mode: one) */
  int nranks_list;                     /* 0: not given */
  int ranks;                           /* CPU mode: the team size; GPU mode: the largest W */
  int iters;                           /* -1 until resolved for the mode */
  int warmup;
  int scale;
  int check_channels; /* 0: every channel */
  const char* shapes_file;
  const char* json_file;
  const char* only;
  int dtype_on[3];  /* indexed by sbnDataType_t */
  int layout_on[2]; /* indexed by sbnLayout_t */
  int path_on[3];   /* GPU mode, indexed by bench_path_t */
  int paths_given;  /* --paths was given */
} bench_opts_t;

/* GPU mode: what a row times (bench_row_t.path). */
typedef enum { BENCH_PATH_COOP = 0, BENCH_PATH_NCCL = 1, BENCH_PATH_CUDNN = 2 } bench_path_t;

typedef struct {
  char id[32];
  int64_t n, c, h, w;
  char where[160];
} bench_shape_t;

/* GPU timings of one op over the timed calls (us). */
typedef struct {
  double med, min, p90; /* CUDA events around the op */
  double host_med;      /* wall time of the enqueueing calls (sbnGroupStart..sbnGroupEnd) */
} bench_times_t;

/* One table row: shape x dtype x layout (x W in GPU mode). */
typedef struct {
  const bench_shape_t* shape;
  int64_t spatial; /* H*W after --scale */
  sbnDataType_t dtype;
  sbnLayout_t layout;
  int W;          /* ranks of the team */
  int gpu;        /* a GPU-mode row (virtual team, or cuDNN on one GPU) */
  int path;       /* GPU mode: bench_path_t */
  int skipped;    /* GPU mode: did not run, not a failure (cuDNN absent or refusing); see note */
  char note[400]; /* GPU mode: what the path did or why it did not run ("" when nothing to say) */
  double us_fwd, us_bwd;
  double gbps_fwd, gbps_bwd;  /* per rank */
  bench_times_t t_fwd, t_bwd; /* GPU mode */
  int64_t checked;            /* values compared */
  int64_t wrong;              /* values outside tolerance, or bitwise guarantees broken */
  double worst;               /* largest |got - ref| / tolerance */
  char worst_what[96];
  char error[384]; /* non-empty: a call failed; the row was not checked */
  char kernel[2][24]; /* what ran [bwd, fwd]: sbnCommGetKernel ("onchip", "stream", ...,
                         "host", "cpu"), "cudnn"; "" when nothing ran */
} bench_row_t;

/* The kernel rank 0's latest op ran (sbnCommGetKernel), into row->kernel[fwd]. */
static void note_kernel(bench_row_t* row, sbnComm_t comm, int fwd) {
  const char* k = NULL;
  if (sbnCommGetKernel(comm, &k) != sbnSuccess || k == NULL) k = "?";
  snprintf(row->kernel[fwd], sizeof row->kernel[fwd], "%s", k);
}
/* "onchip" when forward and backward ran the same kernel, else "onchip/stream" (fwd/bwd). */
static const char* kernel_label(const bench_row_t* r, char* buf, size_t cap) {
  if (strcmp(r->kernel[1], r->kernel[0]) == 0)
    snprintf(buf, cap, "%s", r->kernel[1][0] ? r->kernel[1] : "-");
  else
    snprintf(buf, cap, "%s/%s", r->kernel[1][0] ? r->kernel[1] : "-",
             r->kernel[0][0] ? r->kernel[0] : "-");
  return buf;
}

static const char* const kDtypeNames[3] = {"fp32", "fp16", "bf16"}; /* sbnDataType_t order */
static const char* const kLayoutNames[2] = {"NCHW", "NHWC"};        /* sbnLayout_t order */
static const char* const kGpuReqNames[3] = {"auto", "on", "off"};   /* bench_gpu_req_t order */
static const char* const kPathNames[3] = {"coop", "nccl", "cudnn"}; /* bench_path_t order */

static size_t dtype_size(sbnDataType_t t) {
  return t == sbnFloat32 ? 4 : 2;
}

/* malloc that returns a pointer for 0 bytes too (empty ranks) */
static void* bmalloc(size_t bytes) {
  return malloc(bytes ? bytes : 1);
}

static void usage(FILE* f, const char* argv0) {
  fprintf(f,
          "usage: %s [options]\n"
          "Times SyncBN forward + backward on per-GPU shapes and checks every result\n"
          "against the double-precision reference. With CUDA in the build and a CUDA\n"
          "device: virtual teams (W ranks on GPU 0), the library's cooperative path\n"
          "(coop) and host-driven path (nccl, SBN_ALGO=nccl) side by side, and cuDNN's\n"
          "batch norm at W = 1 (libcudnn.so.9 loaded at run time), timed with CUDA\n"
          "events. Otherwise: the CPU team (ranks are host threads), and the header says\n"
          "why. This build: %s.\n"
          "  --gpu auto|on|off     auto: GPU mode when a device is there (default);\n"
          "                        on: GPU mode or exit 2; off: CPU team\n"
          "  -w, --ranks LIST      GPU: comma list of team sizes W <= %d (default %s);\n"
          "                        CPU: ranks in the team, one value (default %d)\n"
          "  -i, --iters N         timed calls per op; the median is reported\n"
          "                        (GPU default %d, the methodology's minimum; CPU default %d)\n"
          "      --warmup N        untimed calls before them (GPU default %d, CPU default %d)\n"
          "      --scale S         divide each shape's H*W by S (kept >= 1; N, C kept);\n"
          "                        1 = full size (GPU default %d, CPU default %d)\n"
          "      --shapes FILE     shape table, lines 'id N C H W [where]', '#' comments;\n"
          "                        default: bench/shapes.tsv as embedded at build time\n"
          "      --only LIST       comma list of shape ids, e.g. S3,S5\n"
          "      --dtype LIST      comma list of fp32, bf16, fp16 (default fp32,bf16)\n"
          "      --layout LIST     comma list of NCHW, NHWC (default NCHW,NHWC)\n"
          "      --paths LIST      GPU: comma list of coop, nccl, cudnn (default all three;\n"
          "                        cudnn runs at W = 1 only)\n"
          "      --check-channels K  channels checked per row, spread over C; 0 = all\n"
          "                        (default %d)\n"
          "      --json FILE       also write the metadata and every row as JSON\n"
          "  -h, --help            this text\n"
          "Exit status: 0 all correct, 1 a wrong value or a failed call, 2 usage error.\n",
          argv0, SBN_BENCH_HAVE_CUDA ? "with CUDA" : "without CUDA (CPU team only)",
          SBN_MAX_GPU_TEAM_RANKS, BENCH_GPU_DEFAULT_RANKS, BENCH_DEFAULT_RANKS,
          BENCH_GPU_DEFAULT_ITERS, BENCH_DEFAULT_ITERS, BENCH_GPU_DEFAULT_WARMUP,
          BENCH_DEFAULT_WARMUP, BENCH_GPU_DEFAULT_SCALE, BENCH_DEFAULT_SCALE, BENCH_CHECK_CHANNELS);
}

static int usage_error(const char* argv0, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: ", argv0);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (try -h)\n");
  va_end(ap);
  return 2;
}

static int parse_int(const char* s, int lo, int hi, int* out) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || end == s || *end != '\0' || v < lo || v > hi) return -1;
  *out = (int)v;
  return 0;
}

/* Comma list of integers in [lo, hi], at most max of them; -1 when malformed or empty. */
static int parse_int_list(const char* list, int lo, int hi, int* out, int max, int* count) {
  char buf[256];
  int k = 0;
  if (strlen(list) >= sizeof buf) return -1;
  strcpy(buf, list);
  for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    if (k == max || parse_int(tok, lo, hi, &out[k])) return -1;
    k++;
  }
  if (k == 0) return -1;
  *count = k;
  return 0;
}

static int ascii_casecmp(const char* a, const char* b) {
  for (;; a++, b++) {
    int ca = (*a >= 'A' && *a <= 'Z') ? *a + 32 : *a;
    int cb = (*b >= 'A' && *b <= 'Z') ? *b + 32 : *b;
    if (ca != cb || ca == 0) return ca - cb;
  }
}

/* Sets on[0..count) from a comma list of names; -1 on an unknown name or an empty list. */
static int parse_name_list(const char* list, const char* const* names, int count, int* on) {
  char buf[256];
  int any = 0;
  if (strlen(list) >= sizeof buf) return -1;
  strcpy(buf, list);
  for (int i = 0; i < count; i++) on[i] = 0;
  for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    int found = 0;
    for (int i = 0; i < count; i++)
      if (ascii_casecmp(tok, names[i]) == 0) on[i] = found = any = 1;
    if (!found) return -1;
  }
  return any ? 0 : -1;
}

/* 1 if id is in the comma list (exact, case-insensitive). */
static int list_has(const char* list, const char* id) {
  size_t len = strlen(id);
  for (const char* p = list; *p;) {
    const char* end = strchr(p, ',');
    size_t tl = end ? (size_t)(end - p) : strlen(p);
    if (tl == len) {
      char tok[64];
      if (tl < sizeof tok) {
        memcpy(tok, p, tl);
        tok[tl] = '\0';
        if (ascii_casecmp(tok, id) == 0) return 1;
      }
    }
    if (!end) break;
    p = end + 1;
  }
  return 0;
}

/* Parses a shape table: 'id N C H W [where...]' per line, '#' starts a comment line.
   Returns the number of shapes, or -1 after printing what is wrong. */
static int parse_shapes(const char* text, const char* source, bench_shape_t* shapes, int max) {
  int count = 0, lineno = 0;
  const char* p = text;
  while (*p) {
    const char* eol = strchr(p, '\n');
    size_t len = eol ? (size_t)(eol - p) : strlen(p);
    char line[512];
    lineno++;
    if (len >= sizeof line) {
      fprintf(stderr, "%s:%d: line too long\n", source, lineno);
      return -1;
    }
    memcpy(line, p, len);
    line[len] = '\0';
    p += len + (eol ? 1 : 0);
    char* s = line;
    while (*s == ' ' || *s == '\t' || *s == '\r') s++;
    if (*s == '\0' || *s == '#') continue;
    if (count == max) {
      fprintf(stderr, "%s: more than %d shapes\n", source, max);
      return -1;
    }
    bench_shape_t* sh = &shapes[count];
    long long n, c, h, w;
    int used = 0;
    if (sscanf(s, "%31s %lld %lld %lld %lld %n", sh->id, &n, &c, &h, &w, &used) < 5 || n < 1 ||
        c < 1 || h < 1 || w < 1) {
      fprintf(stderr, "%s:%d: expected 'id N C H W [where]' with N, C, H, W >= 1\n", source,
              lineno);
      return -1;
    }
    sh->n = n;
    sh->c = c;
    sh->h = h;
    sh->w = w;
    snprintf(sh->where, sizeof sh->where, "%s", s + used);
    for (size_t i = strlen(sh->where);
         i > 0 && (sh->where[i - 1] == '\r' || sh->where[i - 1] == ' '); i--)
      sh->where[i - 1] = '\0';
    count++;
  }
  return count;
}

static char* read_file(const char* path) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 4096, len = 0;
  char* buf = malloc(cap);
  while (buf) {
    len += fread(buf + len, 1, cap - len - 1, f);
    if (len < cap - 1) break;
    char* bigger = realloc(buf, cap * 2);
    if (!bigger) {
      free(buf);
      buf = NULL;
      break;
    }
    buf = bigger;
    cap *= 2;
  }
  if (buf) buf[len] = '\0';
  fclose(f);
  return buf;
}

/* ---- timing ------------------------------------------------------------------------- */
static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* ---- input data --------------------------------------------------------------------- */
static uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

/* Roughly normal, mean 0, variance 1: the sum of four 16-bit uniforms of one hash of
   (stream, i). A function of the element's logical index, so NCHW and NHWC hold the same
   data (the bench checks that they give the same bits). */
static float noise(uint64_t stream, uint64_t i) {
  uint64_t h = splitmix64(stream * 0x100000001b3ull ^ i);
  double sum = (double)(h & 0xffff) + (double)((h >> 16) & 0xffff) + (double)((h >> 32) & 0xffff) +
               (double)(h >> 48);
  return (float)((sum - 131070.0) * (1.0 / 37837.23)); /* sd of the sum: 65536*sqrt(4/12) */
}

static uint64_t string_hash(const char* s) {
  uint64_t h = 1469598103934665603ull; /* FNV-1a */
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

static void store_elem(void* p, sbnDataType_t t, int64_t i, float v) {
  if (t == sbnFloat32)
    ((float*)p)[i] = v;
  else if (t == sbnBFloat16)
    ((uint16_t*)p)[i] = sbn_f32_to_bf16(v);
  else
    ((uint16_t*)p)[i] = sbn_f32_to_f16(v);
}

/* p: (N, C, spatial) in d's layout; element (ni, ci, si) = offset[ci] + scale[ci] * noise.
   Writes samples ni in [n0, n1). */
static void fill_tensor(void* p, const sbnTensorDesc_t* d, uint64_t stream, const float* offset,
                        const float* scale, int64_t n0, int64_t n1) {
  const int64_t c = d->c, s = d->spatial;
  for (int64_t ni = n0; ni < n1; ni++) {
    if (d->layout == sbnLayoutNCHW) {
      for (int64_t ci = 0; ci < c; ci++)
        for (int64_t si = 0; si < s; si++) {
          int64_t i = (ni * c + ci) * s + si;
          store_elem(p, d->dtype, i, offset[ci] + scale[ci] * noise(stream, (uint64_t)i));
        }
    } else {
      for (int64_t si = 0; si < s; si++)
        for (int64_t ci = 0; ci < c; ci++) {
          int64_t logical = (ni * c + ci) * s + si;
          store_elem(p, d->dtype, (ni * s + si) * c + ci,
                     offset[ci] + scale[ci] * noise(stream, (uint64_t)logical));
        }
    }
  }
}

/* Filling is spread over host threads (the GPU mode's inputs are GBs): jobs of whole
   samples, each a pure function of the element indices, so the data do not depend on
   the number of threads. */
typedef struct {
  void* p;
  const sbnTensorDesc_t* d;
  uint64_t stream;
  const float *offset, *scale;
  int64_t n0, n1;
} fill_job_t;

typedef struct {
  const fill_job_t* jobs;
  int njobs;
  atomic_int next;
} fill_queue_t;

static void* fill_worker(void* arg) {
  fill_queue_t* q = arg;
  for (int j = atomic_fetch_add(&q->next, 1); j < q->njobs; j = atomic_fetch_add(&q->next, 1)) {
    const fill_job_t* jb = &q->jobs[j];
    fill_tensor(jb->p, jb->d, jb->stream, jb->offset, jb->scale, jb->n0, jb->n1);
  }
  return NULL;
}

#define BENCH_MAX_FILL_THREADS 64
static void fill_run(const fill_job_t* jobs, int njobs) {
  fill_queue_t q;
  q.jobs = jobs;
  q.njobs = njobs;
  atomic_init(&q.next, 0);
  long cores = sysconf(_SC_NPROCESSORS_ONLN);
  int nthreads = cores < 1                        ? 1
                 : cores > BENCH_MAX_FILL_THREADS ? BENCH_MAX_FILL_THREADS
                                                  : (int)cores;
  if (nthreads > njobs) nthreads = njobs;
  pthread_t th[BENCH_MAX_FILL_THREADS];
  int started = 0;
  for (int t = 1; t < nthreads; t++)
    if (pthread_create(&th[started], NULL, fill_worker, &q) == 0) started++;
  fill_worker(&q); /* this thread works too; with no helper it does everything */
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
}

/* ---- the team's buffers ------------------------------------------------------------- */
typedef struct {
  int W;
  sbnTensorDesc_t desc;
  void **x, **y, **dy, **dx;                    /* [W] of (N, C, spatial) */
  float *weight, *bias;                         /* [C], shared by the ranks */
  float **rm, **rv, **save_mean, **save_invstd; /* [W] of [C] */
  float **dweight, **dbias;                     /* [W] of [C] */
  int64_t* nbt;                                 /* [W] */
} bench_team_bufs_t;

static void bufs_free(bench_team_bufs_t* b) {
  void** per_rank[] = {b->x, b->y, b->dy, b->dx};
  for (size_t k = 0; k < sizeof per_rank / sizeof *per_rank; k++) {
    for (int r = 0; per_rank[k] && r < b->W; r++) free(per_rank[k][r]);
    free(per_rank[k]);
  }
  float** chans[] = {b->rm, b->rv, b->save_mean, b->save_invstd, b->dweight, b->dbias};
  for (size_t k = 0; k < sizeof chans / sizeof *chans; k++) {
    for (int r = 0; chans[k] && r < b->W; r++) free(chans[k][r]);
    free(chans[k]);
  }
  free(b->weight);
  free(b->bias);
  free(b->nbt);
  memset(b, 0, sizeof *b);
}

/* 0, or -1 when out of memory (b is freed). */
static int bufs_alloc(bench_team_bufs_t* b, int W, const sbnTensorDesc_t* d) {
  memset(b, 0, sizeof *b);
  b->W = W;
  b->desc = *d;
  size_t bytes = (size_t)(d->n * d->c * d->spatial) * dtype_size(d->dtype);
  size_t cbytes = (size_t)d->c * sizeof(float);
  int ok = 1;
  void*** tensors[] = {&b->x, &b->y, &b->dy, &b->dx};
  for (size_t k = 0; k < 4; k++) {
    *tensors[k] = calloc((size_t)W, sizeof(void*));
    ok = ok && *tensors[k];
    for (int r = 0; ok && r < W; r++) ok = ((*tensors[k])[r] = bmalloc(bytes)) != NULL;
  }
  float*** chans[] = {&b->rm, &b->rv, &b->save_mean, &b->save_invstd, &b->dweight, &b->dbias};
  for (size_t k = 0; ok && k < 6; k++) {
    *chans[k] = calloc((size_t)W, sizeof(float*));
    ok = ok && *chans[k];
    for (int r = 0; ok && r < W; r++) ok = ((*chans[k])[r] = malloc(cbytes)) != NULL;
  }
  ok = ok && (b->weight = malloc(cbytes)) && (b->bias = malloc(cbytes)) &&
       (b->nbt = calloc((size_t)W, sizeof(int64_t)));
  if (!ok) {
    bufs_free(b);
    return -1;
  }
  return 0;
}

/* Running stats start at (0, 1), num_batches_tracked at 0. */
static void bufs_reset_state(bench_team_bufs_t* b) {
  for (int r = 0; r < b->W; r++) {
    for (int64_t ci = 0; ci < b->desc.c; ci++) {
      b->rm[r][ci] = 0.0f;
      b->rv[r][ci] = 1.0f;
    }
    b->nbt[r] = 0;
  }
}

/* Inputs: x ~ offset_c + scale_c * N(0,1), different per rank (rank r's data do not depend
   on W); dy ~ N(0,1); affine weight in [0.5, 1.5], bias in [-0.5, 0.5]; running stats
   start at (0, 1). */
static int bufs_init(bench_team_bufs_t* b, const char* shape_id) {
  const sbnTensorDesc_t* d = &b->desc;
  const uint64_t base = string_hash(shape_id);
  float* per_channel = malloc((size_t)d->c * 4 * sizeof(float));
  /* jobs of about 2^20 elements (whole samples) */
  int64_t per_sample = d->c * d->spatial;
  int64_t step = per_sample >= (1 << 20) ? 1 : (1 << 20) / per_sample;
  int64_t chunks = d->n == 0 ? 0 : (d->n + step - 1) / step;
  fill_job_t* jobs = malloc((size_t)(2 * b->W * chunks + 1) * sizeof *jobs);
  if (!per_channel || !jobs) {
    free(per_channel);
    free(jobs);
    return -1;
  }
  float *offset = per_channel, *scale = offset + d->c, *zero = scale + d->c, *one = zero + d->c;
  for (int64_t ci = 0; ci < d->c; ci++) {
    uint64_t h = splitmix64(base ^ (uint64_t)ci);
    offset[ci] = (float)((double)(h & 0xffffff) / 16777216.0 * 6.0 - 3.0);
    scale[ci] = (float)(0.5 + (double)((h >> 24) & 0xffffff) / 16777216.0 * 1.5);
    zero[ci] = 0.0f;
    one[ci] = 1.0f;
    b->weight[ci] = (float)(0.5 + (double)(h >> 48) / 65536.0);
    b->bias[ci] = (float)((double)((h >> 8) & 0xffff) / 65536.0 - 0.5);
  }
  int njobs = 0;
  for (int r = 0; r < b->W; r++)
    for (int64_t n0 = 0; n0 < d->n; n0 += step) {
      int64_t n1 = n0 + step < d->n ? n0 + step : d->n;
      fill_job_t jx = {b->x[r], d, base + 2 * (uint64_t)r, offset, scale, n0, n1};
      fill_job_t jdy = {b->dy[r], d, base + 2 * (uint64_t)r + 1, zero, one, n0, n1};
      jobs[njobs++] = jx;
      jobs[njobs++] = jdy;
    }
  fill_run(jobs, njobs);
  bufs_reset_state(b);
  free(jobs);
  free(per_channel);
  return 0;
}

/* ---- the timed calls ---------------------------------------------------------------- */
/* Records the first failure in err (empty until then); later ones are dropped. */
static void note_failure(char* err, size_t cap, const char* call, int rank, sbnResult_t res,
                         const char* detail) {
  if (err[0]) return;
  if (rank >= 0)
    snprintf(err, cap, "rank %d %s: %s: %s", rank, call, sbnGetResultName(res), detail);
  else
    snprintf(err, cap, "%s: %s: %s", call, sbnGetResultName(res), detail);
}

/* Runs one forward (fwd != 0) or backward over the whole team as one group (b holds host
   pointers for the CPU team, device pointers for a GPU team; GPU ops are only queued on
   `stream`). Returns the wall time of the calls in us, or -1 with err set. */
static double team_call(sbnComm_t* comms, bench_team_bufs_t* b, int fwd, const sbnParams_t* p,
                        sbnStream_t stream, char* err, size_t cap) {
  const sbnTensorDesc_t* d = &b->desc;
  int failed = 0;
  double t0 = now_us();
  sbnResult_t res = sbnGroupStart();
  if (res != sbnSuccess) {
    note_failure(err, cap, "sbnGroupStart", -1, res, sbnGetLastError(NULL));
    return -1;
  }
  for (int r = 0; r < b->W; r++) {
    if (fwd)
      res = sbnForwardTrain(comms[r], d, b->x[r], b->y[r], b->weight, b->bias, b->rm[r], b->rv[r],
                            &b->nbt[r], b->save_mean[r], b->save_invstd[r], p, stream);
    else
      res = sbnBackward(comms[r], d, b->x[r], b->dy[r], b->dx[r], b->weight, b->save_mean[r],
                        b->save_invstd[r], b->dweight[r], b->dbias[r], p, stream);
    if (res != sbnSuccess) {
      note_failure(err, cap, fwd ? "sbnForwardTrain" : "sbnBackward", r, res,
                   sbnGetLastError(comms[r]));
      failed = 1;
    }
  }
  res = sbnGroupEnd();
  double t = now_us() - t0;
  if (res != sbnSuccess) {
    const char* detail = sbnGetLastError(NULL);
    char buf[256];
    snprintf(buf, sizeof buf, "%s", detail);
    for (int r = 0; !buf[0] && r < b->W; r++)
      snprintf(buf, sizeof buf, "%s", sbnGetLastError(comms[r]));
    note_failure(err, cap, "sbnGroupEnd", -1, res, buf);
    failed = 1;
  }
  return failed ? -1 : t;
}

/* ---- checking ----------------------------------------------------------------------- */
/* "S1 fp32 NCHW", and " W=8 coop" for GPU rows (one table holds several W and paths). */
static const char* row_label(const bench_row_t* r, char* buf, size_t cap) {
  if (r->gpu)
    snprintf(buf, cap, "%s %s %s W=%d %s", r->shape->id, kDtypeNames[r->dtype],
             kLayoutNames[r->layout], r->W, kPathNames[r->path]);
  else
    snprintf(buf, cap, "%s %s %s", r->shape->id, kDtypeNames[r->dtype], kLayoutNames[r->layout]);
  return buf;
}

static void check_value(bench_row_t* row, const char* what, int rank, int64_t ci, int64_t i,
                        double got, double ref, double tol_abs, double tol_rel) {
  double err = fabs(got - ref);
  double tol = tol_abs + tol_rel * fabs(ref);
  double used = err / tol;
  row->checked++;
  if (!(err <= tol)) {
    if (isnan(used)) used = INFINITY;
    if (row->wrong++ < BENCH_MAX_WRONG_PRINTED) {
      char elem[32] = "", label[96];
      if (i >= 0) snprintf(elem, sizeof elem, " element %" PRId64, i);
      fprintf(stderr,
              "# WRONG %s: %s rank %d channel %" PRId64
              "%s: got %.9g ref %.9g "
              "(|diff| %.3g > tol %.3g)\n",
              row_label(row, label, sizeof label), what, rank, ci, elem, got, ref, err, tol);
    }
  }
  if (used > row->worst) {
    row->worst = used;
    if (i >= 0)
      snprintf(row->worst_what, sizeof row->worst_what, "%s r%d c%" PRId64 " i%" PRId64, what, rank,
               ci, i);
    else
      snprintf(row->worst_what, sizeof row->worst_what, "%s r%d c%" PRId64, what, rank, ci);
  }
}

static void check_bitwise(bench_row_t* row, const char* what, int64_t count, const void* got,
                          const void* want, size_t esize) {
  char label[96];
  for (int64_t i = 0; i < count; i++) {
    row->checked++;
    if (memcmp((const char*)got + (size_t)i * esize, (const char*)want + (size_t)i * esize,
               esize) != 0 &&
        row->wrong++ < BENCH_MAX_WRONG_PRINTED)
      fprintf(stderr, "# WRONG %s: %s differs bitwise at %" PRId64 "\n",
              row_label(row, label, sizeof label), what, i);
  }
}

/* Bits kept from the NCHW row of a shape x dtype for the NHWC row to compare with: rank 0's
   statistics and gradient sums [C], and its y and dx on the checked channels. */
typedef struct {
  int valid;
  const bench_shape_t* shape;
  sbnDataType_t dtype;
  int64_t c, packed_numel;
  float *save_mean, *save_invstd, *dweight, *dbias;
  unsigned char *y, *dx;
} bench_layout_keep_t;

static void keep_free(bench_layout_keep_t* k) {
  free(k->save_mean);
  free(k->y);
  memset(k, 0, sizeof *k);
}

/* Copies channels chs[0..k) of tensor p (desc d) into out, packed (N, k, spatial). */
static void pack_channels(void* out, const void* p, const sbnTensorDesc_t* d, const int64_t* chs,
                          int64_t k) {
  size_t es = dtype_size(d->dtype);
  for (int64_t ni = 0; ni < d->n; ni++)
    for (int64_t j = 0; j < k; j++)
      for (int64_t si = 0; si < d->spatial; si++)
        memcpy((char*)out + (size_t)((ni * k + j) * d->spatial + si) * es,
               (const char*)p + (size_t)sbn_ref_index(d, ni, chs[j], si) * es, es);
}

/* Checks the outputs of the last calls (`calls` forwards, then as many backwards, on the
   same inputs; b: host memory) against sbn_ref on kmax channels spread over C (first and
   last included), and the bitwise guarantees: every rank has the same statistics (and,
   with sbnGradGlobal, the same dweight/dbias, the team sums); with keep != NULL (CPU team)
   the NHWC row of a shape x dtype has the bits of its NCHW row. The backward ran with
   grad_mode. `how`: the tolerances, and whether the running stats and num_batches_tracked
   are compared. Shared by both modes (GPU results are copied to the host first). Out of
   memory sets row->error. */
static void check_row(bench_row_t* row, const bench_team_bufs_t* b, int calls, int kmax,
                      bench_layout_keep_t* keep, sbnGradMode_t grad_mode,
                      const bench_check_t* how) {
  const sbnTensorDesc_t* d = &b->desc;
  const int W = b->W;
  const int64_t C = d->c, S = d->spatial, n = d->n;
  const int64_t k = (kmax <= 0 || kmax >= C) ? C : kmax;
  const size_t es = dtype_size(d->dtype);
  const double tol_out = d->dtype == sbnFloat32 ? how->f32 : how->half;
  const int64_t pn = n * k * S; /* packed elements per rank */
  const sbnParams_t params = SBN_PARAMS_DEFAULT;
  int ok = 1;

  int64_t* chs = malloc((size_t)k * sizeof *chs);
  float* wk = malloc((size_t)k * 2 * sizeof(float));
  /* mean, invstd, varu, rm, rv, team dweight, team dbias */
  double* stat = malloc((size_t)k * 7 * sizeof(double));
  void** xs = calloc((size_t)W * 2, sizeof(void*));
  double** outs = calloc((size_t)W * 4, sizeof(double*)); /* y, dx, dweight, dbias */
  sbnTensorDesc_t* descs = malloc((size_t)W * sizeof *descs);
  ok = chs && wk && stat && xs && outs && descs;
  for (int r = 0; ok && r < W; r++) {
    ok = (xs[r] = bmalloc((size_t)pn * es)) && (xs[W + r] = bmalloc((size_t)pn * es)) &&
         (outs[r] = bmalloc((size_t)pn * sizeof(double))) &&
         (outs[W + r] = bmalloc((size_t)pn * sizeof(double))) &&
         (outs[2 * W + r] = malloc((size_t)k * sizeof(double))) &&
         (outs[3 * W + r] = malloc((size_t)k * sizeof(double)));
  }
  if (!ok) {
    snprintf(row->error, sizeof row->error, "out of memory for the check");
    goto done;
  }
  for (int64_t j = 0; j < k; j++) chs[j] = k == 1 ? 0 : j * (C - 1) / (k - 1);
  float *wk_w = wk, *wk_b = wk + k;
  for (int64_t j = 0; j < k; j++) {
    wk_w[j] = b->weight[chs[j]];
    wk_b[j] = b->bias[chs[j]];
  }
  for (int r = 0; r < W; r++) {
    descs[r] = *d;
    descs[r].layout = sbnLayoutNCHW;
    descs[r].c = k;
    pack_channels(xs[r], b->x[r], d, chs, k);
    pack_channels(xs[W + r], b->dy[r], d, chs, k);
  }
  double *mean = stat, *invstd = stat + k, *varu = stat + 2 * k, *rm = stat + 3 * k,
         *rv = stat + 4 * k, *gdw = stat + 5 * k, *gdb = stat + 6 * k;
  int64_t m = 0;
  sbn_ref_forward(W, descs, (const void* const*)xs, wk_w, wk_b, params.eps, mean, invstd, varu, &m,
                  outs);
  for (int64_t j = 0; j < k; j++) {
    rm[j] = 0.0;
    rv[j] = 1.0;
  }
  for (int call = 0; call < calls; call++)
    sbn_ref_running(k, m, mean, varu, params.momentum, call, rm, rv);
  sbn_ref_backward(W, descs, (const void* const*)xs, (const void* const*)(xs + W), wk_w, mean,
                   invstd, outs + W, outs + 2 * W, outs + 3 * W, gdw, gdb);
  const int global = grad_mode == sbnGradGlobal;

  for (int r = 0; r < W; r++) {
    for (int64_t j = 0; j < k; j++) {
      int64_t ci = chs[j];
      check_value(row, "save_mean", r, ci, -1, b->save_mean[r][ci], mean[j], how->stat, how->stat);
      check_value(row, "save_invstd", r, ci, -1, b->save_invstd[r][ci], invstd[j], how->stat,
                  how->stat);
      if (how->running) {
        check_value(row, "running_mean", r, ci, -1, b->rm[r][ci], rm[j], how->stat, how->stat);
        check_value(row, "running_var", r, ci, -1, b->rv[r][ci], rv[j], how->stat, how->stat);
      }
      check_value(row, "dweight", r, ci, -1, b->dweight[r][ci],
                  global ? gdw[j] : outs[2 * W + r][j], how->f32, how->f32);
      check_value(row, "dbias", r, ci, -1, b->dbias[r][ci], global ? gdb[j] : outs[3 * W + r][j],
                  how->f32, how->f32);
      for (int64_t ni = 0; ni < n; ni++)
        for (int64_t si = 0; si < S; si++) {
          int64_t i = sbn_ref_index(d, ni, ci, si), pi = (ni * k + j) * S + si;
          check_value(row, "y", r, ci, i, sbn_ref_load(b->y[r], d->dtype, i), outs[r][pi], tol_out,
                      tol_out);
          check_value(row, "dx", r, ci, i, sbn_ref_load(b->dx[r], d->dtype, i), outs[W + r][pi],
                      tol_out, tol_out);
        }
    }
    if (how->running) {
      row->checked++;
      if (b->nbt[r] != calls && row->wrong++ < BENCH_MAX_WRONG_PRINTED) {
        char label[96];
        fprintf(stderr, "# WRONG %s: rank %d num_batches_tracked %" PRId64 ", expected %d\n",
                row_label(row, label, sizeof label), r, b->nbt[r], calls);
      }
    }
    /* Every rank holds bitwise-identical statistics. */
    if (r > 0) {
      check_bitwise(row, "save_mean (rank vs rank 0)", C, b->save_mean[r], b->save_mean[0], 4);
      check_bitwise(row, "save_invstd (rank vs rank 0)", C, b->save_invstd[r], b->save_invstd[0],
                    4);
      check_bitwise(row, "running_mean (rank vs rank 0)", C, b->rm[r], b->rm[0], 4);
      check_bitwise(row, "running_var (rank vs rank 0)", C, b->rv[r], b->rv[0], 4);
      if (global) {
        check_bitwise(row, "dweight (rank vs rank 0)", C, b->dweight[r], b->dweight[0], 4);
        check_bitwise(row, "dbias (rank vs rank 0)", C, b->dbias[r], b->dbias[0], 4);
      }
    }
  }

  /* NCHW and NHWC of the same data: the same bits. The NCHW row keeps, the NHWC row compares. */
  if (!keep) goto done;
  if (keep->valid && keep->shape == row->shape && keep->dtype == d->dtype && keep->c == C &&
      keep->packed_numel == pn && d->layout == sbnLayoutNHWC) {
    check_bitwise(row, "save_mean (NHWC vs NCHW)", C, b->save_mean[0], keep->save_mean, 4);
    check_bitwise(row, "save_invstd (NHWC vs NCHW)", C, b->save_invstd[0], keep->save_invstd, 4);
    check_bitwise(row, "dweight (NHWC vs NCHW)", C, b->dweight[0], keep->dweight, 4);
    check_bitwise(row, "dbias (NHWC vs NCHW)", C, b->dbias[0], keep->dbias, 4);
    pack_channels(xs[0], b->y[0], d, chs, k);
    check_bitwise(row, "y (NHWC vs NCHW)", pn, xs[0], keep->y, es);
    pack_channels(xs[0], b->dx[0], d, chs, k);
    check_bitwise(row, "dx (NHWC vs NCHW)", pn, xs[0], keep->dx, es);
  }
  keep_free(keep);
  if (d->layout == sbnLayoutNCHW) {
    size_t cb = (size_t)C * sizeof(float);
    keep->save_mean = malloc(cb * 4);
    keep->y = malloc((size_t)pn * es * 2);
    if (keep->save_mean && keep->y) {
      keep->valid = 1;
      keep->shape = row->shape;
      keep->dtype = d->dtype;
      keep->c = C;
      keep->packed_numel = pn;
      keep->save_invstd = keep->save_mean + C;
      keep->dweight = keep->save_mean + 2 * C;
      keep->dbias = keep->save_mean + 3 * C;
      keep->dx = keep->y + (size_t)pn * es;
      memcpy(keep->save_mean, b->save_mean[0], cb);
      memcpy(keep->save_invstd, b->save_invstd[0], cb);
      memcpy(keep->dweight, b->dweight[0], cb);
      memcpy(keep->dbias, b->dbias[0], cb);
      pack_channels(keep->y, b->y[0], d, chs, k);
      pack_channels(keep->dx, b->dx[0], d, chs, k);
    } else {
      keep_free(keep);
    }
  }

done:
  for (int r = 0; xs && outs && r < W; r++) {
    free(xs[r]);
    free(xs[W + r]);
    for (int q = 0; q < 4; q++) free(outs[q * W + r]);
  }
  free(xs);
  free(outs);
  free(descs);
  free(stat);
  free(wk);
  free(chs);
}

/* One CPU-team row: allocate, fill, time forward then backward, check. */
static void run_row(bench_row_t* row, sbnComm_t* comms, const bench_opts_t* o,
                    bench_layout_keep_t* keep) {
  sbnTensorDesc_t d = {row->dtype, row->layout, row->shape->n, row->shape->c, row->spatial};
  bench_team_bufs_t b;
  if (bufs_alloc(&b, o->ranks, &d) != 0) {
    snprintf(row->error, sizeof row->error,
             "out of memory for %d ranks of (%" PRId64 ", %" PRId64 ", %" PRId64 ")", o->ranks, d.n,
             d.c, d.spatial);
    return;
  }
  double* times = malloc((size_t)o->iters * sizeof(double));
  if (!times || bufs_init(&b, row->shape->id) != 0) {
    free(times);
    snprintf(row->error, sizeof row->error, "out of memory");
    bufs_free(&b);
    return;
  }
  const double elems = (double)d.n * (double)d.c * (double)d.spatial;
  const double es = (double)dtype_size(d.dtype);
  const sbnParams_t params = SBN_PARAMS_DEFAULT;
  for (int fwd = 1; fwd >= 0; fwd--) {
    for (int it = 0; it < o->warmup + o->iters; it++) {
      double t = team_call(comms, &b, fwd, &params, NULL, row->error, sizeof row->error);
      if (t < 0) goto out;
      if (it >= o->warmup) times[it - o->warmup] = t;
    }
    note_kernel(row, comms[0], fwd);
    double us = median(times, o->iters);
    if (fwd) {
      row->us_fwd = us;
      row->gbps_fwd = 2.0 * elems * es / (us * 1e3); /* read x, write y */
    } else {
      row->us_bwd = us;
      row->gbps_bwd = 3.0 * elems * es / (us * 1e3); /* read x, dy; write dx */
    }
  }
  check_row(row, &b, o->warmup + o->iters, o->check_channels, keep, params.grad_mode,
            &kCheckLibrary);
out:
  free(times);
  bufs_free(&b);
}

/* ---- GPU mode: virtual teams (coop, nccl) and cuDNN ----------------------------------- */
#if SBN_BENCH_HAVE_CUDA
typedef struct {
  int device;
  char name[256];
  char pci[32];
  int sms, cc_major, cc_minor, driver, runtime, l2_bytes;
  size_t mem_total;
  size_t copy_bytes; /* of the bandwidth copy */
  double copy_us;    /* its median time */
  double copy_gbps;  /* B = 2 * copy_bytes / copy_us (read + write), GB/s */
  size_t flush_bytes;
  void* flush; /* written before every timed call: evicts the L2 */
  cudaStream_t stream;
  cudaEvent_t* ev; /* 2 per timed call */
  int nev;
  char dead[256]; /* non-empty after a sticky CUDA error: later rows are not run */
} bench_gpu_t;

static void cuda_note(char* err, size_t cap, const char* what, cudaError_t e) {
  if (err[0]) return;
  snprintf(err, cap, "%s: %s (%s)", what, cudaGetErrorName(e), cudaGetErrorString(e));
}

/* For functions with `char* err, size_t cap` and a `fail:` label. */
#define GPU_TRY(call, what)            \
  do {                                 \
    cudaError_t e_ = (call);           \
    if (e_ != cudaSuccess) {           \
      cuda_note(err, cap, (what), e_); \
      goto fail;                       \
    }                                  \
  } while (0)

/* 1 when CUDA sees a device; 0 with the reason in why. */
static int gpu_present(char* why, size_t cap) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    snprintf(why, cap, "no CUDA device (cudaGetDeviceCount: %s)", cudaGetErrorName(e));
    (void)cudaGetLastError();
    return 0;
  }
  if (n < 1) {
    snprintf(why, cap, "no CUDA device (cudaGetDeviceCount: 0)");
    return 0;
  }
  return 1;
}

/* Median, min and p90 (nearest rank) of n samples; sorts v. */
static void times_stats(double* v, int n, double* med, double* mn, double* p90) {
  *med = median(v, n);
  *mn = v[0];
  int i90 = (9 * n + 9) / 10 - 1; /* ceil(0.9 n) - 1, in integers */
  *p90 = v[i90 < 0 ? 0 : i90];
}

/* The copy bandwidth B of this device, in this run: a device-to-device cudaMemcpyAsync
   of 1 GiB (256 MiB when less than 4 GiB is free), median of BENCH_GPU_COPY_REPS after 3
   untimed copies; B = 2 * bytes / time (every byte is read once and written once). */
static int gpu_copy_bandwidth(bench_gpu_t* g, char* err, size_t cap) {
  void *src = NULL, *dst = NULL;
  cudaEvent_t e0 = NULL, e1 = NULL;
  double us[BENCH_GPU_COPY_REPS];
  size_t free_b = 0, total_b = 0;
  GPU_TRY(cudaMemGetInfo(&free_b, &total_b), "cudaMemGetInfo");
  g->copy_bytes = free_b >= ((size_t)4 << 30) ? (size_t)1 << 30 : (size_t)256 << 20;
  GPU_TRY(cudaMalloc(&src, g->copy_bytes), "cudaMalloc (copy source)");
  GPU_TRY(cudaMalloc(&dst, g->copy_bytes), "cudaMalloc (copy destination)");
  GPU_TRY(cudaMemsetAsync(src, 0x3c, g->copy_bytes, g->stream), "cudaMemsetAsync");
  GPU_TRY(cudaMemsetAsync(dst, 0, g->copy_bytes, g->stream), "cudaMemsetAsync");
  GPU_TRY(cudaEventCreate(&e0), "cudaEventCreate");
  GPU_TRY(cudaEventCreate(&e1), "cudaEventCreate");
  for (int it = -3; it < BENCH_GPU_COPY_REPS; it++) {
    float ms = 0.0f;
    GPU_TRY(cudaEventRecord(e0, g->stream), "cudaEventRecord");
    GPU_TRY(cudaMemcpyAsync(dst, src, g->copy_bytes, cudaMemcpyDeviceToDevice, g->stream),
            "cudaMemcpyAsync (device to device)");
    GPU_TRY(cudaEventRecord(e1, g->stream), "cudaEventRecord");
    GPU_TRY(cudaEventSynchronize(e1), "cudaEventSynchronize");
    GPU_TRY(cudaEventElapsedTime(&ms, e0, e1), "cudaEventElapsedTime");
    if (it >= 0) us[it] = (double)ms * 1e3;
  }
  g->copy_us = median(us, BENCH_GPU_COPY_REPS);
  g->copy_gbps = 2.0 * (double)g->copy_bytes / (g->copy_us * 1e3);
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  cudaFree(src);
  cudaFree(dst);
  return 0;
fail:
  if (e0) cudaEventDestroy(e0);
  if (e1) cudaEventDestroy(e1);
  cudaFree(src);
  cudaFree(dst);
  return -1;
}

static void gpu_teardown(bench_gpu_t* g) {
  for (int i = 0; g->ev && i < g->nev; i++)
    if (g->ev[i]) cudaEventDestroy(g->ev[i]);
  free(g->ev);
  if (g->flush) cudaFree(g->flush);
  if (g->stream) cudaStreamDestroy(g->stream);
  memset(g, 0, sizeof *g);
}

/* Device 0: its description, a stream, the events, the L2 flush buffer, B. */
static int gpu_setup(bench_gpu_t* g, int iters, char* err, size_t cap) {
  struct cudaDeviceProp prop;
  memset(g, 0, sizeof *g);
  g->device = 0;
  GPU_TRY(cudaSetDevice(g->device), "cudaSetDevice");
  GPU_TRY(cudaGetDeviceProperties(&prop, g->device), "cudaGetDeviceProperties");
  snprintf(g->name, sizeof g->name, "%s", prop.name);
  g->mem_total = prop.totalGlobalMem;
  GPU_TRY(cudaDeviceGetAttribute(&g->sms, cudaDevAttrMultiProcessorCount, g->device),
          "cudaDeviceGetAttribute");
  GPU_TRY(cudaDeviceGetAttribute(&g->cc_major, cudaDevAttrComputeCapabilityMajor, g->device),
          "cudaDeviceGetAttribute");
  GPU_TRY(cudaDeviceGetAttribute(&g->cc_minor, cudaDevAttrComputeCapabilityMinor, g->device),
          "cudaDeviceGetAttribute");
  GPU_TRY(cudaDeviceGetAttribute(&g->l2_bytes, cudaDevAttrL2CacheSize, g->device),
          "cudaDeviceGetAttribute");
  if (cudaDeviceGetPCIBusId(g->pci, (int)sizeof g->pci, g->device) != cudaSuccess) {
    (void)cudaGetLastError();
    snprintf(g->pci, sizeof g->pci, "?");
  }
  GPU_TRY(cudaDriverGetVersion(&g->driver), "cudaDriverGetVersion");
  GPU_TRY(cudaRuntimeGetVersion(&g->runtime), "cudaRuntimeGetVersion");
  GPU_TRY(cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  g->nev = 2 * iters;
  g->ev = calloc((size_t)g->nev, sizeof *g->ev);
  if (!g->ev) {
    snprintf(err, cap, "out of host memory");
    goto fail;
  }
  for (int i = 0; i < g->nev; i++) GPU_TRY(cudaEventCreate(&g->ev[i]), "cudaEventCreate");
  /* >= 2x the L2, whole MiB; 64 MiB when the device does not say */
  g->flush_bytes = g->l2_bytes > 0
                       ? (((size_t)2 * (size_t)g->l2_bytes + (1u << 20) - 1) >> 20) << 20
                       : (size_t)64 << 20;
  GPU_TRY(cudaMalloc(&g->flush, g->flush_bytes), "cudaMalloc (L2 flush buffer)");
  if (gpu_copy_bandwidth(g, err, cap) != 0) goto fail;
  return 0;
fail:
  gpu_teardown(g);
  return -1;
}

/* After a failed row: clears a non-sticky error; a context that no longer synchronizes
   (sticky error: illegal address, trap) makes the later rows fail at once. */
static void gpu_recover(bench_gpu_t* g) {
  (void)cudaGetLastError();
  cudaError_t e = cudaDeviceSynchronize();
  if (e != cudaSuccess && !g->dead[0])
    snprintf(g->dead, sizeof g->dead, "the CUDA context failed earlier: %s (%s)",
             cudaGetErrorName(e), cudaGetErrorString(e));
}

/* Device twin of a team's host buffers (bench_team_bufs_t holding device pointers): each
   tensor and per-channel array its own allocation (aligned as a framework's would be);
   no tensor when n == 0 (the pointers stay NULL, which the API allows). */
static void gpu_bufs_free(bench_team_bufs_t* b) {
  void** per_rank[] = {b->x, b->y, b->dy, b->dx};
  for (size_t k = 0; k < sizeof per_rank / sizeof *per_rank; k++) {
    for (int r = 0; per_rank[k] && r < b->W; r++)
      if (per_rank[k][r]) cudaFree(per_rank[k][r]);
    free(per_rank[k]);
  }
  float** chans[] = {b->rm, b->rv, b->save_mean, b->save_invstd, b->dweight, b->dbias};
  for (size_t k = 0; k < sizeof chans / sizeof *chans; k++) {
    for (int r = 0; chans[k] && r < b->W; r++)
      if (chans[k][r]) cudaFree(chans[k][r]);
    free(chans[k]);
  }
  if (b->weight) cudaFree(b->weight);
  if (b->bias) cudaFree(b->bias);
  if (b->nbt) cudaFree(b->nbt);
  memset(b, 0, sizeof *b);
}

static int gpu_bufs_alloc(bench_team_bufs_t* b, int W, const sbnTensorDesc_t* d, char* err,
                          size_t cap) {
  memset(b, 0, sizeof *b);
  b->W = W;
  b->desc = *d;
  const size_t bytes = (size_t)(d->n * d->c * d->spatial) * dtype_size(d->dtype);
  const size_t cbytes = (size_t)d->c * sizeof(float);
  void*** tensors[] = {&b->x, &b->y, &b->dy, &b->dx};
  float*** chans[] = {&b->rm, &b->rv, &b->save_mean, &b->save_invstd, &b->dweight, &b->dbias};
  for (size_t k = 0; k < 4; k++)
    if (!(*tensors[k] = calloc((size_t)W, sizeof(void*)))) goto oom;
  for (size_t k = 0; k < 6; k++)
    if (!(*chans[k] = calloc((size_t)W, sizeof(float*)))) goto oom;
  char what[96];
  snprintf(what, sizeof what, "cudaMalloc (%d ranks x 4 tensors of %.3g MB)", W,
           (double)bytes * 1e-6);
  for (size_t k = 0; bytes && k < 4; k++)
    for (int r = 0; r < W; r++) GPU_TRY(cudaMalloc(&(*tensors[k])[r], bytes), what);
  for (size_t k = 0; k < 6; k++)
    for (int r = 0; r < W; r++)
      GPU_TRY(cudaMalloc((void**)&(*chans[k])[r], cbytes), "cudaMalloc (per-channel)");
  GPU_TRY(cudaMalloc((void**)&b->weight, cbytes), "cudaMalloc (weight)");
  GPU_TRY(cudaMalloc((void**)&b->bias, cbytes), "cudaMalloc (bias)");
  GPU_TRY(cudaMalloc((void**)&b->nbt, (size_t)W * sizeof(int64_t)), "cudaMalloc (nbt)");
  return 0;
oom:
  snprintf(err, cap, "out of host memory");
fail:
  gpu_bufs_free(b);
  return -1;
}

/* Host -> device for ranks 0..dev->W-1: x, dy, weight, bias, running stats and
   num_batches_tracked as they are in host. On `s`, the stream of the ops (a plain
   cudaMemcpy runs on the legacy stream, which does not order the non-blocking `s`), then
   synchronized. */
static int gpu_upload(bench_team_bufs_t* dev, const bench_team_bufs_t* host, cudaStream_t s,
                      char* err, size_t cap) {
  const sbnTensorDesc_t* d = &dev->desc;
  const size_t bytes = (size_t)(d->n * d->c * d->spatial) * dtype_size(d->dtype);
  const size_t cbytes = (size_t)d->c * sizeof(float);
  const enum cudaMemcpyKind h2d = cudaMemcpyHostToDevice;
  for (int r = 0; r < dev->W; r++) {
    if (bytes) {
      GPU_TRY(cudaMemcpyAsync(dev->x[r], host->x[r], bytes, h2d, s), "cudaMemcpyAsync (x)");
      GPU_TRY(cudaMemcpyAsync(dev->dy[r], host->dy[r], bytes, h2d, s), "cudaMemcpyAsync (dy)");
    }
    GPU_TRY(cudaMemcpyAsync(dev->rm[r], host->rm[r], cbytes, h2d, s),
            "cudaMemcpyAsync (running_mean)");
    GPU_TRY(cudaMemcpyAsync(dev->rv[r], host->rv[r], cbytes, h2d, s),
            "cudaMemcpyAsync (running_var)");
  }
  GPU_TRY(cudaMemcpyAsync(dev->weight, host->weight, cbytes, h2d, s), "cudaMemcpyAsync (weight)");
  GPU_TRY(cudaMemcpyAsync(dev->bias, host->bias, cbytes, h2d, s), "cudaMemcpyAsync (bias)");
  GPU_TRY(cudaMemcpyAsync(dev->nbt, host->nbt, (size_t)dev->W * sizeof(int64_t), h2d, s),
          "cudaMemcpyAsync (num_batches_tracked)");
  GPU_TRY(cudaStreamSynchronize(s), "cudaStreamSynchronize (copies)");
  return 0;
fail:
  return -1;
}

/* Every output the ops write := all-ones bits (NaN in fp32, fp16 and bf16): a value the
   check run does not write cannot pass. */
static int gpu_poison(bench_team_bufs_t* dev, cudaStream_t s, char* err, size_t cap) {
  const sbnTensorDesc_t* d = &dev->desc;
  const size_t bytes = (size_t)(d->n * d->c * d->spatial) * dtype_size(d->dtype);
  const size_t cbytes = (size_t)d->c * sizeof(float);
  for (int r = 0; r < dev->W; r++) {
    if (bytes) {
      GPU_TRY(cudaMemsetAsync(dev->y[r], 0xff, bytes, s), "cudaMemsetAsync (y)");
      GPU_TRY(cudaMemsetAsync(dev->dx[r], 0xff, bytes, s), "cudaMemsetAsync (dx)");
    }
    float* chans[] = {dev->save_mean[r], dev->save_invstd[r], dev->dweight[r], dev->dbias[r]};
    for (size_t k = 0; k < 4; k++)
      GPU_TRY(cudaMemsetAsync(chans[k], 0xff, cbytes, s), "cudaMemsetAsync (per-channel)");
  }
  return 0;
fail:
  return -1;
}

/* Device -> host for ranks 0..dev->W-1: every output (y, dx, running stats,
   num_batches_tracked, saved statistics, dweight, dbias). On `s`, after the ops queued
   there; synchronized. */
static int gpu_download(bench_team_bufs_t* host, const bench_team_bufs_t* dev, cudaStream_t s,
                        char* err, size_t cap) {
  const sbnTensorDesc_t* d = &dev->desc;
  const size_t bytes = (size_t)(d->n * d->c * d->spatial) * dtype_size(d->dtype);
  const size_t cbytes = (size_t)d->c * sizeof(float);
  const enum cudaMemcpyKind d2h = cudaMemcpyDeviceToHost;
  for (int r = 0; r < dev->W; r++) {
    if (bytes) {
      GPU_TRY(cudaMemcpyAsync(host->y[r], dev->y[r], bytes, d2h, s), "cudaMemcpyAsync (y)");
      GPU_TRY(cudaMemcpyAsync(host->dx[r], dev->dx[r], bytes, d2h, s), "cudaMemcpyAsync (dx)");
    }
    float* const* from[] = {dev->rm,          dev->rv,      dev->save_mean,
                            dev->save_invstd, dev->dweight, dev->dbias};
    float* const* to[] = {host->rm,          host->rv,      host->save_mean,
                          host->save_invstd, host->dweight, host->dbias};
    for (size_t k = 0; k < 6; k++)
      GPU_TRY(cudaMemcpyAsync(to[k][r], from[k][r], cbytes, d2h, s),
              "cudaMemcpyAsync (per-channel)");
  }
  GPU_TRY(cudaMemcpyAsync(host->nbt, dev->nbt, (size_t)dev->W * sizeof(int64_t), d2h, s),
          "cudaMemcpyAsync (num_batches_tracked)");
  GPU_TRY(cudaStreamSynchronize(s), "cudaStreamSynchronize (copies)");
  return 0;
fail:
  return -1;
}

/* sbnCommGetAsyncError of every rank, after the stream was synchronized. */
static int gpu_async_check(sbnComm_t* comms, int W, char* err, size_t cap) {
  for (int r = 0; r < W; r++) {
    sbnResult_t async = sbnSuccess;
    sbnResult_t res = sbnCommGetAsyncError(comms[r], &async);
    if (res != sbnSuccess) {
      note_failure(err, cap, "sbnCommGetAsyncError", r, res, sbnGetLastError(comms[r]));
      return -1;
    }
    if (async != sbnSuccess) {
      note_failure(err, cap, "async error (sbnCommGetAsyncError)", r, async,
                   sbnGetLastError(comms[r]));
      return -1;
    }
  }
  return 0;
}

/* ---- timing: one op of any path ----------------------------------------------------- */
/* Queues one forward (fwd != 0) or backward of a row's path on the bench stream; returns the
   wall time of the enqueueing calls in us, or -1 with err set. */
typedef double (*bench_op_fn)(void* ctx, int fwd, char* err, size_t cap);

/* warmup + iters calls of one op, each preceded by the L2 flush; CUDA events around the op
   of the timed ones only; then the stream is synchronized. ev_us, host_us: [iters]. */
static int gpu_time_op(bench_gpu_t* g, bench_op_fn op, void* ctx, int fwd, const bench_opts_t* o,
                       double* ev_us, double* host_us, char* err, size_t cap) {
  for (int it = 0; it < o->warmup + o->iters; it++) {
    const int j = it - o->warmup;
    GPU_TRY(cudaMemsetAsync(g->flush, it & 0xff, g->flush_bytes, g->stream),
            "cudaMemsetAsync (L2 flush)");
    if (j >= 0) GPU_TRY(cudaEventRecord(g->ev[2 * j], g->stream), "cudaEventRecord");
    double t = op(ctx, fwd, err, cap);
    if (t < 0) return -1;
    if (j >= 0) {
      host_us[j] = t;
      GPU_TRY(cudaEventRecord(g->ev[2 * j + 1], g->stream), "cudaEventRecord");
    }
  }
  GPU_TRY(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize");
  for (int j = 0; j < o->iters; j++) {
    float ms = 0.0f;
    GPU_TRY(cudaEventElapsedTime(&ms, g->ev[2 * j], g->ev[2 * j + 1]), "cudaEventElapsedTime");
    ev_us[j] = (double)ms * 1e3;
  }
  return 0;
fail:
  return -1;
}

/* The row's timings of one op from the samples (sorts them); GB/s per rank. */
static void row_set_times(bench_row_t* row, int fwd, double* ev_us, double* host_us, int iters) {
  bench_times_t* t = fwd ? &row->t_fwd : &row->t_bwd;
  times_stats(ev_us, iters, &t->med, &t->min, &t->p90);
  t->host_med = median(host_us, iters);
  const double rank_bytes =
      (double)(row->shape->n * row->shape->c * row->spatial) * (double)dtype_size(row->dtype);
  /* per rank: read x, write y / read x and dy, write dx */
  const double gbps = (fwd ? 2.0 : 3.0) * rank_bytes / (t->med * 1e3);
  if (fwd) {
    row->us_fwd = t->med;
    row->gbps_fwd = gbps;
  } else {
    row->us_bwd = t->med;
    row->gbps_bwd = gbps;
  }
}

/* ---- the library's paths (coop, nccl) on virtual teams ------------------------------- */
static const char* const kNoteNcclVirtual =
    "nccl-path on a virtual team: stats kernel, publish kernel, gather kernel in place of "
    "ncclAllGather, apply kernel (NCCL refuses two ranks on one GPU)";
static const char* const kNoteNcclVirtual1 =
    "nccl-path at W = 1 on an sbnCommInitAll team of one GPU: stats kernel, publish kernel, "
    "ncclAllGather over the team's 1-rank NCCL comm (as PyTorch with one rank), apply kernel";

/* SBN_ALGO for the library's calls of a row (the library reads it at every call). */
static int set_algo(int path, char* err, size_t cap) {
  if (setenv("SBN_ALGO", path == BENCH_PATH_NCCL ? "nccl" : "coop", 1) != 0) {
    snprintf(err, cap, "setenv(SBN_ALGO): %s", strerror(errno));
    return -1;
  }
  return 0;
}

typedef struct {
  sbnComm_t* comms;
  bench_team_bufs_t* dev;
  const sbnParams_t* params;
  cudaStream_t stream;
} bench_team_ctx_t;

static double team_op(void* ctx, int fwd, char* err, size_t cap) {
  bench_team_ctx_t* t = ctx;
  return team_call(t->comms, t->dev, fwd, t->params, t->stream, err, cap);
}

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
  DIG_COUNT
};
static const char* const kDigestNames[DIG_COUNT] = {
    "y",           "dx",      "save_mean", "save_invstd",        "running_mean",
    "running_var", "dweight", "dbias",     "num_batches_tracked"};

typedef struct {
  int valid, W;
  uint64_t d[SBN_MAX_GPU_TEAM_RANKS][DIG_COUNT];
} bench_digest_t;

/* Four independent splitmix64 chains over 8-byte words (one chain would be latency-bound). */
static uint64_t digest_bytes(const void* p, size_t bytes) {
  const unsigned char* b = p;
  uint64_t h[4] = {1, 2, 3, 4};
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    for (int k = 0; k < 4; k++) {
      uint64_t w;
      memcpy(&w, b + i + 8 * (size_t)k, 8);
      h[k] = splitmix64(h[k] ^ w);
    }
  for (; i + 8 <= bytes; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h[0] = splitmix64(h[0] ^ w);
  }
  uint64_t tail = 0;
  for (; i < bytes; i++) tail = tail << 8 | b[i];
  return splitmix64(
      h[0] ^ splitmix64(h[1] ^ splitmix64(h[2] ^ splitmix64(h[3] ^ tail ^ (uint64_t)bytes))));
}

static void digest_team(bench_digest_t* dg, const bench_team_bufs_t* b) {
  const sbnTensorDesc_t* d = &b->desc;
  const size_t bytes = (size_t)(d->n * d->c * d->spatial) * dtype_size(d->dtype);
  const size_t cbytes = (size_t)d->c * sizeof(float);
  for (int r = 0; r < b->W; r++) {
    dg->d[r][DIG_Y] = digest_bytes(b->y[r], bytes);
    dg->d[r][DIG_DX] = digest_bytes(b->dx[r], bytes);
    dg->d[r][DIG_SAVE_MEAN] = digest_bytes(b->save_mean[r], cbytes);
    dg->d[r][DIG_SAVE_INVSTD] = digest_bytes(b->save_invstd[r], cbytes);
    dg->d[r][DIG_RM] = digest_bytes(b->rm[r], cbytes);
    dg->d[r][DIG_RV] = digest_bytes(b->rv[r], cbytes);
    dg->d[r][DIG_DWEIGHT] = digest_bytes(b->dweight[r], cbytes);
    dg->d[r][DIG_DBIAS] = digest_bytes(b->dbias[r], cbytes);
    dg->d[r][DIG_NBT] = digest_bytes(&b->nbt[r], sizeof b->nbt[r]);
  }
  dg->W = b->W;
  dg->valid = 1;
}

/* Every output of this row's check run (b) against the digests of the coop row's: the
   library promises the nccl path the same bits. Whole buffers: each adds its element count
   to `checked`, and one `wrong` when its bits differ. */
static void digest_compare(bench_row_t* row, const bench_digest_t* ref,
                           const bench_team_bufs_t* b) {
  bench_digest_t got;
  digest_team(&got, b);
  const int64_t numel = b->desc.n * b->desc.c * b->desc.spatial;
  char label[96];
  for (int r = 0; r < b->W; r++)
    for (int k = 0; k < DIG_COUNT; k++) {
      row->checked += k <= DIG_DX ? numel : k == DIG_NBT ? 1 : b->desc.c;
      if (got.d[r][k] != ref->d[r][k] && row->wrong++ < BENCH_MAX_WRONG_PRINTED)
        fprintf(stderr,
                "# WRONG %s: %s of rank %d differs bitwise from the coop row's (same inputs; "
                "the two paths must give the same bits)\n",
                row_label(row, label, sizeof label), kDigestNames[k], r);
    }
}

/* Appends "; text" (or text) to a row's note, cut at its size. */
static void note_append(bench_row_t* row, const char* text) {
  size_t len = strlen(row->note);
  if (len + 3 >= sizeof row->note) return;
  snprintf(row->note + len, sizeof row->note - len, "%s%s", len ? "; " : "", text);
}

/* One row of a library path (coop or nccl) on the device buffers `dev` of row->W ranks: a
   virtual team of its own, SBN_ALGO set for its calls, the timed forward and backward, then
   the check run (host: the inputs of ranks 0..W-1; the outputs are copied back there).
   dig_out: where to leave this row's digests (the coop row); dig_ref: the digests to compare
   with bitwise (the nccl row). */
static void gpu_run_path(bench_row_t* row, bench_gpu_t* g, const bench_opts_t* o,
                         bench_team_bufs_t* host, bench_team_bufs_t* dev, double* samples,
                         int64_t max_c, bench_digest_t* dig_out, const bench_digest_t* dig_ref) {
  char* err = row->error;
  const size_t cap = sizeof row->error;
  const int W = row->W;
  sbnComm_t comms[SBN_MAX_GPU_TEAM_RANKS];
  int ncomms = 0;
  memset(comms, 0, sizeof comms);
  if (row->path == BENCH_PATH_NCCL)
    snprintf(row->note, sizeof row->note, "%s", W > 1 ? kNoteNcclVirtual : kNoteNcclVirtual1);
  if (g->dead[0]) {
    snprintf(err, cap, "not run: %s", g->dead);
    return;
  }
  if (set_algo(row->path, err, cap) != 0) return;
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  if (max_c > cfg.max_channels) cfg.max_channels = max_c;
  cfg.timeout_ms = BENCH_GPU_TIMEOUT_MS;
  /* the nccl path at W = 1: a team of one GPU made by sbnCommInitAll has an NCCL comm,
     so the row includes a real (1-rank) ncclAllGather, as PyTorch's SyncBatchNorm does */
  const int initall = row->path == BENCH_PATH_NCCL && W == 1;
  sbnResult_t res = initall ? sbnCommInitAll(comms, 1, &g->device, &cfg)
                            : sbnCommInitVirtual(comms, W, g->device, &cfg);
  if (res != sbnSuccess) {
    note_failure(err, cap, initall ? "sbnCommInitAll" : "sbnCommInitVirtual", -1, res,
                 sbnGetLastError(NULL));
    goto out;
  }
  ncomms = W;
  bufs_reset_state(host);
  if (gpu_upload(dev, host, g->stream, err, cap) != 0) goto out;

  sbnParams_t params = SBN_PARAMS_DEFAULT;
  params.grad_mode = sbnGradGlobal;
  bench_team_ctx_t ctx = {comms, dev, &params, g->stream};
  for (int fwd = 1; fwd >= 0; fwd--) {
    double *ev_us = samples, *host_us = samples + o->iters;
    if (gpu_time_op(g, team_op, &ctx, fwd, o, ev_us, host_us, err, cap) != 0 ||
        gpu_async_check(comms, W, err, cap) != 0)
      goto out;
    row_set_times(row, fwd, ev_us, host_us, o->iters);
    note_kernel(row, comms[0], fwd);
  }

  /* The check run: fresh inputs, running stats (0, 1), poisoned outputs; one forward and
     one backward; everything copied back and checked on the host. */
  bufs_reset_state(host);
  if (gpu_upload(dev, host, g->stream, err, cap) != 0 || gpu_poison(dev, g->stream, err, cap) != 0)
    goto out;
  if (team_call(comms, dev, 1, &params, g->stream, err, cap) < 0 ||
      team_call(comms, dev, 0, &params, g->stream, err, cap) < 0)
    goto out;
  GPU_TRY(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize (check run)");
  if (gpu_async_check(comms, W, err, cap) != 0) goto out;
  if (gpu_download(host, dev, g->stream, err, cap) != 0) goto out;
  check_row(row, host, 1, o->check_channels, NULL, sbnGradGlobal, &kCheckLibrary);
  if (dig_out) digest_team(dig_out, host);
  if (dig_ref) {
    if (dig_ref->valid && dig_ref->W == W)
      digest_compare(row, dig_ref, host);
    else
      note_append(row, "not compared bitwise with coop (the coop row has no result)");
  }
  goto out;
fail:
out:
  if (err[0]) gpu_recover(g);
  for (int r = 0; r < ncomms; r++) sbnCommDestroy(comms[r]);
}

/* The library rows of one W: rows[BENCH_PATH_COOP] and rows[BENCH_PATH_NCCL] (NULL when
   that path is off), run one after the other on the same device buffers, with the inputs of
   ranks 0..W-1 of host_all (generated for the largest W: rank r's data do not depend on W). */
static void gpu_run_team(bench_row_t* const rows[2], bench_gpu_t* g, const bench_opts_t* o,
                         const bench_team_bufs_t* host_all, int64_t max_c) {
  const bench_row_t* r0 = rows[0] ? rows[0] : rows[1];
  if (!r0) return;
  const int W = r0->W;
  const sbnTensorDesc_t d = {r0->dtype, r0->layout, r0->shape->n, r0->shape->c, r0->spatial};
  bench_team_bufs_t host = *host_all; /* a view of the first W ranks */
  host.W = W;
  bench_team_bufs_t dev;
  memset(&dev, 0, sizeof dev);
  bench_digest_t dig;
  memset(&dig, 0, sizeof dig);
  char err[384] = "";
  double* samples = malloc((size_t)o->iters * 2 * sizeof(double));
  if (g->dead[0])
    snprintf(err, sizeof err, "not run: %s", g->dead);
  else if (!samples)
    snprintf(err, sizeof err, "out of host memory");
  else if (gpu_bufs_alloc(&dev, W, &d, err, sizeof err) != 0)
    gpu_recover(g);
  for (int p = 0; p < 2; p++) {
    if (!rows[p]) continue;
    if (err[0])
      snprintf(rows[p]->error, sizeof rows[p]->error, "%s", err);
    else
      gpu_run_path(rows[p], g, o, &host, &dev, samples, max_c,
                   p == BENCH_PATH_COOP && rows[BENCH_PATH_NCCL] ? &dig : NULL,
                   p == BENCH_PATH_NCCL && rows[BENCH_PATH_COOP] ? &dig : NULL);
  }
  gpu_bufs_free(&dev);
  free(samples);
}

/* ---- runtime libraries: NCCL and cuDNN, loaded with dlopen -------------------------- */
/* dlopen of the names in order ("" skipped): the first that loads. NULL with why = every
   dlerror() text, "; "-separated. */
static void* bench_dlopen(const char* const names[2], char* from, size_t fcap, char* why,
                          size_t wcap) {
  why[0] = '\0';
  for (int i = 0; i < 2; i++) {
    if (!names[i][0] || (i == 1 && strcmp(names[1], names[0]) == 0)) continue;
    void* h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (h) {
      snprintf(from, fcap, "%s", names[i]);
      why[0] = '\0';
      return h;
    }
    const char* e = dlerror();
    size_t len = strlen(why);
    if (len + 3 < wcap)
      snprintf(why + len, wcap - len, "%s%s", len ? "; " : "", e ? e : "dlopen failed");
  }
  return NULL;
}

/* dlsym into a function pointer `fn` of fn_size bytes (POSIX: the object pointer dlsym
   returns converts to the function's pointer). 0, or -1 with why set. */
static int bench_dlsym(void* lib, const char* name, void* fn, size_t fn_size, char* why,
                       size_t wcap) {
  (void)dlerror();
  void* p = dlsym(lib, name);
  if (!p || fn_size != sizeof p) {
    const char* e = dlerror();
    snprintf(why, wcap, "dlsym(%s): %s", name, e ? e : "not found");
    return -1;
  }
  memcpy(fn, &p, sizeof p);
  return 0;
}

/* NCCL: only its version, for the header and the JSON (virtual teams make no NCCL call). */
typedef struct {
  void* lib;
  char from[320];
  char why[400];
  int version; /* ncclGetVersion; -1 unknown */
} bench_nccl_t;

static void nccl_load(bench_nccl_t* n) {
  memset(n, 0, sizeof *n);
  n->version = -1;
  /* the soname first: libsyncbn may have loaded its NCCL already, and that is the one */
  static const char* const names[2] = {"libnccl.so.2", SBN_BENCH_NCCL_LIBRARY};
  n->lib = bench_dlopen(names, n->from, sizeof n->from, n->why, sizeof n->why);
  if (!n->lib) return;
  /* ncclResult_t ncclGetVersion(int*): ncclResult_t is an enum, returned as an int */
  int (*get_version)(int*) = NULL;
  if (bench_dlsym(n->lib, "ncclGetVersion", &get_version, sizeof get_version, n->why,
                  sizeof n->why) != 0)
    return;
  int v = 0;
  int rc = get_version(&v);
  if (rc == 0)
    n->version = v;
  else
    snprintf(n->why, sizeof n->why, "ncclGetVersion returned %d", rc);
}

/* "2.28.9" from NCCL_VERSION_CODE (>= 2.9: major*10000 + minor*100 + patch; before:
   major*1000 + minor*100 + patch); cuDNN uses the same two encodings (9.x: *10000). */
static void format_version(long long v, int new_encoding, char* buf, size_t cap) {
  if (v < 0)
    snprintf(buf, cap, "unknown");
  else if (new_encoding)
    snprintf(buf, cap, "%lld.%lld.%lld", v / 10000, v / 100 % 100, v % 100);
  else
    snprintf(buf, cap, "%lld.%lld.%lld", v / 1000, v / 100 % 10, v % 100);
}
static void format_nccl_version(int v, char* buf, size_t cap) {
  format_version(v, v >= 20900, buf, cap);
}
static void format_cudnn_version(long long v, char* buf, size_t cap) {
  format_version(v, v >= 90000, buf, cap);
}

/* cuDNN: every function through a pointer from dlsym; the types come from cudnn.h when the
   build found it (SBN_BENCH_HAVE_CUDNN_H), else only the version is read. */
typedef struct {
  void* lib;
  char from[320];
  char why[400];     /* non-empty: the cuDNN rows do not run, and this says why */
  long long version; /* cudnnGetVersion(); -1 unknown */
#if SBN_BENCH_HAVE_CUDNN_H
  int handle_tried;
  cudnnHandle_t handle; /* created at the first cuDNN row, on the bench stream */
  const char* (*GetErrorString)(cudnnStatus_t);
  void (*GetLastErrorString)(char*, size_t); /* NULL before cuDNN 9 */
  cudnnStatus_t (*Create)(cudnnHandle_t*);
  cudnnStatus_t (*Destroy)(cudnnHandle_t);
  cudnnStatus_t (*SetStream)(cudnnHandle_t, cudaStream_t);
  cudnnStatus_t (*CreateTensorDescriptor)(cudnnTensorDescriptor_t*);
  cudnnStatus_t (*DestroyTensorDescriptor)(cudnnTensorDescriptor_t);
  cudnnStatus_t (*SetTensor4dDescriptor)(cudnnTensorDescriptor_t, cudnnTensorFormat_t,
                                         cudnnDataType_t, int, int, int, int);
  cudnnStatus_t (*DeriveBNTensorDescriptor)(cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                            cudnnBatchNormMode_t);
  cudnnStatus_t (*GetFwdWorkspaceSize)(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t,
                                       const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                       const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                       const cudnnActivationDescriptor_t, size_t*);
  cudnnStatus_t (*GetBwdWorkspaceSize)(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t,
                                       const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                       const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                       const cudnnTensorDescriptor_t, const cudnnTensorDescriptor_t,
                                       const cudnnActivationDescriptor_t, size_t*);
  cudnnStatus_t (*GetReserveSize)(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t,
                                  const cudnnActivationDescriptor_t, const cudnnTensorDescriptor_t,
                                  size_t*);
  cudnnStatus_t (*ForwardTrainingEx)(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t,
                                     const void*, const void*, const cudnnTensorDescriptor_t,
                                     const void*, const cudnnTensorDescriptor_t, const void*,
                                     const cudnnTensorDescriptor_t, void*,
                                     const cudnnTensorDescriptor_t, const void*, const void*,
                                     double, void*, void*, double, void*, void*,
                                     cudnnActivationDescriptor_t, void*, size_t, void*, size_t);
  cudnnStatus_t (*BackwardEx)(cudnnHandle_t, cudnnBatchNormMode_t, cudnnBatchNormOps_t, const void*,
                              const void*, const void*, const void*, const cudnnTensorDescriptor_t,
                              const void*, const cudnnTensorDescriptor_t, const void*,
                              const cudnnTensorDescriptor_t, const void*,
                              const cudnnTensorDescriptor_t, void*, const cudnnTensorDescriptor_t,
                              void*, const cudnnTensorDescriptor_t, const void*, const void*, void*,
                              void*, double, const void*, const void*, cudnnActivationDescriptor_t,
                              void*, size_t, void*, size_t);
#endif
} bench_cudnn_t;

#if SBN_BENCH_HAVE_CUDNN_H && defined(__GNUC__)
/* Each pointer has exactly the type of the function cudnn.h declares. */
#define BENCH_CUDNN_SAME_TYPE(field, fn)                                                     \
  _Static_assert(                                                                            \
      __builtin_types_compatible_p(__typeof__(((bench_cudnn_t*)0)->field), __typeof__(&fn)), \
      #fn ": the pointer type differs from cudnn.h")
BENCH_CUDNN_SAME_TYPE(GetErrorString, cudnnGetErrorString);
BENCH_CUDNN_SAME_TYPE(GetLastErrorString, cudnnGetLastErrorString);
BENCH_CUDNN_SAME_TYPE(Create, cudnnCreate);
BENCH_CUDNN_SAME_TYPE(Destroy, cudnnDestroy);
BENCH_CUDNN_SAME_TYPE(SetStream, cudnnSetStream);
BENCH_CUDNN_SAME_TYPE(CreateTensorDescriptor, cudnnCreateTensorDescriptor);
BENCH_CUDNN_SAME_TYPE(DestroyTensorDescriptor, cudnnDestroyTensorDescriptor);
BENCH_CUDNN_SAME_TYPE(SetTensor4dDescriptor, cudnnSetTensor4dDescriptor);
BENCH_CUDNN_SAME_TYPE(DeriveBNTensorDescriptor, cudnnDeriveBNTensorDescriptor);
BENCH_CUDNN_SAME_TYPE(GetFwdWorkspaceSize,
                      cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize);
BENCH_CUDNN_SAME_TYPE(GetBwdWorkspaceSize, cudnnGetBatchNormalizationBackwardExWorkspaceSize);
BENCH_CUDNN_SAME_TYPE(GetReserveSize, cudnnGetBatchNormalizationTrainingExReserveSpaceSize);
BENCH_CUDNN_SAME_TYPE(ForwardTrainingEx, cudnnBatchNormalizationForwardTrainingEx);
BENCH_CUDNN_SAME_TYPE(BackwardEx, cudnnBatchNormalizationBackwardEx);
#undef BENCH_CUDNN_SAME_TYPE
#endif

static void cudnn_load(bench_cudnn_t* c) {
  memset(c, 0, sizeof *c);
  c->version = -1;
  /* the library next to the cudnn.h the bench was compiled with (e.g. the wheel's that
     PyTorch uses) first, then whatever the loader finds as libcudnn.so.9 */
  static const char* const names[2] = {SBN_BENCH_CUDNN_LIBRARY, "libcudnn.so.9"};
  c->lib = bench_dlopen(names, c->from, sizeof c->from, c->why, sizeof c->why);
  if (!c->lib) return;
  size_t (*get_version)(void) = NULL;
  char why[400] = "";
  if (bench_dlsym(c->lib, "cudnnGetVersion", &get_version, sizeof get_version, why, sizeof why) ==
      0)
    c->version = (long long)get_version();
#if SBN_BENCH_HAVE_CUDNN_H
  struct {
    const char* name;
    void* fn;
    size_t size;
    int optional;
  } syms[] = {
#define BENCH_SYM(field, name, optional) {name, &c->field, sizeof c->field, optional}
      BENCH_SYM(GetErrorString, "cudnnGetErrorString", 0),
      BENCH_SYM(GetLastErrorString, "cudnnGetLastErrorString", 1),
      BENCH_SYM(Create, "cudnnCreate", 0),
      BENCH_SYM(Destroy, "cudnnDestroy", 0),
      BENCH_SYM(SetStream, "cudnnSetStream", 0),
      BENCH_SYM(CreateTensorDescriptor, "cudnnCreateTensorDescriptor", 0),
      BENCH_SYM(DestroyTensorDescriptor, "cudnnDestroyTensorDescriptor", 0),
      BENCH_SYM(SetTensor4dDescriptor, "cudnnSetTensor4dDescriptor", 0),
      BENCH_SYM(DeriveBNTensorDescriptor, "cudnnDeriveBNTensorDescriptor", 0),
      BENCH_SYM(GetFwdWorkspaceSize, "cudnnGetBatchNormalizationForwardTrainingExWorkspaceSize", 0),
      BENCH_SYM(GetBwdWorkspaceSize, "cudnnGetBatchNormalizationBackwardExWorkspaceSize", 0),
      BENCH_SYM(GetReserveSize, "cudnnGetBatchNormalizationTrainingExReserveSpaceSize", 0),
      BENCH_SYM(ForwardTrainingEx, "cudnnBatchNormalizationForwardTrainingEx", 0),
      BENCH_SYM(BackwardEx, "cudnnBatchNormalizationBackwardEx", 0),
#undef BENCH_SYM
  };
  for (size_t i = 0; i < sizeof syms / sizeof *syms; i++)
    if (bench_dlsym(c->lib, syms[i].name, syms[i].fn, syms[i].size, why, sizeof why) != 0 &&
        !syms[i].optional) {
      snprintf(c->why, sizeof c->why, "%s", why);
      return;
    }
#else
  snprintf(c->why, sizeof c->why,
           "sbn-bench was built without cudnn.h (CMake did not find it: set SYNCBN_CUDNN_ROOT "
           "to a directory with include/cudnn.h)");
#endif
}

static void cudnn_unload(bench_cudnn_t* c) {
#if SBN_BENCH_HAVE_CUDNN_H
  if (c->handle) c->Destroy(c->handle);
  c->handle = NULL;
#endif
  /* the library stays loaded until exit: its own teardown may run at exit */
  (void)c;
}

#if SBN_BENCH_HAVE_CUDNN_H
/* "CUDNN_STATUS_NOT_SUPPORTED (3000): <cuDNN's last error message>" */
static void cudnn_status_text(const bench_cudnn_t* c, cudnnStatus_t st, char* buf, size_t cap) {
  char last[200] = "";
  if (c->GetLastErrorString) c->GetLastErrorString(last, sizeof last);
  last[sizeof last - 1] = '\0';
  const char* name = c->GetErrorString(st);
  snprintf(buf, cap, "%s (%d)%s%s", name ? name : "?", (int)st, last[0] ? ": " : "", last);
}

/* 1 when cuDNN is usable: loaded, resolved, and a handle exists on the bench stream (made at
   the first call); 0 with c->why set. */
static int cudnn_ready(bench_cudnn_t* c, const bench_gpu_t* g) {
  if (c->why[0]) return 0;
  if (!c->handle_tried) {
    c->handle_tried = 1;
    char text[300];
    cudnnStatus_t st = c->Create(&c->handle);
    if (st != CUDNN_STATUS_SUCCESS) {
      c->handle = NULL;
      cudnn_status_text(c, st, text, sizeof text);
      snprintf(c->why, sizeof c->why, "cudnnCreate: %s", text);
      return 0;
    }
    st = c->SetStream(c->handle, g->stream);
    if (st != CUDNN_STATUS_SUCCESS) {
      cudnn_status_text(c, st, text, sizeof text);
      snprintf(c->why, sizeof c->why, "cudnnSetStream: %s", text);
      c->Destroy(c->handle);
      c->handle = NULL;
      return 0;
    }
  }
  return c->handle != NULL;
}

typedef struct {
  bench_cudnn_t* cu;
  cudnnBatchNormMode_t mode;
  cudnnTensorDescriptor_t xd, bnd; /* x, y, dy, dx: xd; weight, bias, statistics: bnd */
  bench_team_bufs_t* dev;          /* one rank */
  double eps, momentum;
  void* ws;
  size_t ws_bytes;
  void* reserve;
  size_t reserve_bytes;
  cudnnStatus_t status; /* of the last call */
} bench_cudnn_ctx_t;

/* One cudnnBatchNormalizationForwardTrainingEx or BackwardEx, queued on the bench stream. */
static cudnnStatus_t cudnn_call(bench_cudnn_ctx_t* k, int fwd) {
  const float one = 1.0f, zero = 0.0f;
  const bench_team_bufs_t* b = k->dev;
  const bench_cudnn_t* cu = k->cu;
  if (fwd)
    return cu->ForwardTrainingEx(
        cu->handle, k->mode, CUDNN_BATCHNORM_OPS_BN, &one, &zero, k->xd, b->x[0], NULL, NULL, k->xd,
        b->y[0], k->bnd, b->weight, b->bias, k->momentum, b->rm[0], b->rv[0], k->eps,
        b->save_mean[0], b->save_invstd[0], NULL, k->ws, k->ws_bytes, k->reserve, k->reserve_bytes);
  /* alpha/beta for dx, then for dweight/dbias: overwrite both; y is not read without an
     activation but is a valid tensor */
  return cu->BackwardEx(cu->handle, k->mode, CUDNN_BATCHNORM_OPS_BN, &one, &zero, &one, &zero,
                        k->xd, b->x[0], k->xd, b->y[0], k->xd, b->dy[0], NULL, NULL, k->xd,
                        b->dx[0], k->bnd, b->weight, b->bias, b->dweight[0], b->dbias[0], k->eps,
                        b->save_mean[0], b->save_invstd[0], NULL, k->ws, k->ws_bytes, k->reserve,
                        k->reserve_bytes);
}

static double cudnn_op(void* ctx, int fwd, char* err, size_t cap) {
  bench_cudnn_ctx_t* k = ctx;
  double t0 = now_us();
  k->status = cudnn_call(k, fwd);
  double t = now_us() - t0;
  if (k->status != CUDNN_STATUS_SUCCESS) {
    char text[300];
    cudnn_status_text(k->cu, k->status, text, sizeof text);
    snprintf(err, cap, "%s: %s",
             fwd ? "cudnnBatchNormalizationForwardTrainingEx" : "cudnnBatchNormalizationBackwardEx",
             text);
    return -1;
  }
  return t;
}

static int cudnn_not_supported(cudnnStatus_t st) {
  return CUDNN_STATUS_CATEGORY((int)st) == CUDNN_STATUS_NOT_SUPPORTED;
}

/* Workspace (forward and backward share one) and reserve space for k->mode, allocated here,
   outside the timing. Returns the first cuDNN status that is not a success, or
   CUDNN_STATUS_SUCCESS; -1 (as a status) after a CUDA allocation failure, with err set. */
static int cudnn_prepare(bench_cudnn_ctx_t* k, char* err, size_t cap) {
  const bench_cudnn_t* cu = k->cu;
  size_t ws_f = 0, ws_b = 0, res = 0;
  cudnnStatus_t st = cu->GetFwdWorkspaceSize(cu->handle, k->mode, CUDNN_BATCHNORM_OPS_BN, k->xd,
                                             NULL, k->xd, k->bnd, NULL, &ws_f);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cu->GetBwdWorkspaceSize(cu->handle, k->mode, CUDNN_BATCHNORM_OPS_BN, k->xd, k->xd, k->xd,
                                 NULL, k->xd, k->bnd, NULL, &ws_b);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cu->GetReserveSize(cu->handle, k->mode, CUDNN_BATCHNORM_OPS_BN, NULL, k->xd, &res);
  if (st != CUDNN_STATUS_SUCCESS) return (int)st;
  if (k->ws) cudaFree(k->ws);
  if (k->reserve) cudaFree(k->reserve);
  k->ws = k->reserve = NULL;
  k->ws_bytes = ws_f > ws_b ? ws_f : ws_b;
  k->reserve_bytes = res;
  if (k->ws_bytes) GPU_TRY(cudaMalloc(&k->ws, k->ws_bytes), "cudaMalloc (cuDNN workspace)");
  if (k->reserve_bytes)
    GPU_TRY(cudaMalloc(&k->reserve, k->reserve_bytes), "cudaMalloc (cuDNN reserve space)");
  return (int)CUDNN_STATUS_SUCCESS;
fail:
  return -1;
}
#endif /* SBN_BENCH_HAVE_CUDNN_H */

/* cuDNN rows (a baseline this project does not own) are checked on y, dx, save_mean,
   save_invstd, dweight and dbias, not on the running statistics (cuDNN's running-variance
   convention and update are its own business). Tolerance: 10x the library's for the
   statistics and the fp32 values (1e-4 and 1e-3): cuDNN's reduction order and variance
   algorithm are not ours (one-pass sums, atomics, or SPATIAL_PERSISTENT's scaled integer
   reduction), so our bound is not its contract; the check is there to prove the timed call
   did the right work (descriptor, layout, channel order, scale and bias), and any such
   mistake gives errors of order 1. fp16/bf16 outputs keep 1e-2 (their rounding dominates). */
#define TOL_CUDNN_STAT 1e-4
#define TOL_CUDNN_F32 1e-3
#define TOL_CUDNN_HALF 1e-2
#if SBN_BENCH_HAVE_CUDNN_H
static const bench_check_t kCheckCudnn = {TOL_CUDNN_STAT, TOL_CUDNN_F32, TOL_CUDNN_HALF, 0};
#endif

/* One cuDNN row (W = 1: one GPU, no sync) on rank 0's inputs of host_all: its own device
   buffers, descriptors, workspace; SPATIAL_PERSISTENT, or SPATIAL where cuDNN refuses it;
   the timed forward and backward, then the check run. A combination cuDNN does not support,
   or cuDNN not loadable, makes a skipped row (note says why), not a failure. */
static void gpu_run_cudnn_row(bench_row_t* row, bench_gpu_t* g, const bench_opts_t* o,
                              const bench_team_bufs_t* host_all, bench_cudnn_t* cu) {
  char* err = row->error;
  const size_t cap = sizeof row->error;
  if (g->dead[0]) {
    snprintf(err, cap, "not run: %s", g->dead);
    return;
  }
#if !SBN_BENCH_HAVE_CUDNN_H
  (void)o;
  (void)host_all;
  row->skipped = 1;
  snprintf(row->note, sizeof row->note, "cuDNN not available: %.370s", cu->why);
#else
  if (!cudnn_ready(cu, g)) {
    row->skipped = 1;
    snprintf(row->note, sizeof row->note, "cuDNN not available: %.370s", cu->why);
    return;
  }
  const sbnTensorDesc_t d = {row->dtype, row->layout, row->shape->n, row->shape->c, row->spatial};
  if (d.n * d.c * d.spatial > INT_MAX || d.c > INT_MAX || d.n > INT_MAX || d.spatial > INT_MAX) {
    row->skipped = 1;
    snprintf(row->note, sizeof row->note,
             "not run: %" PRId64 " elements do not fit a cuDNN 4-d descriptor (int strides)",
             d.n * d.c * d.spatial);
    return;
  }
  static const char* const kModeNames[2] = {"CUDNN_BATCHNORM_SPATIAL_PERSISTENT",
                                            "CUDNN_BATCHNORM_SPATIAL"};
  static const cudnnBatchNormMode_t kModes[2] = {CUDNN_BATCHNORM_SPATIAL_PERSISTENT,
                                                 CUDNN_BATCHNORM_SPATIAL};
  const cudnnDataType_t dt = d.dtype == sbnFloat32    ? CUDNN_DATA_FLOAT
                             : d.dtype == sbnBFloat16 ? CUDNN_DATA_BFLOAT16
                                                      : CUDNN_DATA_HALF;
  /* the shape's own H and W when spatial is H*W (--scale 1), else (spatial, 1): BN does not
     care how the spatial extent is split */
  int h = (int)d.spatial, w = 1;
  if (row->shape->h * row->shape->w == d.spatial) {
    h = (int)row->shape->h;
    w = (int)row->shape->w;
  }
  bench_team_bufs_t host = *host_all; /* rank 0 only */
  host.W = 1;
  bench_team_bufs_t dev;
  memset(&dev, 0, sizeof dev);
  bench_cudnn_ctx_t k;
  memset(&k, 0, sizeof k);
  k.cu = cu;
  k.dev = &dev;
  const sbnParams_t params = SBN_PARAMS_DEFAULT;
  k.eps = (double)params.eps;
  k.momentum = (double)params.momentum;
  char text[300], refused[360] = "";
  double* samples = malloc((size_t)o->iters * 2 * sizeof(double));
  if (!samples) {
    snprintf(err, cap, "out of host memory");
    goto out;
  }
  if (gpu_bufs_alloc(&dev, 1, &d, err, cap) != 0) goto out;
  bufs_reset_state(&host);
  if (gpu_upload(&dev, &host, g->stream, err, cap) != 0) goto out;

  cudnnStatus_t st = cu->CreateTensorDescriptor(&k.xd);
  if (st == CUDNN_STATUS_SUCCESS) st = cu->CreateTensorDescriptor(&k.bnd);
  if (st != CUDNN_STATUS_SUCCESS) {
    cudnn_status_text(cu, st, text, sizeof text);
    snprintf(err, cap, "cudnnCreateTensorDescriptor: %s", text);
    goto out;
  }
  st = cu->SetTensor4dDescriptor(k.xd,
                                 d.layout == sbnLayoutNHWC ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW,
                                 dt, (int)d.n, (int)d.c, h, w);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cu->DeriveBNTensorDescriptor(k.bnd, k.xd, CUDNN_BATCHNORM_SPATIAL);
  if (st != CUDNN_STATUS_SUCCESS) {
    cudnn_status_text(cu, st, text, sizeof text);
    if (cudnn_not_supported(st)) {
      row->skipped = 1;
      snprintf(row->note, sizeof row->note, "not supported by cuDNN: tensor descriptor: %s", text);
    } else {
      snprintf(err, cap, "cudnnSetTensor4dDescriptor / cudnnDeriveBNTensorDescriptor: %s", text);
    }
    goto out;
  }

  /* The mode: one untimed forward + backward (counted as warm-up) tells whether cuDNN takes
     it; SPATIAL_PERSISTENT refused (not supported, or a bad parameter for this shape) falls
     back to SPATIAL. */
  int chosen = -1;
  for (int m = 0; m < 2 && chosen < 0; m++) {
    k.mode = kModes[m];
    int pst = cudnn_prepare(&k, err, cap);
    if (pst < 0) goto out; /* CUDA allocation failure */
    st = (cudnnStatus_t)pst;
    if (st == CUDNN_STATUS_SUCCESS) st = cudnn_call(&k, 1);
    if (st == CUDNN_STATUS_SUCCESS) st = cudnn_call(&k, 0);
    if (st == CUDNN_STATUS_SUCCESS) {
      GPU_TRY(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize (cuDNN probe)");
      chosen = m;
      break;
    }
    cudnn_status_text(cu, st, text, sizeof text);
    size_t len = strlen(refused);
    if (len + 2 < sizeof refused)
      snprintf(refused + len, sizeof refused - len, "%s%s: %s", len ? "; " : "", kModeNames[m],
               text);
    const int cat = CUDNN_STATUS_CATEGORY((int)st);
    const int fall_back =
        m == 0 && (cat == CUDNN_STATUS_NOT_SUPPORTED || cat == CUDNN_STATUS_BAD_PARAM);
    if (!fall_back && !cudnn_not_supported(st)) {
      snprintf(err, cap, "cuDNN %s", refused);
      goto out;
    }
  }
  if (chosen < 0) {
    row->skipped = 1;
    snprintf(row->note, sizeof row->note, "not supported by cuDNN: %s", refused);
    goto out;
  }
  {
    char ver[32];
    format_cudnn_version(cu->version, ver, sizeof ver);
    snprintf(row->note, sizeof row->note,
             "cuDNN %s, %s, CUDNN_BATCHNORM_OPS_BN, one GPU, no sync; checked at 10x the "
             "library's tolerance, running stats not compared",
             ver, kModeNames[chosen]);
    if (chosen == 1) {
      note_append(row, "refused first: ");
      size_t len = strlen(row->note);
      snprintf(row->note + len, sizeof row->note - len, "%s", refused);
    }
  }

  for (int fwd = 1; fwd >= 0; fwd--) {
    double *ev_us = samples, *host_us = samples + o->iters;
    if (gpu_time_op(g, cudnn_op, &k, fwd, o, ev_us, host_us, err, cap) != 0) goto out;
    snprintf(row->kernel[fwd], sizeof row->kernel[fwd], "cudnn");
    row_set_times(row, fwd, ev_us, host_us, o->iters);
  }

  /* The check run, as for the library's rows. */
  bufs_reset_state(&host);
  if (gpu_upload(&dev, &host, g->stream, err, cap) != 0 ||
      gpu_poison(&dev, g->stream, err, cap) != 0)
    goto out;
  if (cudnn_op(&k, 1, err, cap) < 0 || cudnn_op(&k, 0, err, cap) < 0) goto out;
  GPU_TRY(cudaStreamSynchronize(g->stream), "cudaStreamSynchronize (check run)");
  if (gpu_download(&host, &dev, g->stream, err, cap) != 0) goto out;
  check_row(row, &host, 1, o->check_channels, NULL, sbnGradGlobal, &kCheckCudnn);
  goto out;
fail:
out:
  if (k.xd) cu->DestroyTensorDescriptor(k.xd);
  if (k.bnd) cu->DestroyTensorDescriptor(k.bnd);
  if (k.ws) cudaFree(k.ws);
  if (k.reserve) cudaFree(k.reserve);
  if (err[0]) gpu_recover(g);
  gpu_bufs_free(&dev);
  free(samples);
#endif
}
#endif /* SBN_BENCH_HAVE_CUDA */

/* ---- output ------------------------------------------------------------------------- */
typedef struct {
  int version; /* sbnGetVersion */
  char date[32];
  long cores;
  const char* shapes_source;
  int nshapes;
  double total_s;
  char why_cpu[320]; /* CPU mode: why not the GPU path */
  char device[400];  /* CPU mode: the device line */
} bench_meta_t;

static const char* kBytesFormula =
    "per rank: fwd = 2*numel*elem_size (read x, write y); bwd = 3*numel*elem_size (read x and "
    "dy, write dx); numel = N*C*spatial; GB/s = bytes / median time";

static void print_header(const bench_opts_t* o, const bench_meta_t* m) {
  printf("# sbn-bench  syncbn %d.%d.%d (header %d.%d.%d)  commit %s  %s\n", m->version / 10000,
         m->version / 100 % 100, m->version % 100, SBN_VERSION_MAJOR, SBN_VERSION_MINOR,
         SBN_VERSION_PATCH, SBN_BENCH_COMMIT, m->date);
  printf("# device: %s\n", m->device);
  printf("# ranks %d (one host thread each), threads %d, cores online %ld\n", o->ranks, o->ranks,
         m->cores);
  printf(
      "# scale %d (spatial = H*W / %d, >= 1), warm-up %d, iters %d (median), checked "
      "channels per row %s%d\n",
      o->scale, o->scale, o->warmup, o->iters, o->check_channels ? "<= " : "all",
      o->check_channels ? o->check_channels : 0);
  printf("# shapes: %d from %s; sizes are per rank (= per GPU)\n", m->nshapes, m->shapes_source);
  printf("#\n");
  printf("#%47s %20s %20s\n", "", "------- forward ----", "------ backward ----");
  printf("# %5s %5s %6s %8s %5s %6s %5s %-6s %11s %8s %11s %8s %7s %8s\n", "shape", "N", "C",
         "spatial", "dtype", "layout", "ranks", "kernel", "time(us)", "GB/s", "time(us)", "GB/s",
         "#wrong", "tol used");
}

static void print_row(const bench_row_t* r, int ranks) {
  char kl[52];
  printf("  %5s %5" PRId64 " %6" PRId64 " %8" PRId64 " %5s %6s %5d %-6s", r->shape->id, r->shape->n,
         r->shape->c, r->spatial, kDtypeNames[r->dtype], kLayoutNames[r->layout], ranks,
         kernel_label(r, kl, sizeof kl));
  if (r->error[0]) {
    printf("   FAILED: %s\n", r->error);
  } else {
    printf(r->worst < 1000 ? " %11.1f %8.2f %11.1f %8.2f %7" PRId64 " %8.3f\n"
                           : " %11.1f %8.2f %11.1f %8.2f %7" PRId64 " %8.1e\n",
           r->us_fwd, r->gbps_fwd, r->us_bwd, r->gbps_bwd, r->wrong, r->worst);
  }
  fflush(stdout);
}

static void json_string(FILE* f, const char* s) {
  fputc('"', f);
  for (; *s; s++) {
    unsigned char ch = (unsigned char)*s;
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

static void json_number(FILE* f, double v) {
  if (isfinite(v))
    fprintf(f, "%.6g", v);
  else
    fprintf(f, "null");
}

static int write_json(const char* path, const bench_opts_t* o, const bench_meta_t* m,
                      const bench_row_t* rows, int nrows, int64_t wrong, int failed) {
  FILE* f = fopen(path, "w");
  if (!f) return -1;
  char ver[32];
  snprintf(ver, sizeof ver, "%d.%d.%d", m->version / 10000, m->version / 100 % 100,
           m->version % 100);
  fprintf(f, "{\n  \"tool\": \"sbn-bench\",\n  \"library_version\": ");
  json_string(f, ver);
  fprintf(f, ",\n  \"commit\": ");
  json_string(f, SBN_BENCH_COMMIT);
  fprintf(f, ",\n  \"date\": ");
  json_string(f, m->date);
  fprintf(f, ",\n  \"device\": ");
  json_string(f, m->device);
  fprintf(f, ",\n  \"mode\": \"cpu\",\n  \"why_cpu\": ");
  json_string(f, m->why_cpu);
  fprintf(f,
          ",\n  \"team\": \"cpu\",\n  \"ranks\": %d,\n  \"threads\": %d,\n"
          "  \"cores_online\": %ld,\n  \"scale\": %d,\n  \"warmup\": %d,\n  \"iters\": %d,\n"
          "  \"check_channels\": %d,\n  \"shapes_source\": ",
          o->ranks, o->ranks, m->cores, o->scale, o->warmup, o->iters, o->check_channels);
  json_string(f, m->shapes_source);
  fprintf(f, ",\n  \"bytes\": ");
  json_string(f, kBytesFormula);
  fprintf(f, ",\n  \"tolerance\": {\"stat\": %g, \"fp32\": %g, \"half\": %g},\n", TOL_STAT, TOL_F32,
          TOL_HALF);
  fprintf(f, "  \"rows\": [");
  for (int i = 0; i < nrows; i++) {
    const bench_row_t* r = &rows[i];
    fprintf(f, "%s\n    {\"shape\": ", i ? "," : "");
    json_string(f, r->shape->id);
    fprintf(f, ", \"where\": ");
    json_string(f, r->shape->where);
    fprintf(f,
            ", \"n\": %" PRId64 ", \"c\": %" PRId64 ", \"h\": %" PRId64 ", \"w\": %" PRId64
            ", \"spatial\": %" PRId64 ", \"dtype\": \"%s\", \"layout\": \"%s\", \"ranks\": %d",
            r->shape->n, r->shape->c, r->shape->h, r->shape->w, r->spatial, kDtypeNames[r->dtype],
            kLayoutNames[r->layout], o->ranks);
    fprintf(f, ", \"kernel\": {\"fwd\": ");
    json_string(f, r->kernel[1]);
    fprintf(f, ", \"bwd\": ");
    json_string(f, r->kernel[0]);
    fprintf(f, "}, \"us_fwd\": ");
    json_number(f, r->error[0] ? NAN : r->us_fwd);
    fprintf(f, ", \"us_bwd\": ");
    json_number(f, r->error[0] ? NAN : r->us_bwd);
    fprintf(f, ", \"gbps_fwd\": ");
    json_number(f, r->error[0] ? NAN : r->gbps_fwd);
    fprintf(f, ", \"gbps_bwd\": ");
    json_number(f, r->error[0] ? NAN : r->gbps_bwd);
    fprintf(f, ", \"checked\": %" PRId64 ", \"wrong\": %" PRId64 ", \"tol_used\": ", r->checked,
            r->wrong);
    json_number(f, r->worst);
    fprintf(f, ", \"worst\": ");
    json_string(f, r->worst_what);
    fprintf(f, ", \"error\": ");
    if (r->error[0])
      json_string(f, r->error);
    else
      fprintf(f, "null");
    fprintf(f, "}");
  }
  fprintf(f, "\n  ],\n  \"wrong\": %" PRId64 ",\n  \"failed_rows\": %d,\n  \"total_s\": ", wrong,
          failed);
  json_number(f, m->total_s);
  fprintf(f, ",\n  \"ok\": %s\n}\n", (wrong == 0 && failed == 0) ? "true" : "false");
  return fclose(f) == 0 ? 0 : -1;
}

#if SBN_BENCH_HAVE_CUDA
/* ---- GPU mode output -------------------------------------------------------------- */
static const char* kGpuBytesFormula =
    "GB/s/rk = a rank's bytes / median time: fwd 2*numel*es (read x, write y), bwd "
    "3*numel*es (read x and dy, write dx); numel = N*C*spatial, es = element size; "
    "GB/s all = W x GB/s/rk (all W ranks share the one GPU)";
static const char* kGpuFloorFormula =
    "floor / median time x 100, B = copy bandwidth of this run; |x| = bytes of ALL W ranks' x: "
    "fwd (a) 3|x|/B (x read twice, y written), (b) 2|x|/B (each tensor once); bwd (a) "
    "5|x|/B (x and dy read twice, dx written), (b) 3|x|/B";
static const char* kGpuRatioFormula =
    "speed ratio = t_path / t_coop of the same op (median times), shape, dtype, layout and W "
    "(cudnn: the coop row at W = 1); > 1: coop is faster, < 1: coop is slower";
static const char* const kGpuPathLegend[3] = {
    "coop  = the library's cooperative kernel (SBN_ALGO=coop): one cooperative launch per op "
    "for all W ranks, the exchange inside it",
    "nccl  = the library's host-driven path (SBN_ALGO=nccl, PyTorch's op sequence); "
    "nccl-path on a virtual team: stats kernel, publish kernel, gather kernel in place of "
    "ncclAllGather, apply kernel (NCCL refuses two ranks on one GPU); at W = 1 an "
    "sbnCommInitAll team of one GPU with a real 1-rank ncclAllGather; its outputs must be "
    "bitwise the coop row's",
    "cudnn = cudnnBatchNormalizationForwardTrainingEx / BackwardEx, CUDNN_BATCHNORM_OPS_BN, "
    "mode SPATIAL_PERSISTENT (SPATIAL where cuDNN refuses it), W = 1 only: one GPU, no sync"};

/* What gpu_main hands the output: the runtime libraries and the caller's SBN_ALGO. */
typedef struct {
  bench_nccl_t nccl;
  bench_cudnn_t cudnn;
  const char* algo_env; /* SBN_ALGO as the caller had it (a copy); NULL when unset */
  int lat_w;            /* the latency table covers W = 1..lat_w */
} bench_libs_t;

/* What one op of a row moved and how close it came to the copy bandwidth B (GB/s). */
typedef struct {
  double bytes_rank, bytes_total; /* effective bytes (floor (b) traffic) */
  double gbps_rank, gbps_total;
  double floor_a_us, floor_b_us, pct_a, pct_b;
} bench_op_derived_t;

static bench_op_derived_t op_derived(const bench_row_t* r, int fwd, double B) {
  bench_op_derived_t o;
  const double x_rank =
      (double)(r->shape->n * r->shape->c * r->spatial) * (double)dtype_size(r->dtype);
  const double x_all = x_rank * r->W;
  const double us = fwd ? r->t_fwd.med : r->t_bwd.med;
  o.bytes_rank = (fwd ? 2.0 : 3.0) * x_rank;
  o.bytes_total = (fwd ? 2.0 : 3.0) * x_all;
  o.gbps_rank = o.bytes_rank / (us * 1e3);
  o.gbps_total = o.bytes_total / (us * 1e3);
  o.floor_a_us = (fwd ? 3.0 : 5.0) * x_all / (B * 1e3); /* B in GB/s = 1e3 bytes/us */
  o.floor_b_us = (fwd ? 2.0 : 3.0) * x_all / (B * 1e3);
  o.pct_a = o.floor_a_us / us * 100.0;
  o.pct_b = o.floor_b_us / us * 100.0;
  return o;
}

/* A row with timings: it ran and did not fail. */
static int row_timed(const bench_row_t* r) {
  return r && r->shape && !r->error[0] && !r->skipped;
}

/* t_path / t_coop of one op; NaN when either is missing. */
static double speed_ratio(const bench_row_t* r, const bench_row_t* coop, int fwd) {
  if (!row_timed(r) || !row_timed(coop) || r == coop) return NAN;
  const double t = fwd ? r->t_fwd.med : r->t_bwd.med, tc = fwd ? coop->t_fwd.med : coop->t_bwd.med;
  return tc > 0 ? t / tc : NAN;
}

static void format_rank_list(const bench_opts_t* o, char* buf, size_t cap) {
  size_t len = 0;
  buf[0] = '\0';
  for (int i = 0; i < o->nranks_list && len < cap; i++)
    len += (size_t)snprintf(buf + len, cap - len, "%s%d", i ? "," : "", o->ranks_list[i]);
}

/* " ---- title ----" in width + 1 columns */
static void print_title(const char* title, int width) {
  const int len = (int)strlen(title) + 2;
  const int left = (width - len) / 2, right = width - len - left;
  putchar(' ');
  for (int i = 0; i < left; i++) putchar('-');
  printf(" %s ", title);
  for (int i = 0; i < right; i++) putchar('-');
}

static void print_gpu_header(const bench_opts_t* o, const bench_meta_t* m, const bench_gpu_t* g,
                             const bench_libs_t* libs) {
  char wl[160], ver[32];
  format_rank_list(o, wl, sizeof wl);
  printf("# sbn-bench  syncbn %d.%d.%d (header %d.%d.%d)  commit %s  %s\n", m->version / 10000,
         m->version / 100 % 100, m->version % 100, SBN_VERSION_MAJOR, SBN_VERSION_MINOR,
         SBN_VERSION_PATCH, SBN_BENCH_COMMIT, m->date);
  printf("# mode: GPU, virtual teams (W ranks on device %d) and cuDNN (W = 1); paths:%s%s%s\n",
         g->device, o->path_on[BENCH_PATH_COOP] ? " coop" : "",
         o->path_on[BENCH_PATH_NCCL] ? " nccl" : "", o->path_on[BENCH_PATH_CUDNN] ? " cudnn" : "");
  printf("# device %d: %s, sm_%d%d, %d SMs, L2 %.1f MiB, memory %.1f GiB, PCI %s\n", g->device,
         g->name, g->cc_major, g->cc_minor, g->sms, g->l2_bytes / 1048576.0,
         (double)g->mem_total / 1073741824.0, g->pci);
  printf("# driver %d.%d (%d), runtime %d.%d (%d), host cores online %ld\n", g->driver / 1000,
         g->driver % 1000 / 10, g->driver, g->runtime / 1000, g->runtime % 1000 / 10, g->runtime,
         m->cores);
  if (libs->nccl.version >= 0) {
    format_nccl_version(libs->nccl.version, ver, sizeof ver);
    printf("# NCCL %s (%s; for the record: virtual teams make no NCCL call)\n", ver,
           libs->nccl.from);
  } else {
    printf("# NCCL: no version: %s\n", libs->nccl.why);
  }
  format_cudnn_version(libs->cudnn.version, ver, sizeof ver);
  if (!libs->cudnn.lib)
    printf("# cuDNN not available: %s\n", libs->cudnn.why);
  else if (libs->cudnn.why[0])
    printf("# cuDNN %s (%s) not usable: %s\n", ver, libs->cudnn.from, libs->cudnn.why);
  else
    printf("# cuDNN %s (%s, loaded at run time)\n", ver, libs->cudnn.from);
  printf(
      "# SBN_ALGO: set by the bench around each library row's calls (coop rows: coop, nccl "
      "rows: nccl); the caller's value (%s) is put back at the end\n",
      libs->algo_env ? libs->algo_env : "unset");
  printf("# SBN_KERNEL (the cooperative kernel's variant, read by the library at each call): "
         "%s; each row's kernel column says what ran (forward/backward when they differ)\n",
         getenv("SBN_KERNEL") && getenv("SBN_KERNEL")[0] ? getenv("SBN_KERNEL") : "auto");
  printf(
      "# copy bandwidth B = %.1f GB/s (device-to-device cudaMemcpyAsync of %zu MiB, "
      "B = 2*bytes/time, median of %d: %.1f us)\n",
      g->copy_gbps, g->copy_bytes >> 20, BENCH_GPU_COPY_REPS, g->copy_us);
  int has_w1 = 0;
  for (int i = 0; i < o->nranks_list; i++) has_w1 |= o->ranks_list[i] == 1;
  printf(
      "# W %s%s; warm-up %d, iters %d (CUDA events around the op; median here, min and p90 in "
      "the JSON)%s\n",
      wl, o->path_on[BENCH_PATH_CUDNN] && !has_w1 ? " (no 1: no cudnn rows)" : "", o->warmup,
      o->iters,
      o->iters < BENCH_GPU_MIN_ITERS ? "; NOTE: fewer iters than the methodology's 50" : "");
  printf(
      "# L2 flushed before every call: cudaMemsetAsync of %zu MiB (>= 2 x L2), outside the "
      "events\n",
      g->flush_bytes >> 20);
  printf(
      "# forward: sbnForwardTrain (affine, running stats, eps 1e-5, momentum 0.1); "
      "backward: sbnBackward (sbnGradGlobal); cudnn: the same eps and momentum\n");
  printf(
      "# scale %d (spatial = H*W / %d, >= 1), checked channels per row %s%d (one more "
      "forward + backward per row on fresh inputs, copied back)\n",
      o->scale, o->scale, o->check_channels ? "<= " : "all",
      o->check_channels ? o->check_channels : 0);
  printf(
      "# shapes: %d from %s; sizes are per rank (= per GPU): a row of W ranks moves W x "
      "those bytes through one GPU\n",
      m->nshapes, m->shapes_source);
  printf("#\n#%50s", "");
  print_title("forward", 52);
  print_title("backward", 52);
  printf("\n# %5s %5s %6s %8s %5s %6s %2s %-5s %-13s", "shape", "N", "C", "spatial", "dtype",
         "layout", "W", "path", "kernel");
  for (int k = 0; k < 2; k++)
    printf(" %10s %8s %9s %7s %7s %6s", "time(us)", "GB/s/rk", "GB/s all", "%fl(a)", "%fl(b)",
           "t/coop");
  printf(" %6s %8s\n", "#wrong", "tol used");
  fflush(stdout);
}

/* coop: the row the speed ratio compares with (NULL: none). */
static void print_gpu_row(const bench_row_t* r, double B, const bench_row_t* coop) {
  char kl[52];
  printf("  %5s %5" PRId64 " %6" PRId64 " %8" PRId64 " %5s %6s %2d %-5s %-13s", r->shape->id,
         r->shape->n, r->shape->c, r->spatial, kDtypeNames[r->dtype], kLayoutNames[r->layout], r->W,
         kPathNames[r->path], kernel_label(r, kl, sizeof kl));
  if (r->error[0]) {
    printf("   FAILED: %s\n", r->error);
  } else if (r->skipped) {
    printf("   -- %s\n", r->note);
  } else {
    for (int fwd = 1; fwd >= 0; fwd--) {
      bench_op_derived_t d = op_derived(r, fwd, B);
      char ratio[16] = "-";
      double q = speed_ratio(r, coop, fwd);
      if (isfinite(q)) snprintf(ratio, sizeof ratio, "%.2f", q);
      printf(" %10.1f %8.1f %9.1f %7.1f %7.1f %6s", fwd ? r->t_fwd.med : r->t_bwd.med, d.gbps_rank,
             d.gbps_total, d.pct_a, d.pct_b, ratio);
    }
    printf(r->worst < 1000 ? " %6" PRId64 " %8.3f\n" : " %6" PRId64 " %8.1e\n", r->wrong, r->worst);
  }
  fflush(stdout);
}

/* Latency rows: lat[((W - 1) * 2 + q) * 2 + path], q = 0 tiny, 1 empty; path coop or nccl;
   shape == NULL where the path is off. */
static const bench_row_t* lat_row(const bench_row_t* lat, int W, int q, int path) {
  const bench_row_t* r = &lat[((W - 1) * 2 + q) * 2 + path];
  return r->shape ? r : NULL;
}

static void print_latency(const bench_row_t* lat, int lat_w) {
  printf(
      "#\n# latency: fp32 NCHW, C=512; tiny = N=4, 1x1 per rank (like S10); empty = n=0 on "
      "every rank (the launches and the exchange, no data). Median us: GPU = CUDA events, "
      "host = the enqueueing calls; exch = empty(W) - empty(W=1) of the same path: what the "
      "exchange with W-1 peers adds\n");
  printf("#%9s", "");
  print_title("tiny", 35);
  print_title("empty", 35);
  print_title("exch", 15);
  printf("\n# %2s %-5s %8s %8s %8s %8s %8s %8s %8s %8s %7s %7s %7s\n", "W", "path", "fwd", "bwd",
         "host fwd", "host bwd", "fwd", "bwd", "host fwd", "host bwd", "fwd", "bwd", "#wrong");
  for (int W = 1; W <= lat_w; W++)
    for (int p = 0; p < 2; p++) {
      const bench_row_t* rq[2] = {lat_row(lat, W, 0, p), lat_row(lat, W, 1, p)};
      if (!rq[0] && !rq[1]) continue;
      printf("  %2d %-5s", W, kPathNames[p]);
      int64_t wrong = 0;
      for (int q = 0; q < 2; q++) {
        if (row_timed(rq[q]))
          printf(" %8.1f %8.1f %8.1f %8.1f", rq[q]->t_fwd.med, rq[q]->t_bwd.med,
                 rq[q]->t_fwd.host_med, rq[q]->t_bwd.host_med);
        else
          printf(" %8s %8s %8s %8s", rq[q] ? "FAILED" : "-", "-", "-", "-");
        if (rq[q]) wrong += rq[q]->wrong;
      }
      const bench_row_t* e1 = lat_row(lat, 1, 1, p);
      for (int fwd = 1; fwd >= 0; fwd--) {
        if (W > 1 && row_timed(rq[1]) && row_timed(e1))
          printf(" %7.1f",
                 fwd ? rq[1]->t_fwd.med - e1->t_fwd.med : rq[1]->t_bwd.med - e1->t_bwd.med);
        else
          printf(" %7s", "-");
      }
      printf(" %7" PRId64 "\n", wrong);
      for (int q = 0; q < 2; q++)
        if (rq[q] && rq[q]->error[0])
          printf("#   W=%d %s %s FAILED: %s\n", W, kPathNames[p], rq[q]->shape->id, rq[q]->error);
    }
  fflush(stdout);
}

/* Median of the speed ratios t_path / t_coop over the main table's rows of one path. */
static void print_ratio_summary(const bench_row_t* rows, const bench_row_t* const* coop_of,
                                int nrows) {
  for (int p = BENCH_PATH_NCCL; p <= BENCH_PATH_CUDNN; p++) {
    double* q[2];
    int n[2] = {0, 0};
    q[0] = malloc((size_t)(nrows + 1) * sizeof(double));
    q[1] = malloc((size_t)(nrows + 1) * sizeof(double));
    if (q[0] && q[1])
      for (int i = 0; i < nrows; i++) {
        if (rows[i].path != p) continue;
        for (int fwd = 1; fwd >= 0; fwd--) {
          double v = speed_ratio(&rows[i], coop_of[i], fwd);
          if (isfinite(v)) q[fwd][n[fwd]++] = v;
        }
      }
    if (n[0] && n[1])
      printf("# t_%s / t_coop, median over %d rows: fwd %.2f, bwd %.2f (> 1: coop is faster)\n",
             kPathNames[p], n[1], median(q[1], n[1]), median(q[0], n[0]));
    free(q[0]);
    free(q[1]);
  }
}

/* JSON (--json FILE) in GPU mode: one object. Top level (every key always present):
     tool "sbn-bench", library_version "0.1.0", commit, date (UTC, ISO 8601), mode "gpu",
     path "coop" (the path under test; every row has its own "path"), paths [the paths run:
     "coop", "nccl", "cudnn"], team "virtual", device {index, name, arch "sm_90", pci,
     sm_count, l2_bytes, memory_bytes}, driver_version, runtime_version and
     cuda_runtime_version (both cudaRuntimeGetVersion, e.g. 13000), nccl_version
     (ncclGetVersion of a dlopen'd libnccl.so.2, e.g. 22809 = 2.28.9; null when not
     loadable), nccl_library (what was loaded, or null), cudnn_version (cudnnGetVersion of
     the dlopen'd libcudnn.so.9, e.g. 91900 = 9.19.0; null when not loadable),
     cudnn_library (or null), cudnn_status ("ok", or why the cudnn rows did not run),
     sbn_algo_env (SBN_ALGO as the caller set it, or null), cores_online, copy_bandwidth
     {gbps, bytes, us_median, reps, formula}, ranks [W list], latency_ranks [1..max W],
     scale, warmup, iters, l2_flush_bytes, check_channels, grad_mode "global", timing,
     shapes_source, bytes (formula), floors (formula), ratio (formula), tolerance {stat,
     fp32, half}, tolerance_cudnn {stat, fp32, half}, rows [...], latency [...], wrong,
     failed_rows, skipped_rows, total_s, ok.
   rows and latency: flat objects, one per (shape, dtype, layout, W, path), in run order:
     path        "coop" | "nccl" | "cudnn"
     shape, where, n, c, h, w, spatial, dtype ("fp32" | "bf16" | "fp16"), layout ("NCHW" |
                 "NHWC"), ranks (W; 1 for cudnn)
     bytes_x_rank, bytes_x_total   bytes of one rank's x, of all W ranks' x
     fwd, bwd    {us_median, us_min, us_p90, host_us_median, bytes_rank, bytes_total,
                 gbps_rank, gbps_total, floor_a_us, floor_b_us, pct_floor_a, pct_floor_b};
                 times in us (CUDA events; host_us_median: the enqueueing calls), null when
                 the row failed or did not run (bytes and floors are always there)
     checked, wrong, tol_used (worst |got-ref| / tolerance; cudnn rows: of
                 tolerance_cudnn), worst (where), error (null, or why the row failed)
     note        "" or the path's remark: "nccl-path on a virtual team: stats kernel, ...",
                 the cuDNN mode used, "cuDNN not available: ...", "not supported by cuDNN:
                 ..." (a row that did not run has error null, timings null and says why here)
   Speed ratios are not stored: t_path / t_coop from the rows of the same shape, dtype,
   layout and W (cudnn: the coop row with ranks 1). */
static void json_gpu_op(FILE* f, const bench_row_t* r, int fwd, double B) {
  const bench_times_t* t = fwd ? &r->t_fwd : &r->t_bwd;
  const int ok = row_timed(r);
  bench_op_derived_t d = op_derived(r, fwd, B);
  const double v[] = {t->med,       t->min,        t->p90,      t->host_med,
                      d.bytes_rank, d.bytes_total, d.gbps_rank, d.gbps_total,
                      d.floor_a_us, d.floor_b_us,  d.pct_a,     d.pct_b};
  static const char* const names[] = {"us_median",  "us_min",      "us_p90",      "host_us_median",
                                      "bytes_rank", "bytes_total", "gbps_rank",   "gbps_total",
                                      "floor_a_us", "floor_b_us",  "pct_floor_a", "pct_floor_b"};
  fprintf(f, "{");
  for (size_t i = 0; i < sizeof v / sizeof *v; i++) {
    /* bytes and floors are known even for a failed row */
    int known = ok || i == 4 || i == 5 || i == 8 || i == 9;
    fprintf(f, "%s\"%s\": ", i ? ", " : "", names[i]);
    if (i == 4 || i == 5)
      fprintf(f, "%.0f", v[i]); /* bytes: exact */
    else
      json_number(f, known ? v[i] : NAN);
  }
  fprintf(f, "}");
}

static void json_gpu_row(FILE* f, const bench_row_t* r, double B) {
  const double x_rank =
      (double)(r->shape->n * r->shape->c * r->spatial) * (double)dtype_size(r->dtype);
  fprintf(f, "{\"path\": \"%s\", \"shape\": ", kPathNames[r->path]);
  json_string(f, r->shape->id);
  fprintf(f, ", \"where\": ");
  json_string(f, r->shape->where);
  fprintf(f,
          ", \"n\": %" PRId64 ", \"c\": %" PRId64 ", \"h\": %" PRId64 ", \"w\": %" PRId64
          ", \"spatial\": %" PRId64 ", \"dtype\": \"%s\", \"layout\": \"%s\", \"ranks\": %d",
          r->shape->n, r->shape->c, r->shape->h, r->shape->w, r->spatial, kDtypeNames[r->dtype],
          kLayoutNames[r->layout], r->W);
  fprintf(f, ", \"kernel\": {\"fwd\": ");
  json_string(f, r->kernel[1]);
  fprintf(f, ", \"bwd\": ");
  json_string(f, r->kernel[0]);
  fprintf(f, "}");
  fprintf(f, ", \"bytes_x_rank\": %.0f, \"bytes_x_total\": %.0f", x_rank, x_rank * r->W);
  fprintf(f, ",\n     \"fwd\": ");
  json_gpu_op(f, r, 1, B);
  fprintf(f, ",\n     \"bwd\": ");
  json_gpu_op(f, r, 0, B);
  fprintf(f, ",\n     \"checked\": %" PRId64 ", \"wrong\": %" PRId64 ", \"tol_used\": ", r->checked,
          r->wrong);
  json_number(f, r->worst);
  fprintf(f, ", \"worst\": ");
  json_string(f, r->worst_what);
  fprintf(f, ", \"error\": ");
  if (r->error[0])
    json_string(f, r->error);
  else
    fprintf(f, "null");
  fprintf(f, ", \"note\": ");
  json_string(f, r->note);
  fprintf(f, "}");
}

/* A string or null. */
static void json_string_or_null(FILE* f, const char* s) {
  if (s)
    json_string(f, s);
  else
    fprintf(f, "null");
}

static int write_json_gpu(const char* path, const bench_opts_t* o, const bench_meta_t* m,
                          const bench_gpu_t* g, const bench_libs_t* libs, const bench_row_t* rows,
                          int nrows, const bench_row_t* lat, int nlat, int64_t wrong, int failed,
                          int skipped) {
  FILE* f = fopen(path, "w");
  if (!f) return -1;
  char ver[32], buf[64];
  snprintf(ver, sizeof ver, "%d.%d.%d", m->version / 10000, m->version / 100 % 100,
           m->version % 100);
  fprintf(f, "{\n  \"tool\": \"sbn-bench\",\n  \"library_version\": ");
  json_string(f, ver);
  fprintf(f, ",\n  \"commit\": ");
  json_string(f, SBN_BENCH_COMMIT);
  fprintf(f, ",\n  \"date\": ");
  json_string(f, m->date);
  fprintf(f, ",\n  \"mode\": \"gpu\",\n  \"path\": \"coop\",\n  \"paths\": [");
  for (int p = 0, k = 0; p < 3; p++)
    if (o->path_on[p]) fprintf(f, "%s\"%s\"", k++ ? ", " : "", kPathNames[p]);
  fprintf(f, "],\n  \"team\": \"virtual\",\n");
  fprintf(f, "  \"device\": {\"index\": %d, \"name\": ", g->device);
  json_string(f, g->name);
  snprintf(buf, sizeof buf, "sm_%d%d", g->cc_major, g->cc_minor);
  fprintf(f, ", \"arch\": ");
  json_string(f, buf);
  fprintf(f, ", \"pci\": ");
  json_string(f, g->pci);
  fprintf(f, ", \"sm_count\": %d, \"l2_bytes\": %d, \"memory_bytes\": %zu},\n", g->sms, g->l2_bytes,
          g->mem_total);
  fprintf(f,
          "  \"driver_version\": %d,\n  \"runtime_version\": %d,\n"
          "  \"cuda_runtime_version\": %d,\n  \"nccl_version\": ",
          g->driver, g->runtime, g->runtime);
  if (libs->nccl.version >= 0)
    fprintf(f, "%d", libs->nccl.version);
  else
    fprintf(f, "null");
  fprintf(f, ",\n  \"nccl_library\": ");
  json_string_or_null(f, libs->nccl.lib ? libs->nccl.from : NULL);
  fprintf(f, ",\n  \"cudnn_version\": ");
  if (libs->cudnn.version >= 0)
    fprintf(f, "%lld", libs->cudnn.version);
  else
    fprintf(f, "null");
  fprintf(f, ",\n  \"cudnn_library\": ");
  json_string_or_null(f, libs->cudnn.lib ? libs->cudnn.from : NULL);
  fprintf(f, ",\n  \"cudnn_status\": ");
  json_string(f, libs->cudnn.why[0] ? libs->cudnn.why : "ok");
  fprintf(f, ",\n  \"sbn_algo_env\": ");
  json_string_or_null(f, libs->algo_env);
  fprintf(f, ",\n  \"sbn_kernel_env\": ");
  json_string_or_null(f, getenv("SBN_KERNEL"));
  fprintf(f, ",\n  \"cores_online\": %ld,\n", m->cores);
  fprintf(f, "  \"copy_bandwidth\": {\"gbps\": ");
  json_number(f, g->copy_gbps);
  fprintf(f, ", \"bytes\": %zu, \"us_median\": ", g->copy_bytes);
  json_number(f, g->copy_us);
  fprintf(f,
          ", \"reps\": %d, \"formula\": \"B = 2*bytes/time (device-to-device "
          "cudaMemcpyAsync: every byte read and written)\"},\n",
          BENCH_GPU_COPY_REPS);
  fprintf(f, "  \"ranks\": [");
  for (int i = 0; i < o->nranks_list; i++) fprintf(f, "%s%d", i ? ", " : "", o->ranks_list[i]);
  fprintf(f, "],\n  \"latency_ranks\": [");
  for (int W = 1; W <= libs->lat_w; W++) fprintf(f, "%s%d", W > 1 ? ", " : "", W);
  fprintf(f,
          "],\n  \"scale\": %d,\n  \"warmup\": %d,\n  \"iters\": %d,\n  \"l2_flush_bytes\": "
          "%zu,\n  \"check_channels\": %d,\n  \"grad_mode\": \"global\",\n"
          "  \"timing\": \"CUDA events recorded around the op only; L2 flushed (memset) before "
          "every call, outside the events\",\n  \"shapes_source\": ",
          o->scale, o->warmup, o->iters, g->flush_bytes, o->check_channels);
  json_string(f, m->shapes_source);
  fprintf(f, ",\n  \"bytes\": ");
  json_string(f, kGpuBytesFormula);
  fprintf(f, ",\n  \"floors\": ");
  json_string(f, kGpuFloorFormula);
  fprintf(f, ",\n  \"ratio\": ");
  json_string(f, kGpuRatioFormula);
  fprintf(f, ",\n  \"tolerance\": {\"stat\": %g, \"fp32\": %g, \"half\": %g},\n", TOL_STAT, TOL_F32,
          TOL_HALF);
  fprintf(f, "  \"tolerance_cudnn\": {\"stat\": %g, \"fp32\": %g, \"half\": %g},\n", TOL_CUDNN_STAT,
          TOL_CUDNN_F32, TOL_CUDNN_HALF);
  fprintf(f, "  \"rows\": [");
  for (int i = 0; i < nrows; i++) {
    fprintf(f, "%s\n    ", i ? "," : "");
    json_gpu_row(f, &rows[i], g->copy_gbps);
  }
  fprintf(f, "\n  ],\n  \"latency\": [");
  for (int i = 0, k = 0; i < nlat; i++) {
    if (!lat[i].shape) continue;
    fprintf(f, "%s\n    ", k++ ? "," : "");
    json_gpu_row(f, &lat[i], g->copy_gbps);
  }
  fprintf(f,
          "\n  ],\n  \"wrong\": %" PRId64
          ",\n  \"failed_rows\": %d,\n  \"skipped_rows\": %d,\n"
          "  \"total_s\": ",
          wrong, failed, skipped);
  json_number(f, m->total_s);
  fprintf(f, ",\n  \"ok\": %s\n}\n", (wrong == 0 && failed == 0) ? "true" : "false");
  return fclose(f) == 0 ? 0 : -1;
}
#endif /* SBN_BENCH_HAVE_CUDA */

/* ---- main --------------------------------------------------------------------------- */
static int parse_args(int argc, char** argv, bench_opts_t* o) {
  o->gpu = BENCH_GPU_AUTO;
  o->nranks_list = 0;                   /* -w: default by mode (resolve_opts) */
  o->iters = o->warmup = o->scale = -1; /* default by mode */
  o->check_channels = BENCH_CHECK_CHANNELS;
  o->dtype_on[sbnFloat32] = o->dtype_on[sbnBFloat16] = 1;
  o->layout_on[sbnLayoutNCHW] = o->layout_on[sbnLayoutNHWC] = 1;
  o->path_on[BENCH_PATH_COOP] = o->path_on[BENCH_PATH_NCCL] = o->path_on[BENCH_PATH_CUDNN] = 1;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout, argv[0]);
      return 1;
    }
    /* every other option takes a value: "--opt value" or "--opt=value" */
    static const char* const known[] = {
        "-w",       "--ranks", "-i",     "--iters", "--warmup", "--scale", "--check-channels",
        "--shapes", "--json",  "--only", "--dtype", "--layout", "--gpu",   "--paths"};
    char name[32];
    const char* val = NULL;
    const char* eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
    size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
    if (name_len >= sizeof name) return usage_error(argv[0], "unknown option '%s'", a);
    memcpy(name, a, name_len);
    name[name_len] = '\0';
    int is_known = 0;
    for (size_t k = 0; k < sizeof known / sizeof *known; k++) is_known |= !strcmp(name, known[k]);
    if (!is_known) return usage_error(argv[0], "unknown option '%s'", name);
    if (eq)
      val = eq + 1;
    else if (i + 1 < argc)
      val = argv[++i];
    else
      return usage_error(argv[0], "%s needs a value", name);
    if (!strcmp(name, "-w") || !strcmp(name, "--ranks")) {
      if (parse_int_list(val, 1, 1024, o->ranks_list, BENCH_MAX_RANK_LIST, &o->nranks_list))
        return usage_error(argv[0], "bad -w '%s'", val);
    } else if (!strcmp(name, "-i") || !strcmp(name, "--iters")) {
      if (parse_int(val, 1, 1000000, &o->iters)) return usage_error(argv[0], "bad -i '%s'", val);
    } else if (!strcmp(name, "--warmup")) {
      if (parse_int(val, 0, 1000000, &o->warmup))
        return usage_error(argv[0], "bad --warmup '%s'", val);
    } else if (!strcmp(name, "--scale")) {
      if (parse_int(val, 1, 1 << 30, &o->scale))
        return usage_error(argv[0], "bad --scale '%s' (an integer >= 1)", val);
    } else if (!strcmp(name, "--check-channels")) {
      if (parse_int(val, 0, 1 << 30, &o->check_channels))
        return usage_error(argv[0], "bad --check-channels '%s'", val);
    } else if (!strcmp(name, "--shapes")) {
      o->shapes_file = val;
    } else if (!strcmp(name, "--json")) {
      o->json_file = val;
    } else if (!strcmp(name, "--only")) {
      o->only = val;
    } else if (!strcmp(name, "--dtype")) {
      if (parse_name_list(val, kDtypeNames, 3, o->dtype_on))
        return usage_error(argv[0], "bad --dtype '%s' (fp32, bf16, fp16)", val);
    } else if (!strcmp(name, "--layout")) {
      if (parse_name_list(val, kLayoutNames, 2, o->layout_on))
        return usage_error(argv[0], "bad --layout '%s' (NCHW, NHWC)", val);
    } else if (!strcmp(name, "--paths")) {
      if (parse_name_list(val, kPathNames, 3, o->path_on))
        return usage_error(argv[0], "bad --paths '%s' (coop, nccl, cudnn)", val);
      o->paths_given = 1;
    } else if (!strcmp(name, "--gpu")) {
      int found = 0;
      for (int k = 0; k < 3; k++)
        if (ascii_casecmp(val, kGpuReqNames[k]) == 0) {
          o->gpu = (bench_gpu_req_t)k;
          found = 1;
        }
      if (!found) return usage_error(argv[0], "bad --gpu '%s' (auto, on, off)", val);
    } else {
      return usage_error(argv[0], "unknown option '%s'", name);
    }
  }
  return 0;
}

/* The defaults of the mode that runs, and the checks that depend on it. */
static int resolve_opts(bench_opts_t* o, int gpu_mode, const char* why_cpu, const char* argv0) {
  if (gpu_mode) {
    if (o->nranks_list == 0)
      parse_int_list(BENCH_GPU_DEFAULT_RANKS, 1, SBN_MAX_GPU_TEAM_RANKS, o->ranks_list,
                     BENCH_MAX_RANK_LIST, &o->nranks_list);
    o->ranks = 0;
    for (int i = 0; i < o->nranks_list; i++) {
      if (o->ranks_list[i] > SBN_MAX_GPU_TEAM_RANKS)
        return usage_error(argv0, "-w %d: a GPU team has at most %d ranks", o->ranks_list[i],
                           SBN_MAX_GPU_TEAM_RANKS);
      if (o->ranks_list[i] > o->ranks) o->ranks = o->ranks_list[i];
    }
    if (o->iters < 0) o->iters = BENCH_GPU_DEFAULT_ITERS;
    if (o->warmup < 0) o->warmup = BENCH_GPU_DEFAULT_WARMUP;
    if (o->scale < 0) o->scale = BENCH_GPU_DEFAULT_SCALE;
  } else {
    if (o->nranks_list > 1)
      return usage_error(
          argv0, "-w: the CPU team (not the GPU: %s) takes one team size, not a list", why_cpu);
    if (o->paths_given)
      return usage_error(argv0, "--paths: GPU mode only (not the GPU: %s)", why_cpu);
    o->ranks = o->nranks_list ? o->ranks_list[0] : BENCH_DEFAULT_RANKS;
    o->ranks_list[0] = o->ranks;
    o->nranks_list = 1;
    if (o->iters < 0) o->iters = BENCH_DEFAULT_ITERS;
    if (o->warmup < 0) o->warmup = BENCH_DEFAULT_WARMUP;
    if (o->scale < 0) o->scale = BENCH_DEFAULT_SCALE;
  }
  return 0;
}

#if SBN_BENCH_HAVE_CUDA
/* With a device present: can the library make a GPU team there? 1 yes; 0 unsupported
   (device without cooperative launch...: CPU mode, why says so); -1 another failure. */
static int gpu_probe(char* why, size_t cap) {
  sbnComm_t c = NULL;
  sbnResult_t res = sbnCommInitVirtual(&c, 1, 0, NULL);
  if (res == sbnSuccess) {
    sbnCommDestroy(c);
    return 1;
  }
  snprintf(why, cap, "sbnCommInitVirtual(1 rank, device 0): %s: %s", sbnGetResultName(res),
           sbnGetLastError(NULL));
  return res == sbnUnsupported ? 0 : -1;
}

/* The bookkeeping of a finished row: totals and the worst one. */
typedef struct {
  int64_t wrong, checked;
  int failed, skipped;
  const bench_row_t* worst;
} bench_totals_t;

static void totals_add(bench_totals_t* t, const bench_row_t* r) {
  t->wrong += r->wrong;
  t->checked += r->checked;
  t->failed += r->error[0] != 0;
  t->skipped += r->skipped;
  if (!r->error[0] && !r->skipped && (!t->worst || r->worst > t->worst->worst)) t->worst = r;
}

static void row_init(bench_row_t* r, const bench_shape_t* shape, int64_t spatial,
                     sbnDataType_t dtype, sbnLayout_t layout, int W, int path) {
  r->shape = shape;
  r->spatial = spatial;
  r->dtype = dtype;
  r->layout = layout;
  r->W = W;
  r->gpu = 1;
  r->path = path;
}

/* GPU mode: every shape x dtype x layout x W x path, then the latency table. */
static int gpu_main(const char* argv0, const bench_opts_t* o, const bench_shape_t* shapes,
                    int nshapes, bench_meta_t* meta, double t_start) {
  static const bench_shape_t lat_shapes[2] = {
      {"tiny", 4, 512, 1, 1, "latency: N=4, C=512, 1x1 per rank (like S10)"},
      {"empty", 0, 512, 1, 1, "latency: n=0 on every rank, C=512"}};
  static const sbnDataType_t order[3] = {sbnFloat32, sbnBFloat16, sbnFloat16};
  bench_gpu_t g;
  char err[384] = "";
  if (gpu_setup(&g, o->iters, err, sizeof err) != 0) {
    fprintf(stderr, "%s: GPU setup failed: %s\n", argv0, err);
    return 1;
  }
  bench_libs_t libs;
  memset(&libs, 0, sizeof libs);
  nccl_load(&libs.nccl);
  cudnn_load(&libs.cudnn); /* also without the cudnn path: its version, for the record */
  /* the caller's SBN_ALGO, put back at the end (the rows set it for their calls) */
  const char* env = getenv("SBN_ALGO");
  char* algo_env = env ? strdup(env) : NULL;
  libs.algo_env = algo_env;
  int has_w1 = 0;
  for (int wi = 0; wi < o->nranks_list; wi++) has_w1 |= o->ranks_list[wi] == 1;
  const int run_cudnn = o->path_on[BENCH_PATH_CUDNN] && has_w1;
  const int lib_paths = o->path_on[BENCH_PATH_COOP] + o->path_on[BENCH_PATH_NCCL];
  libs.lat_w = lib_paths ? o->ranks : 0;

  const int nw = o->nranks_list;
  /* per shape x dtype x layout and W: coop, nccl, and cudnn when W is 1 (-w may repeat 1) */
  const size_t max_rows = (size_t)nshapes * 6 * (size_t)nw * 3;
  bench_row_t* rows = calloc(max_rows, sizeof *rows);
  const bench_row_t** coop_of = calloc(max_rows, sizeof *coop_of); /* ratio reference */
  bench_row_t* lat = calloc((size_t)(libs.lat_w > 0 ? libs.lat_w : 1) * 4, sizeof *lat);
  if (!rows || !coop_of || !lat) {
    free(rows);
    free(coop_of);
    free(lat);
    free(algo_env);
    gpu_teardown(&g);
    return 1;
  }
  int64_t max_c = lat_shapes[0].c;
  for (int s = 0; s < nshapes; s++)
    if (shapes[s].c > max_c) max_c = shapes[s].c;

  print_gpu_header(o, meta, &g, &libs);
  int nrows = 0;
  bench_totals_t tot;
  memset(&tot, 0, sizeof tot);
  for (int s = 0; s < nshapes; s++) {
    int64_t spatial = shapes[s].h * shapes[s].w / o->scale;
    if (spatial < 1) spatial = 1;
    for (int t = 0; t < 3; t++) {
      if (!o->dtype_on[order[t]]) continue;
      for (int l = 0; l < 2; l++) {
        if (!o->layout_on[l]) continue;
        /* inputs of the largest W, generated once: rank r's data do not depend on W */
        sbnTensorDesc_t d = {order[t], (sbnLayout_t)l, shapes[s].n, shapes[s].c, spatial};
        bench_team_bufs_t host;
        int have_host = bufs_alloc(&host, o->ranks, &d) == 0;
        if (have_host && bufs_init(&host, shapes[s].id) != 0) {
          bufs_free(&host);
          have_host = 0;
        }
        char oom[384];
        snprintf(oom, sizeof oom,
                 "out of host memory for %d ranks of (%" PRId64 ", %" PRId64 ", %" PRId64 ")",
                 o->ranks, d.n, d.c, d.spatial);
        for (int wi = 0; wi < nw; wi++) {
          const int W = o->ranks_list[wi];
          bench_row_t* team[2] = {NULL, NULL};
          for (int p = 0; p < 2; p++) {
            if (!o->path_on[p]) continue;
            team[p] = &rows[nrows];
            coop_of[nrows++] = NULL;
            row_init(team[p], &shapes[s], spatial, order[t], (sbnLayout_t)l, W, p);
            if (!have_host) snprintf(team[p]->error, sizeof team[p]->error, "%s", oom);
          }
          if (have_host) gpu_run_team(team, &g, o, &host, max_c);
          for (int p = 0; p < 2; p++) {
            if (!team[p]) continue;
            if (p != BENCH_PATH_COOP) coop_of[team[p] - rows] = team[BENCH_PATH_COOP];
            print_gpu_row(team[p], g.copy_gbps, team[BENCH_PATH_COOP]);
            totals_add(&tot, team[p]);
          }
          if (W == 1 && run_cudnn) {
            bench_row_t* r = &rows[nrows];
            coop_of[nrows++] = team[BENCH_PATH_COOP];
            row_init(r, &shapes[s], spatial, order[t], (sbnLayout_t)l, 1, BENCH_PATH_CUDNN);
            if (have_host)
              gpu_run_cudnn_row(r, &g, o, &host, &libs.cudnn);
            else
              snprintf(r->error, sizeof r->error, "%s", oom);
            print_gpu_row(r, g.copy_gbps, team[BENCH_PATH_COOP]);
            totals_add(&tot, r);
          }
        }
        if (have_host) bufs_free(&host);
      }
    }
  }

  /* latency: the tiny and the empty op for every W from 1 to the largest, coop and nccl */
  for (int W = 1; W <= libs.lat_w; W++)
    for (int q = 0; q < 2; q++) {
      sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, lat_shapes[q].n, lat_shapes[q].c, 1};
      bench_row_t* team[2] = {NULL, NULL};
      for (int p = 0; p < 2; p++) {
        if (!o->path_on[p]) continue;
        team[p] = &lat[((W - 1) * 2 + q) * 2 + p];
        row_init(team[p], &lat_shapes[q], 1, sbnFloat32, sbnLayoutNCHW, W, p);
      }
      bench_team_bufs_t host;
      if (bufs_alloc(&host, W, &d) != 0) {
        for (int p = 0; p < 2; p++)
          if (team[p]) snprintf(team[p]->error, sizeof team[p]->error, "out of host memory");
      } else {
        if (bufs_init(&host, lat_shapes[q].id) != 0) {
          for (int p = 0; p < 2; p++)
            if (team[p]) snprintf(team[p]->error, sizeof team[p]->error, "out of host memory");
        } else {
          gpu_run_team(team, &g, o, &host, max_c);
        }
        bufs_free(&host);
      }
      for (int p = 0; p < 2; p++)
        if (team[p]) totals_add(&tot, team[p]);
    }
  if (libs.lat_w > 0) print_latency(lat, libs.lat_w);
  meta->total_s = (now_us() - t_start) * 1e-6;

  /* the caller's SBN_ALGO back */
  if (algo_env)
    setenv("SBN_ALGO", algo_env, 1);
  else
    unsetenv("SBN_ALGO");

  printf("#\n# path: %s\n#       %s\n#       %s\n", kGpuPathLegend[0], kGpuPathLegend[1],
         kGpuPathLegend[2]);
  printf("# t/coop: %s\n", kGpuRatioFormula);
  printf("# %s\n", kGpuBytesFormula);
  printf("# %%fl(a), %%fl(b): %s; B = %.1f GB/s\n", kGpuFloorFormula, g.copy_gbps);
  printf(
      "# #wrong: checked values outside |got-ref| <= atol + rtol*|ref| (statistics %g, fp32 "
      "%g, fp16/bf16 %g; reference: double, sbn_ref over all W ranks) in y, dx, save_mean, "
      "save_invstd, running stats, dweight, dbias (team sums) on the checked channels of one "
      "more forward + backward, plus broken bitwise guarantees (ranks agree on the statistics "
      "and the team sums; nccl rows: every output bitwise the coop row's, one per differing "
      "buffer)\n",
      TOL_STAT, TOL_F32, TOL_HALF);
  printf(
      "#         cudnn rows: y, dx, save_mean, save_invstd, dweight, dbias (not the running "
      "stats) at 10x: statistics %g, fp32 %g, fp16/bf16 %g (cuDNN's reduction and variance "
      "algorithm are not ours; a wrong descriptor, layout or channel order gives errors of "
      "order 1)\n",
      TOL_CUDNN_STAT, TOL_CUDNN_F32, TOL_CUDNN_HALF);
  printf("# tol used: worst |got-ref| / tolerance of the row (1.0 = at the limit)\n");
  printf(
      "# --: the row did not run (cuDNN not available, or not supported by cuDNN): not a "
      "failure\n");
  print_ratio_summary(rows, coop_of, nrows);
  char label[96] = "";
  int nlat = 0;
  for (int i = 0; i < libs.lat_w * 4; i++) nlat += lat[i].shape != NULL;
  printf("# rows %d + latency %d, failed %d, not run %d, values checked %" PRId64
         ", wrong %" PRId64,
         nrows, nlat, tot.failed, tot.skipped, tot.checked, tot.wrong);
  if (tot.worst)
    printf(", worst %.3f of tolerance (%s: %s)", tot.worst->worst,
           row_label(tot.worst, label, sizeof label), tot.worst->worst_what);
  printf("\n# total time %.1f s\n", meta->total_s);
  int status = (tot.wrong == 0 && tot.failed == 0) ? 0 : 1;
  if (o->json_file) {
    if (write_json_gpu(o->json_file, o, meta, &g, &libs, rows, nrows, lat, libs.lat_w * 4,
                       tot.wrong, tot.failed, tot.skipped) != 0) {
      fprintf(stderr, "%s: cannot write %s: %s\n", argv0, o->json_file, strerror(errno));
      status = 1;
    } else {
      printf("# json: %s\n", o->json_file);
    }
  }
  printf("# %s\n", status == 0 ? "OK" : "FAILED");
  cudnn_unload(&libs.cudnn);
  gpu_teardown(&g);
  free(rows);
  free(coop_of);
  free(lat);
  free(algo_env);
  return status;
}
#endif /* SBN_BENCH_HAVE_CUDA */

/* CPU mode: the CPU team of o->ranks ranks over every shape x dtype x layout. */
static int cpu_main(const char* argv0, const bench_opts_t* o, const bench_shape_t* shapes,
                    int nshapes, bench_meta_t* meta, double t_start) {
  /* rows */
  int nrows = 0;
  bench_row_t* rows = calloc((size_t)nshapes * 6, sizeof *rows);
  if (!rows) return 1;
  int64_t max_c = 1;
  for (int s = 0; s < nshapes; s++) {
    if (shapes[s].c > max_c) max_c = shapes[s].c;
    int64_t spatial = shapes[s].h * shapes[s].w / o->scale;
    for (int t = 0; t < 3; t++) {
      static const sbnDataType_t order[3] = {sbnFloat32, sbnBFloat16, sbnFloat16};
      if (!o->dtype_on[order[t]]) continue;
      for (int l = 0; l < 2; l++) {
        if (!o->layout_on[l]) continue;
        bench_row_t* r = &rows[nrows++];
        r->shape = &shapes[s];
        r->spatial = spatial > 0 ? spatial : 1;
        r->dtype = order[t];
        r->layout = (sbnLayout_t)l;
        r->W = o->ranks;
      }
    }
  }

  /* the team */
  sbnComm_t* comms = calloc((size_t)o->ranks, sizeof *comms);
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  if (max_c > cfg.max_channels) cfg.max_channels = max_c;
  sbnResult_t res = comms ? sbnCommInitCpu(comms, o->ranks, &cfg) : sbnSystemError;
  if (res != sbnSuccess) {
    fprintf(stderr, "%s: sbnCommInitCpu(%d ranks): %s: %s\n", argv0, o->ranks,
            sbnGetResultName(res), sbnGetLastError(NULL));
    free(comms);
    free(rows);
    return 1;
  }

  print_header(o, meta);
  bench_layout_keep_t keep;
  memset(&keep, 0, sizeof keep);
  int64_t wrong = 0, checked = 0;
  int failed = 0;
  const bench_row_t* worst = NULL;
  for (int i = 0; i < nrows; i++) {
    run_row(&rows[i], comms, o, &keep);
    print_row(&rows[i], o->ranks);
    wrong += rows[i].wrong;
    checked += rows[i].checked;
    failed += rows[i].error[0] != 0;
    if (!rows[i].error[0] && (!worst || rows[i].worst > worst->worst)) worst = &rows[i];
  }
  keep_free(&keep);
  for (int r = 0; r < o->ranks; r++) sbnCommDestroy(comms[r]);
  free(comms);
  meta->total_s = (now_us() - t_start) * 1e-6;

  printf("#\n# GB/s %s\n", kBytesFormula);
  printf(
      "# #wrong: checked values outside |got-ref| <= atol + rtol*|ref| (statistics %g, fp32 "
      "%g, fp16/bf16 %g; reference: double, sbn_ref) in y, dx, save_mean, save_invstd, "
      "running stats, dweight, dbias on the checked channels, plus broken bitwise "
      "guarantees (ranks agree; NCHW == NHWC)\n",
      TOL_STAT, TOL_F32, TOL_HALF);
  printf("# tol used: worst |got-ref| / tolerance of the row (1.0 = at the limit)\n");
  printf("# rows %d, failed %d, values checked %" PRId64 ", wrong %" PRId64, nrows, failed, checked,
         wrong);
  if (worst)
    printf(", worst %.3f of tolerance (%s %s %s: %s)", worst->worst, worst->shape->id,
           kDtypeNames[worst->dtype], kLayoutNames[worst->layout], worst->worst_what);
  printf("\n# total time %.1f s\n", meta->total_s);
  int status = (wrong == 0 && failed == 0) ? 0 : 1;
  if (o->json_file) {
    if (write_json(o->json_file, o, meta, rows, nrows, wrong, failed) != 0) {
      fprintf(stderr, "%s: cannot write %s: %s\n", argv0, o->json_file, strerror(errno));
      status = 1;
    } else {
      printf("# json: %s\n", o->json_file);
    }
  }
  printf("# %s\n", status == 0 ? "OK" : "FAILED");
  free(rows);
  return status;
}

int main(int argc, char** argv) {
  bench_opts_t o;
  memset(&o, 0, sizeof o);
  int pa = parse_args(argc, argv, &o);
  if (pa == 1) return 0; /* -h */
  if (pa) return pa;
  const double t_start = now_us();
  bench_meta_t meta;
  memset(&meta, 0, sizeof meta);

  /* the mode: the GPU path when the build has CUDA and a device is there */
  int gpu_mode = 0;
#if SBN_BENCH_HAVE_CUDA
  if (o.gpu == BENCH_GPU_OFF)
    snprintf(meta.why_cpu, sizeof meta.why_cpu, "--gpu off");
  else if (gpu_present(meta.why_cpu, sizeof meta.why_cpu))
    gpu_mode = gpu_probe(meta.why_cpu, sizeof meta.why_cpu);
  if (gpu_mode < 0) {
    fprintf(stderr, "%s: %s\n", argv[0], meta.why_cpu);
    return 1;
  }
#else
  snprintf(meta.why_cpu, sizeof meta.why_cpu,
           "this build has no CUDA (SYNCBN_CUDA=OFF or no nvcc at configure time)");
#endif
  if (!gpu_mode && o.gpu == BENCH_GPU_ON) {
    fprintf(stderr, "%s: --gpu on: %s\n", argv[0], meta.why_cpu);
    return 2;
  }
  int ro = resolve_opts(&o, gpu_mode, meta.why_cpu, argv[0]);
  if (ro) return ro;
  snprintf(meta.device, sizeof meta.device, "CPU team (ranks are host threads); not the GPU: %s",
           meta.why_cpu);

  /* shapes */
  static bench_shape_t shapes[BENCH_MAX_SHAPES];
  char* file_text = NULL;
  const char* text = (const char*)sbn_bench_shapes_tsv;
  meta.shapes_source = "bench/shapes.tsv (embedded)";
  if (o.shapes_file) {
    file_text = read_file(o.shapes_file);
    if (!file_text) {
      fprintf(stderr, "%s: cannot read %s: %s\n", argv[0], o.shapes_file, strerror(errno));
      return 2;
    }
    text = file_text;
    meta.shapes_source = o.shapes_file;
  }
  int nshapes = parse_shapes(text, meta.shapes_source, shapes, BENCH_MAX_SHAPES);
  free(file_text);
  if (nshapes < 0) return 2;
  if (o.only) {
    int kept = 0;
    for (int i = 0; i < nshapes; i++)
      if (list_has(o.only, shapes[i].id)) shapes[kept++] = shapes[i];
    if (kept == 0) return usage_error(argv[0], "--only '%s' names no shape", o.only);
    nshapes = kept;
  }
  meta.nshapes = nshapes;

  if (sbnGetVersion(&meta.version) != sbnSuccess) meta.version = -1;
  time_t now = time(NULL);
  struct tm tm_utc;
  gmtime_r(&now, &tm_utc);
  strftime(meta.date, sizeof meta.date, "%Y-%m-%dT%H:%M:%SZ", &tm_utc);
  meta.cores = sysconf(_SC_NPROCESSORS_ONLN);

#if SBN_BENCH_HAVE_CUDA
  if (gpu_mode) return gpu_main(argv[0], &o, shapes, nshapes, &meta, t_start);
#endif
  return cpu_main(argv[0], &o, shapes, nshapes, &meta, t_start);
}
