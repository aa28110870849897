/* sbn-bench — times SyncBN forward and backward on real per-GPU shapes and checks every
 * result against the double-precision reference (tests/sbn_ref.c).
 *
 * For each shape of bench/shapes.tsv (embedded at build time; --shapes overrides) x dtype
 * x layout, every rank of a team of W holds that shape's tensor (N, C, H*W): the shapes
 * are per GPU. Each timed call is one group: sbnGroupStart; the op for ranks 0..W-1;
 * sbnGroupEnd. Time = median of -i calls after the warm-up. Then y, save_mean,
 * save_invstd, the running stats, dx, dweight and dbias are checked against the reference
 * on up to 16 channels spread over C, and so are the bitwise guarantees (every rank has
 * the same statistics; NCHW and NHWC of the same data give the same bits).
 *
 * This issue has no GPU path: the team is the CPU team (ranks are host threads).
 *
 *   sbn-bench                         W=2, scale 8, fp32+bf16, NCHW+NHWC, all shapes
 *   sbn-bench --scale 1 --only S5 -i 20 --json s5.json
 *
 * Exit status: 0 when every call succeeded and nothing was wrong, 1 otherwise, 2 on a
 * usage error.
 */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
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

#define BENCH_DEFAULT_RANKS 2
#define BENCH_DEFAULT_ITERS 5
#define BENCH_DEFAULT_WARMUP 1
#define BENCH_DEFAULT_SCALE 8
#define BENCH_CHECK_CHANNELS 16
#define BENCH_MAX_SHAPES 256
#define BENCH_MAX_WRONG_PRINTED 5

/* Tolerances |got - ref| <= atol + rtol*|ref| (DESIGN.md; what apex and PyTorch use to test
   SyncBN). Statistics are fp32 accumulations of exactly widened inputs whatever the dtype:
   1e-5. fp32 outputs and the fp32 gradient sums: 1e-4. fp16/bf16 outputs are stored
   rounded (bf16 keeps 8 significant bits: half an ulp is 2e-3 relative), so 1e-2 against
   the double reference of the ROUNDED inputs. */
#define TOL_STAT 1e-5
#define TOL_F32 1e-4
#define TOL_HALF 1e-2

/* ---- options, shapes, rows ------------------------------------------------------------ */
typedef struct {
  int ranks;
  int iters;
  int warmup;
  int scale;
  int check_channels; /* 0: every channel */
  const char* shapes_file;
  const char* json_file;
  const char* only;
  int dtype_on[3];  /* indexed by sbnDataType_t */
  int layout_on[2]; /* indexed by sbnLayout_t */
} bench_opts_t;

typedef struct {
  char id[32];
  int64_t n, c, h, w;
  char where[160];
} bench_shape_t;

/* One table row: shape x dtype x layout. */
typedef struct {
  const bench_shape_t* shape;
  int64_t spatial; /* H*W after --scale */
  sbnDataType_t dtype;
  sbnLayout_t layout;
  double us_fwd, us_bwd;
  double gbps_fwd, gbps_bwd;
  int64_t checked; /* values compared */
  int64_t wrong;   /* values outside tolerance, or bitwise guarantees broken */
  double worst;    /* largest |got - ref| / tolerance */
  char worst_what[96];
  char error[384]; /* non-empty: a call failed; the row was not checked */
} bench_row_t;

static const char* const kDtypeNames[3] = {"fp32", "fp16", "bf16"}; /* sbnDataType_t order */
static const char* const kLayoutNames[2] = {"NCHW", "NHWC"};        /* sbnLayout_t order */

static size_t dtype_size(sbnDataType_t t) {
  return t == sbnFloat32 ? 4 : 2;
}

