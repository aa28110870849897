/* timing.c — clocks and statistics of the timed calls: the wall clock of the CPU team's
 * ops, median / min / p90 of any path's samples (gpu.c times GPU ops with CUDA events). */
#include <stdlib.h>
#include <time.h>

#include "bench.h"

double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

double median(double* v, int n) {
  qsort(v, (size_t)n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void times_stats(double* v, int n, double* med, double* mn, double* p90) {
  *med = median(v, n);
  *mn = v[0];
  int i90 = (9 * n + 9) / 10 - 1; /* ceil(0.9 n) - 1, in integers */
  *p90 = v[i90 < 0 ? 0 : i90];
}

int time_wall(bench_op_fn op, void* ctx, int fwd, const bench_opts_t* o, double* samples, char* err,
              size_t cap) {
  for (int it = 0; it < o->warmup + o->iters; it++) {
    double t = op(ctx, fwd, err, cap);
    if (t < 0) return -1;
    if (it >= o->warmup) samples[it - o->warmup] = t;
  }
  return 0;
}

void times_set(bench_times_t* t, double* op_us, double* host_us, int iters) {
  times_stats(op_us, iters, &t->med, &t->min, &t->p90);
  t->host_med = median(host_us, iters);
}

void row_set_times(bench_row_t* row, int fwd, double* op_us, double* host_us, int iters) {
  times_set(&row->t[fwd], op_us, host_us, iters);
}
