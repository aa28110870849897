/* Consumer of an installed syncbn: links, asks the version, runs a one-rank CPU forward
 * and checks that each channel of y has mean ~0 and variance ~1. Exit 0 on success. */
#include <math.h>
#include <stdio.h>

#include <syncbn.h>

#define N 2
#define C 3
#define SPATIAL 5

int main(void) {
  int version = 0;
  sbnResult_t res = sbnGetVersion(&version);
  if (res != sbnSuccess || version != SBN_VERSION_CODE) {
    fprintf(stderr, "sbnGetVersion: %s, version %d, header %d\n", sbnGetResultName(res), version,
            SBN_VERSION_CODE);
    return 1;
  }

  sbnComm_t comm;
  res = sbnCommInitCpu(&comm, 1, NULL);
  if (res != sbnSuccess) {
    fprintf(stderr, "sbnCommInitCpu: %s: %s\n", sbnGetResultName(res), sbnGetLastError(NULL));
    return 1;
  }
  float x[N * C * SPATIAL], y[N * C * SPATIAL]; /* (N, C, spatial) */
  for (int i = 0; i < N * C * SPATIAL; i++) x[i] = (float)((i * 7) % 11) - 3.0f;
  float save_mean[C], save_invstd[C];
  const sbnTensorDesc_t desc = {sbnFloat32, sbnLayoutNCHW, N, C, SPATIAL};
  /* W == 1: no group needed. affine=False, no running stats. */
  res = sbnForwardTrain(comm, &desc, x, y, NULL, NULL, NULL, NULL, NULL, save_mean, save_invstd,
                        NULL, NULL);
  if (res != sbnSuccess) {
    fprintf(stderr, "sbnForwardTrain: %s: %s\n", sbnGetResultName(res), sbnGetLastError(comm));
    sbnCommDestroy(comm);
    return 1;
  }
  int bad = 0;
  for (int c = 0; c < C; c++) {
    double sum = 0, sq = 0;
    for (int n = 0; n < N; n++)
      for (int s = 0; s < SPATIAL; s++) {
        double v = y[(n * C + c) * SPATIAL + s];
        sum += v;
        sq += v * v;
      }
    double mean = sum / (N * SPATIAL), var = sq / (N * SPATIAL) - mean * mean;
    /* eps = 1e-5 against variances of order 10: var(y) = var/(var+eps) ~ 1 - 1e-6 */
    if (fabs(mean) > 1e-5 || fabs(var - 1.0) > 1e-4) {
      fprintf(stderr, "channel %d: mean %g var %g\n", c, mean, var);
      bad = 1;
    }
  }
  sbnCommDestroy(comm);
  printf("syncbn %d.%d.%d: one-rank forward %s\n", version / 10000, version / 100 % 100,
         version % 100, bad ? "WRONG" : "ok");
  return bad;
}