static void usage(FILE* f, const char* argv0) {
  fprintf(f,
          "usage: %s [options]\n"
          "Times SyncBN forward + backward on per-GPU shapes and checks every result\n"
          "against the double-precision reference. This build runs the CPU team (ranks\n"
          "are host threads).\n"
          "  -w, --ranks N         ranks in the team (default %d)\n"
          "  -i, --iters N         timed calls per op; the median is reported (default %d)\n"
          "      --warmup N        untimed calls before them (default %d)\n"
          "      --scale S         divide each shape's H*W by S (kept >= 1; N, C kept);\n"
          "                        1 = full size (default %d)\n"
          "      --shapes FILE     shape table, lines 'id N C H W [where]', '#' comments;\n"
          "                        default: bench/shapes.tsv as embedded at build time\n"
          "      --only LIST       comma list of shape ids, e.g. S3,S5\n"
          "      --dtype LIST      comma list of fp32, bf16, fp16 (default fp32,bf16)\n"
          "      --layout LIST     comma list of NCHW, NHWC (default NCHW,NHWC)\n"
          "      --check-channels K  channels checked per row, spread over C; 0 = all\n"
          "                        (default %d)\n"
          "      --json FILE       also write the metadata and every row as JSON\n"
          "  -h, --help            this text\n"
          "Exit status: 0 all correct, 1 a wrong value or a failed call, 2 usage error.\n",
          argv0, BENCH_DEFAULT_RANKS, BENCH_DEFAULT_ITERS, BENCH_DEFAULT_WARMUP,
          BENCH_DEFAULT_SCALE, BENCH_CHECK_CHANNELS);
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

/* p: (N, C, spatial) in d's layout; element (ni, ci, si) = offset[ci] + scale[ci] * noise. */
static void fill_tensor(void* p, const sbnTensorDesc_t* d, uint64_t stream, const float* offset,
                        const float* scale) {
  const int64_t c = d->c, s = d->spatial;
  for (int64_t ni = 0; ni < d->n; ni++) {
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
    for (int r = 0; ok && r < W; r++) ok = ((*tensors[k])[r] = malloc(bytes)) != NULL;
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

/* Inputs: x ~ offset_c + scale_c * N(0,1), different per rank; dy ~ N(0,1); affine
   weight in [0.5, 1.5], bias in [-0.5, 0.5]; running stats start at (0, 1). */
static int bufs_init(bench_team_bufs_t* b, const char* shape_id) {
  const sbnTensorDesc_t* d = &b->desc;
  const uint64_t base = string_hash(shape_id);
  float* per_channel = malloc((size_t)d->c * 4 * sizeof(float));
  if (!per_channel) return -1;
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
  for (int r = 0; r < b->W; r++) {
    fill_tensor(b->x[r], d, base + 2 * (uint64_t)r, offset, scale);
    fill_tensor(b->dy[r], d, base + 2 * (uint64_t)r + 1, zero, one);
    for (int64_t ci = 0; ci < d->c; ci++) {
      b->rm[r][ci] = 0.0f;
      b->rv[r][ci] = 1.0f;
    }
    b->nbt[r] = 0;
  }
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

/* Runs one forward (fwd != 0) or backward over the whole team as one group. Returns the
   wall time in us, or -1 with err set. */
static double team_call(sbnComm_t* comms, bench_team_bufs_t* b, int fwd, char* err, size_t cap) {
  const sbnParams_t params = SBN_PARAMS_DEFAULT;
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
                            &b->nbt[r], b->save_mean[r], b->save_invstd[r], &params, NULL);
    else
      res = sbnBackward(comms[r], d, b->x[r], b->dy[r], b->dx[r], b->weight, b->save_mean[r],
                        b->save_invstd[r], b->dweight[r], b->dbias[r], &params, NULL);
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
static void check_value(bench_row_t* row, const char* what, int rank, int64_t ci, int64_t i,
                        double got, double ref, double tol_abs, double tol_rel) {
  double err = fabs(got - ref);
  double tol = tol_abs + tol_rel * fabs(ref);
  double used = err / tol;
  row->checked++;
  if (!(err <= tol)) {
    if (isnan(used)) used = INFINITY;
    if (row->wrong++ < BENCH_MAX_WRONG_PRINTED) {
      char elem[32] = "";
      if (i >= 0) snprintf(elem, sizeof elem, " element %" PRId64, i);
      fprintf(stderr,
              "# WRONG %s %s %s: %s rank %d channel %" PRId64
              "%s: got %.9g ref %.9g "
              "(|diff| %.3g > tol %.3g)\n",
              row->shape->id, kDtypeNames[row->dtype], kLayoutNames[row->layout], what, rank, ci,
              elem, got, ref, err, tol);
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
  for (int64_t i = 0; i < count; i++) {
    row->checked++;
    if (memcmp((const char*)got + (size_t)i * esize, (const char*)want + (size_t)i * esize,
               esize) != 0 &&
        row->wrong++ < BENCH_MAX_WRONG_PRINTED)
      fprintf(stderr, "# WRONG %s %s %s: %s differs bitwise at %" PRId64 "\n", row->shape->id,
              kDtypeNames[row->dtype], kLayoutNames[row->layout], what, i);
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
   same inputs) against sbn_ref on kmax channels spread over C (first and last included),
   and the bitwise guarantees. Out of memory sets row->error. */
static void check_row(bench_row_t* row, const bench_team_bufs_t* b, int calls, int kmax,
                      bench_layout_keep_t* keep) {
  const sbnTensorDesc_t* d = &b->desc;
  const int W = b->W;
  const int64_t C = d->c, S = d->spatial, n = d->n;
  const int64_t k = (kmax <= 0 || kmax >= C) ? C : kmax;
  const size_t es = dtype_size(d->dtype);
  const double tol_out = d->dtype == sbnFloat32 ? TOL_F32 : TOL_HALF;
  const int64_t pn = n * k * S; /* packed elements per rank */
  const sbnParams_t params = SBN_PARAMS_DEFAULT;
  int ok = 1;

  int64_t* chs = malloc((size_t)k * sizeof *chs);
  float* wk = malloc((size_t)k * 2 * sizeof(float));
  double* stat = malloc((size_t)k * 5 * sizeof(double)); /* mean, invstd, varu, rm, rv */
  void** xs = calloc((size_t)W * 2, sizeof(void*));
  double** outs = calloc((size_t)W * 4, sizeof(double*)); /* y, dx, dweight, dbias */
  sbnTensorDesc_t* descs = malloc((size_t)W * sizeof *descs);
  ok = chs && wk && stat && xs && outs && descs;
  for (int r = 0; ok && r < W; r++) {
    ok = (xs[r] = malloc((size_t)pn * es)) && (xs[W + r] = malloc((size_t)pn * es)) &&
         (outs[r] = malloc((size_t)pn * sizeof(double))) &&
         (outs[W + r] = malloc((size_t)pn * sizeof(double))) &&
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
         *rv = stat + 4 * k;
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
                   invstd, outs + W, outs + 2 * W, outs + 3 * W, NULL, NULL);

  for (int r = 0; r < W; r++) {
    for (int64_t j = 0; j < k; j++) {
      int64_t ci = chs[j];
      check_value(row, "save_mean", r, ci, -1, b->save_mean[r][ci], mean[j], TOL_STAT, TOL_STAT);
      check_value(row, "save_invstd", r, ci, -1, b->save_invstd[r][ci], invstd[j], TOL_STAT,
                  TOL_STAT);
      check_value(row, "running_mean", r, ci, -1, b->rm[r][ci], rm[j], TOL_STAT, TOL_STAT);
      check_value(row, "running_var", r, ci, -1, b->rv[r][ci], rv[j], TOL_STAT, TOL_STAT);
      check_value(row, "dweight", r, ci, -1, b->dweight[r][ci], outs[2 * W + r][j], TOL_F32,
                  TOL_F32);
      check_value(row, "dbias", r, ci, -1, b->dbias[r][ci], outs[3 * W + r][j], TOL_F32, TOL_F32);
      for (int64_t ni = 0; ni < n; ni++)
        for (int64_t si = 0; si < S; si++) {
          int64_t i = sbn_ref_index(d, ni, ci, si), pi = (ni * k + j) * S + si;
          check_value(row, "y", r, ci, i, sbn_ref_load(b->y[r], d->dtype, i), outs[r][pi], tol_out,
                      tol_out);
          check_value(row, "dx", r, ci, i, sbn_ref_load(b->dx[r], d->dtype, i), outs[W + r][pi],
                      tol_out, tol_out);
        }
    }
    row->checked++;
    if (b->nbt[r] != calls && row->wrong++ < BENCH_MAX_WRONG_PRINTED)
      fprintf(stderr, "# WRONG %s: rank %d num_batches_tracked %" PRId64 ", expected %d\n",
              row->shape->id, r, b->nbt[r], calls);
    /* Every rank holds bitwise-identical statistics. */
    if (r > 0) {
      check_bitwise(row, "save_mean (rank vs rank 0)", C, b->save_mean[r], b->save_mean[0], 4);
      check_bitwise(row, "save_invstd (rank vs rank 0)", C, b->save_invstd[r], b->save_invstd[0],
                    4);
      check_bitwise(row, "running_mean (rank vs rank 0)", C, b->rm[r], b->rm[0], 4);
      check_bitwise(row, "running_var (rank vs rank 0)", C, b->rv[r], b->rv[0], 4);
    }
  }

  /* NCHW and NHWC of the same data: the same bits. The NCHW row keeps, the NHWC row compares. */
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

/* One row: allocate, fill, time forward then backward, check. */
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
  for (int fwd = 1; fwd >= 0; fwd--) {
    for (int it = 0; it < o->warmup + o->iters; it++) {
      double t = team_call(comms, &b, fwd, row->error, sizeof row->error);
      if (t < 0) goto out;
      if (it >= o->warmup) times[it - o->warmup] = t;
    }
    double us = median(times, o->iters);
    if (fwd) {
      row->us_fwd = us;
      row->gbps_fwd = 2.0 * elems * es / (us * 1e3); /* read x, write y */
    } else {
      row->us_bwd = us;
      row->gbps_bwd = 3.0 * elems * es / (us * 1e3); /* read x, dy; write dx */
    }
  }
  check_row(row, &b, o->warmup + o->iters, o->check_channels, keep);
out:
  free(times);
  bufs_free(&b);
}

/* ---- output ------------------------------------------------------------------------- */
typedef struct {
  int version; /* sbnGetVersion */
  char date[32];
  long cores;
  const char* shapes_source;
  int nshapes;
  double total_s;
} bench_meta_t;

static const char* kDevice = "CPU team (ranks are host threads; GPU paths come in later issues)";
static const char* kBytesFormula =
    "per rank: fwd = 2*numel*elem_size (read x, write y); bwd = 3*numel*elem_size (read x and "
    "dy, write dx); numel = N*C*spatial; GB/s = bytes / median time";

static void print_header(const bench_opts_t* o, const bench_meta_t* m) {
  printf("# sbn-bench  syncbn %d.%d.%d (header %d.%d.%d)  commit %s  %s\n", m->version / 10000,
         m->version / 100 % 100, m->version % 100, SBN_VERSION_MAJOR, SBN_VERSION_MINOR,
         SBN_VERSION_PATCH, SBN_BENCH_COMMIT, m->date);
  printf("# device: %s\n", kDevice);
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
  printf("# %5s %5s %6s %8s %5s %6s %5s %11s %8s %11s %8s %7s %8s\n", "shape", "N", "C", "spatial",
         "dtype", "layout", "ranks", "time(us)", "GB/s", "time(us)", "GB/s", "#wrong", "tol used");
}

static void print_row(const bench_row_t* r, int ranks) {
  printf("  %5s %5" PRId64 " %6" PRId64 " %8" PRId64 " %5s %6s %5d", r->shape->id, r->shape->n,
         r->shape->c, r->spatial, kDtypeNames[r->dtype], kLayoutNames[r->layout], ranks);
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
  json_string(f, kDevice);
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
    fprintf(f, ", \"us_fwd\": ");
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

/* ---- main --------------------------------------------------------------------------- */
static int parse_args(int argc, char** argv, bench_opts_t* o) {
  o->ranks = BENCH_DEFAULT_RANKS;
  o->iters = BENCH_DEFAULT_ITERS;
  o->warmup = BENCH_DEFAULT_WARMUP;
  o->scale = BENCH_DEFAULT_SCALE;
  o->check_channels = BENCH_CHECK_CHANNELS;
  o->dtype_on[sbnFloat32] = o->dtype_on[sbnBFloat16] = 1;
  o->layout_on[sbnLayoutNCHW] = o->layout_on[sbnLayoutNHWC] = 1;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout, argv[0]);
      return 1;
    }
    /* every other option takes a value: "--opt value" or "--opt=value" */
    static const char* const known[] = {
        "-w",       "--ranks", "-i",     "--iters", "--warmup", "--scale", "--check-channels",
        "--shapes", "--json",  "--only", "--dtype", "--layout"};
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
      if (parse_int(val, 1, 1024, &o->ranks)) return usage_error(argv[0], "bad -w '%s'", val);
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
    } else {
      return usage_error(argv[0], "unknown option '%s'", name);
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  bench_opts_t o;
  memset(&o, 0, sizeof o);
  int pa = parse_args(argc, argv, &o);
  if (pa == 1) return 0; /* -h */
  if (pa) return pa;
  const double t_start = now_us();

  /* shapes */
  static bench_shape_t shapes[BENCH_MAX_SHAPES];
  char* file_text = NULL;
  const char* text = (const char*)sbn_bench_shapes_tsv;
  bench_meta_t meta;
  memset(&meta, 0, sizeof meta);
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

  /* rows */
  int nrows = 0;
  bench_row_t* rows = calloc((size_t)nshapes * 6, sizeof *rows);
  if (!rows) return 1;
  int64_t max_c = 1;
  for (int s = 0; s < nshapes; s++) {
    if (shapes[s].c > max_c) max_c = shapes[s].c;
    int64_t spatial = shapes[s].h * shapes[s].w / o.scale;
    for (int t = 0; t < 3; t++) {
      static const sbnDataType_t order[3] = {sbnFloat32, sbnBFloat16, sbnFloat16};
      if (!o.dtype_on[order[t]]) continue;
      for (int l = 0; l < 2; l++) {
        if (!o.layout_on[l]) continue;
        bench_row_t* r = &rows[nrows++];
        r->shape = &shapes[s];
        r->spatial = spatial > 0 ? spatial : 1;
        r->dtype = order[t];
        r->layout = (sbnLayout_t)l;
      }
    }
  }

  /* the team */
  sbnComm_t* comms = calloc((size_t)o.ranks, sizeof *comms);
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  if (max_c > cfg.max_channels) cfg.max_channels = max_c;
  sbnResult_t res = comms ? sbnCommInitCpu(comms, o.ranks, &cfg) : sbnSystemError;
  if (res != sbnSuccess) {
    fprintf(stderr, "%s: sbnCommInitCpu(%d ranks): %s: %s\n", argv[0], o.ranks,
            sbnGetResultName(res), sbnGetLastError(NULL));
    free(comms);
    free(rows);
    return 1;
  }
  if (sbnGetVersion(&meta.version) != sbnSuccess) meta.version = -1;
  time_t now = time(NULL);
  struct tm tm_utc;
  gmtime_r(&now, &tm_utc);
  strftime(meta.date, sizeof meta.date, "%Y-%m-%dT%H:%M:%SZ", &tm_utc);
  meta.cores = sysconf(_SC_NPROCESSORS_ONLN);

  print_header(&o, &meta);
  bench_layout_keep_t keep;
  memset(&keep, 0, sizeof keep);
  int64_t wrong = 0, checked = 0;
  int failed = 0;
  const bench_row_t* worst = NULL;
  for (int i = 0; i < nrows; i++) {
    run_row(&rows[i], comms, &o, &keep);
    print_row(&rows[i], o.ranks);
    wrong += rows[i].wrong;
    checked += rows[i].checked;
    failed += rows[i].error[0] != 0;
    if (!rows[i].error[0] && (!worst || rows[i].worst > worst->worst)) worst = &rows[i];
  }
  keep_free(&keep);
  for (int r = 0; r < o.ranks; r++) sbnCommDestroy(comms[r]);
  free(comms);
  meta.total_s = (now_us() - t_start) * 1e-6;

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
  printf("\n# total time %.1f s\n", meta.total_s);
  int status = (wrong == 0 && failed == 0) ? 0 : 1;
  if (o.json_file) {
    if (write_json(o.json_file, &o, &meta, rows, nrows, wrong, failed) != 0) {
      fprintf(stderr, "%s: cannot write %s: %s\n", argv[0], o.json_file, strerror(errno));
      status = 1;
    } else {
      printf("# json: %s\n", o.json_file);
    }
  }
  printf("# %s\n", status == 0 ? "OK" : "FAILED");
  free(rows);
  return status;
}
