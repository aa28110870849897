/* cpu_group.c — synchronized BatchNorm on a CPU team driven from ONE thread (group mode).
 *
 * A team of W = 2 ranks, each with a batch of its own (fp32, NCHW, N = 2 and 3): one
 * training forward and one backward, each queued for every rank between sbnGroupStart
 * and sbnGroupEnd; sbnGroupEnd runs the ranks on threads and returns when all are done.
 * Then every output is checked against the same math done here in double precision over
 * the whole team's batch (what syncing means: each rank is normalized with the statistics
 * of all ranks), to the library's tolerances |got - want| <= atol + rtol * |want|:
 * 1e-5 for statistics, 1e-4 for y, dx, dweight and dbias. Exit 0 when all hold, 1 if not.
 *
 * Build against an installed syncbn (docs/USAGE.md, "Linking"):
 *   cc cpu_group.c $(pkg-config --cflags --libs syncbn-static)
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <syncbn.h>

enum { W = 2, C = 3, S = 5 };            /* ranks, channels, spatial size (H * W) */
static const int64_t kN[W] = {2, 3};     /* each rank's batch: ranks may differ */
static const float kWeight[C] = {1.0f, 2.0f, 0.5f}, kBias[C] = {0.0f, -1.0f, 3.0f};

/* rank r's tensors, (N, C, S): x[r][(n * C + c) * S + s] */
static float *x[W], *y[W], *dy[W], *dx[W];
/* rank r's per-channel values */
static float running_mean[W][C], running_var[W][C], save_mean[W][C], save_invstd[W][C];
static float dweight[W][C], dbias[W][C];
static int64_t num_batches_tracked[W];

/* Inputs: channel c of x spread around c (so the channels' statistics differ), dy. */
static void make_inputs(void) {
  unsigned state = 12345u;
  for (int r = 0; r < W; r++) {
    size_t len = (size_t)(kN[r] * C * S);
    x[r] = malloc(len * sizeof(float)), y[r] = malloc(len * sizeof(float));
    dy[r] = malloc(len * sizeof(float)), dx[r] = malloc(len * sizeof(float));
    if (!x[r] || !y[r] || !dy[r] || !dx[r]) {
      fprintf(stderr, "out of memory\n");
      exit(1);
    }
    for (size_t i = 0; i < len; i++) {
      int c = (int)(i / S % C);
      state = state * 1103515245u + 12345u;
      double u = (double)(state >> 8) / (1 << 24) * 2.0 - 1.0; /* in [-1, 1) */
      x[r][i] = (float)((c + 1) * u + c);
      dy[r][i] = (float)(0.5 * u * u - 0.2 * c);
      y[r][i] = dx[r][i] = NAN; /* an output left unwritten fails the checks */
    }
    for (int c = 0; c < C; c++) running_mean[r][c] = 0.0f, running_var[r][c] = 1.0f;
  }
}

static int failures;
static void expect_near(const char* what, int r, int64_t i, double got, double want, double tol) {
  if (fabs(got - want) <= tol + tol * fabs(want)) return; /* false for NaN too */
  if (failures++ < 10)
    fprintf(stderr, "rank %d: %s[%lld] = %.9g, expected %.9g\n", r, what, (long long)i, got, want);
}

