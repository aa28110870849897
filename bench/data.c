/* data.c — the inputs: a team's host buffers and their deterministic contents (a hash of
 * each element's logical index, so NCHW and NHWC hold the same data and rank r's data do
 * not depend on W). */
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "bench.h"
#include "bn_dtype.h"

size_t dtype_size(sbnDataType_t t) {
  return t == sbnFloat32 ? 4 : 2;
}

size_t tensor_bytes(const sbnTensorDesc_t* d) {
  return (size_t)(d->n * d->c * d->spatial) * dtype_size(d->dtype);
}

sbnTensorDesc_t row_desc(const bench_row_t* r) {
  sbnTensorDesc_t d = {r->dtype, r->layout, r->shape->n, r->shape->c, r->spatial};
  return d;
}

void* bmalloc(size_t bytes) {
  return malloc(bytes ? bytes : 1);
}

uint64_t splitmix64(uint64_t z) {
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
  switch (t) {
#define SBN_DT_PUT_(value, bytes, name, tag, bits) \
  case value: sbn_##tag##_put(p, i, v); break;
    SBN_DTYPES(SBN_DT_PUT_)
#undef SBN_DT_PUT_
  }
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

double bufs_bytes(int W, const sbnTensorDesc_t* d) {
  const double tensor = (double)d->n * (double)d->c * (double)d->spatial * dtype_size(d->dtype);
  /* x, y, dy, dx of every rank; per channel: 6 arrays per rank, weight, bias, and the 4 of
     bufs_init (offset, scale, zero, one) */
  return 4.0 * W * tensor + (6.0 * W + 6.0) * (double)d->c * sizeof(float);
}

void bufs_free(bench_team_bufs_t* b) {
  void** per_rank[] = {b->x, b->y, b->dy, b->dx, b->z, b->dz};
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

int bufs_alloc(bench_team_bufs_t* b, int W, const sbnTensorDesc_t* d) {
  memset(b, 0, sizeof *b);
  b->W = W;
  b->desc = *d;
  size_t bytes = tensor_bytes(d);
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

int bufs_alloc_epilogue(bench_team_bufs_t* b, int epilogue) {
  const size_t bytes = tensor_bytes(&b->desc);
  b->epilogue = epilogue;
  if (!epi_has_dz(epilogue)) return 0;
  int ok = (b->dz = calloc((size_t)b->W, sizeof(void*))) != NULL;
  if (ok && epi_has_z(epilogue)) ok = (b->z = calloc((size_t)b->W, sizeof(void*))) != NULL;
  for (int r = 0; ok && r < b->W; r++)
    ok = (b->dz[r] = bmalloc(bytes)) != NULL && (!b->z || (b->z[r] = bmalloc(bytes)) != NULL);
  if (!ok) {
    bufs_free(b);
    return -1;
  }
  return 0;
}

void bufs_reset_state(bench_team_bufs_t* b) {
  for (int r = 0; r < b->W; r++) {
    for (int64_t ci = 0; ci < b->desc.c; ci++) {
      b->rm[r][ci] = 0.0f;
      b->rv[r][ci] = 1.0f;
    }
    b->nbt[r] = 0;
  }
}

/* Inputs: x ~ offset_c + scale_c * N(0,1), different per rank (rank r's data do not depend
   on W); dy ~ N(0,1); z (add-relu, add-leaky-inplace) ~ N(0,1); affine weight in [0.5, 1.5],
   bias in [-0.5, 0.5]; running stats start at (0, 1). */
int bufs_init(bench_team_bufs_t* b, const char* shape_id) {
  const sbnTensorDesc_t* d = &b->desc;
  const uint64_t base = string_hash(shape_id);
  float* per_channel = malloc((size_t)d->c * 4 * sizeof(float));
  /* jobs of about 2^20 elements (whole samples) */
  int64_t per_sample = d->c * d->spatial;
  int64_t step = per_sample >= (1 << 20) ? 1 : (1 << 20) / per_sample;
  int64_t chunks = d->n == 0 ? 0 : (d->n + step - 1) / step;
  fill_job_t* jobs = malloc((size_t)(3 * b->W * chunks + 1) * sizeof *jobs);
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
      if (b->z) { /* a stream of its own: x and dy keep theirs whatever the epilogue */
        fill_job_t jz = {b->z[r], d, base ^ (0x7a5e0000ull + (uint64_t)r), zero, one, n0, n1};
        jobs[njobs++] = jz;
      }
    }
  fill_run(jobs, njobs);
  bufs_reset_state(b);
  free(jobs);
  free(per_channel);
  return 0;
}

const char* const kInferStatsFormula =
    "running_mean[c] = 0.1 * ((c mod 41) - 20), running_var[c] = 1 + 0.05 * (c mod 37) (as fp32), "
    "eps 1e-5, weight and bias the training rows'";

void infer_stats_fill(float* rm, float* rv, int64_t c) {
  for (int64_t ci = 0; ci < c; ci++) {
    rm[ci] = (float)(0.1 * (double)(ci % 41 - 20));
    rv[ci] = (float)(1.0 + 0.05 * (double)(ci % 37));
  }
}