/* Each channel's statistics over all ranks, then every output of every rank. */
static void check_team(void) {
  const double eps = 1e-5, momentum = 0.1;
  for (int c = 0; c < C; c++) {
    double m = 0, sum = 0, sq = 0, sum_dy = 0, sum_dy_xmu = 0;
    for (int r = 0; r < W; r++)
      for (int64_t n = 0; n < kN[r]; n++)
        for (int s = 0; s < S; s++) sum += x[r][(n * C + c) * S + s], m++;
    const double mean = sum / m;
    for (int r = 0; r < W; r++)
      for (int64_t n = 0; n < kN[r]; n++)
        for (int s = 0; s < S; s++) {
          const int64_t i = (n * C + c) * S + s;
          sq += (x[r][i] - mean) * (x[r][i] - mean);
          sum_dy += dy[r][i];
          sum_dy_xmu += dy[r][i] * (x[r][i] - mean);
        }
    const double var = sq / m, invstd = 1.0 / sqrt(var + eps), w = kWeight[c], b = kBias[c];
    double dweight_team = 0, dbias_team = 0; /* sbnGradLocal: the ranks' parts add up */
    for (int r = 0; r < W; r++) {
      expect_near("save_mean", r, c, save_mean[r][c], mean, 1e-5);
      expect_near("save_invstd", r, c, save_invstd[r][c], invstd, 1e-5);
      expect_near("running_mean", r, c, running_mean[r][c], momentum * mean, 1e-5);
      expect_near("running_var", r, c, running_var[r][c],
                  (1 - momentum) * 1.0 + momentum * var * m / (m - 1), 1e-5); /* unbiased */
      for (int64_t n = 0; n < kN[r]; n++)
        for (int s = 0; s < S; s++) {
          const int64_t i = (n * C + c) * S + s;
          const double xhat = (x[r][i] - mean) * invstd;
          expect_near("y", r, i, y[r][i], xhat * w + b, 1e-4);
          expect_near("dx", r, i, dx[r][i],
                      w * invstd * (dy[r][i] - sum_dy / m - xhat * invstd * sum_dy_xmu / m), 1e-4);
        }
      dweight_team += dweight[r][c], dbias_team += dbias[r][c];
    }
    expect_near("dweight (sum over ranks)", -1, c, dweight_team, sum_dy_xmu * invstd, 1e-4);
    expect_near("dbias (sum over ranks)", -1, c, dbias_team, sum_dy, 1e-4);
  }
  for (int r = 0; r < W; r++)
    if (num_batches_tracked[r] != 1) {
      fprintf(stderr, "rank %d: num_batches_tracked %lld, expected 1\n", r,
              (long long)num_batches_tracked[r]);
      failures++;
    }
}

int main(void) {
  make_inputs();
  sbnComm_t comms[W];
  sbnResult_t res = sbnCommInitCpu(comms, W, NULL); /* NULL: the default config */
  if (res != sbnSuccess) {
    fprintf(stderr, "sbnCommInitCpu: %s\n", sbnGetLastError(NULL));
    return 1;
  }
  const sbnParams_t params = SBN_PARAMS_DEFAULT; /* eps 1e-5, momentum 0.1, local grads */
  sbnTensorDesc_t desc[W];
  for (int r = 0; r < W; r++) desc[r] = (sbnTensorDesc_t){sbnFloat32, sbnLayoutNCHW, kN[r], C, S};

  sbnGroupStart();
  for (int r = 0; r < W; r++) /* validated now, queued */
    sbnForwardTrain(comms[r], &desc[r], x[r], y[r], kWeight, kBias, running_mean[r],
                    running_var[r], &num_batches_tracked[r], save_mean[r], save_invstd[r],
                    &params, NULL);
  res = sbnGroupEnd(); /* runs the ranks on threads, returns when they are done */
  if (res != sbnSuccess) fprintf(stderr, "forward: %s\n", sbnGetLastError(NULL));

  if (res == sbnSuccess) {
    sbnGroupStart();
    for (int r = 0; r < W; r++)
      sbnBackward(comms[r], &desc[r], x[r], dy[r], dx[r], kWeight, save_mean[r],
                  save_invstd[r], dweight[r], dbias[r], &params, NULL);
    res = sbnGroupEnd();
    if (res != sbnSuccess) fprintf(stderr, "backward: %s\n", sbnGetLastError(NULL));
  }
  for (int r = 0; r < W; r++) sbnCommDestroy(comms[r]);

  if (res == sbnSuccess) check_team();
  printf("cpu_group: %d ranks, forward and backward: %s\n", W,
         res != sbnSuccess ? sbnGetResultName(res) : failures ? "WRONG" : "ok");
  for (int r = 0; r < W; r++) free(x[r]), free(y[r]), free(dy[r]), free(dx[r]);
  return res == sbnSuccess && failures == 0 ? 0 : 1;
}
