/* test_check.c — the bench's check of dweight and dbias (check.c) on the CPU team's
 * results: what a correct result gets, and what a wrong one does not.
 *
 * A team of 2 ranks, fp32 NCHW, N = 2, 4 channels of 2048 positions (8192 terms per team
 * sum), built so that each channel tests one thing:
 *   c0: dy = sign(x - mean) * a, a in [0.5, 1.5): dweight's terms all positive (no
 *       cancellation: sum |term| = |sum|);
 *   c1: dy = a > 0: dbias's terms all positive;
 *   c2: x ~ N(0, 1), dy ~ N(0, 1): both sums cancel (the bench's usual data);
 *   c3: x = 10000 + N(0, 1), dy = a: the fp32 save_mean is ~1e4 with an ulp of 1e-3, so a
 *       backward reference built from the exact mean differs from what the library computes
 *       from the fp32 save_mean it is given: dweight by sum(dy) * invstd * (mean -
 *       save_mean), ~1 here, far more than 1e-4 (1 + |ref|), and dx with it.
 * Checks: (1) the library's results pass (c3 fails a backward reference built from the
 * reference's own statistics, as check.c had it); (2) dweight off by 1e-4 relative on c0,
 * and dbias off by 1e-4 relative on c1, are each caught on every rank (the old rule,
 * 1e-4 (1 + |ref|), let both through).
 * And the inference rows' check (check_inference) on sbnForwardInference's host results,
 * fp32, bf16 and fp16, NCHW and NHWC: (3) they pass, every channel checked; (4) one y value
 * with its exponent's top bit flipped is one wrong, and (4b) fp16's y rounded through bf16
 * is wrong (fp16's tolerance, not bf16's); (5) a y computed without the running
 * statistics (the call given (0, 1)) is wrong everywhere; (6) a running_mean value changed
 * after the call (the call must only read them) is one wrong. And (7) GPU-mode options
 * that plan no row are refused (opts_resolve), as are the in-place epilogues with the split
 * or cudnn path, which they leave out by default.
 * And the in-place epilogue's check (--epilogue add-leaky-inplace: leaky ReLU, z, the
 * backward sbnBackwardInPlaceEx from y and z) on the CPU team's results, fp32 NCHW, the team
 * above with z ~ N(0, 1) and bufs_init's weights and biases, c0's dy = sign(x - mean) * a:
 * (8) they pass; (9) dweight off by 1e-4 relative on c0 is caught on every rank (its
 * bound, gamma(D + 10) * sum |g| (|act^-1(y)| + |z| + |bias|) / |weight|, is ~2e-5 of it
 * there); (10) a backward given zeros for z (the residual ignored in the recovery) is
 * caught in dx, and in dweight on every rank and channel with the right dx put back;
 * (11) one dz value wrong is one wrong. And (12) the latency table's exch only against a
 * W = 1 row of the same kernel. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h> /* dup, dup2: print_latency's output */

#include "bench.h"
#include "sbn_ref.h"

#define TW 2 /* ranks */
#define TN 2
#define TC 4
#define TSP 2048

static int failures = 0;
#define EXPECT(cond, ...)           \
  do {                              \
    if (!(cond)) {                  \
      printf("FAIL: " __VA_ARGS__); \
      printf("\n");                 \
      failures++;                   \
    }                               \
  } while (0)

/* Uniform in [0, 1) from a hash of (stream, i). */
static double unif(uint64_t stream, uint64_t i) {
  return (double)(splitmix64(stream * 0x9e3779b97f4a7c15ull ^ i) >> 11) / 9007199254740992.0;
}
/* Roughly N(0, 1): the sum of 12 uniforms minus 6. */
static double gauss(uint64_t stream, uint64_t i) {
  double s = -6.0;
  for (uint64_t k = 0; k < 12; k++) s += unif(stream, i * 12 + k);
  return s;
}

static int team_call(sbnComm_t* comms, bench_team_bufs_t* b, int fwd, const sbnParams_t* p) {
  if (sbnGroupStart() != sbnSuccess) return -1;
  for (int r = 0; r < TW; r++) {
    sbnResult_t res =
        fwd ? sbnForwardTrain(comms[r], &b->desc, b->x[r], b->y[r], b->weight, b->bias, b->rm[r],
                              b->rv[r], &b->nbt[r], b->save_mean[r], b->save_invstd[r], p, NULL)
            : sbnBackward(comms[r], &b->desc, b->x[r], b->dy[r], b->dx[r], b->weight,
                          b->save_mean[r], b->save_invstd[r], b->dweight[r], b->dbias[r], p, NULL);
    if (res != sbnSuccess) return -1;
  }
  return sbnGroupEnd() == sbnSuccess ? 0 : -1;
}

/* check_row on b as the GPU rows are checked (one forward + backward, team sums). */
static bench_row_t check(bench_team_bufs_t* b, const bench_shape_t* shape) {
  bench_row_t row;
  memset(&row, 0, sizeof row);
  row.shape = shape;
  row.spatial = TSP;
  row.dtype = sbnFloat32;
  row.layout = sbnLayoutNCHW;
  row.W = TW;
  row.path = BENCH_PATH_CPU;
  check_row(&row, b, 1, 0, NULL, sbnGradGlobal, &kCheckLibrary);
  return row;
}

/* parse_nvidia_driver on /proc/driver/nvidia/version's first line, and on what it is not. */
static int nvidia_driver_parsed(void) {
  char v[32];
  const char* line =
      "NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.159.04  Tue Oct  7 11:21:09 UTC 2025\n";
  if (parse_nvidia_driver(line, v, sizeof v) != 0 || strcmp(v, "580.159.04") != 0) {
    printf("FAIL: parse_nvidia_driver: '%s' from the driver's line\n", v);
    return 1;
  }
  if (parse_nvidia_driver("NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  570.86.15  "
                          "Release Build  (dvs-builder@U16)  Thu Jan  9 2025\n",
                          v, sizeof v) != 0 ||
      strcmp(v, "570.86.15") != 0) {
    printf("FAIL: parse_nvidia_driver: '%s' from the open kernel module's line\n", v);
    return 1;
  }
  if (parse_nvidia_driver("NVRM version: NVIDIA UNIX Kernel Module x\n", v, sizeof v) != -1 ||
      v[0] != '\0' || parse_nvidia_driver("", v, sizeof v) != -1 || v[0] != '\0' ||
      parse_nvidia_driver(NULL, v, sizeof v) != -1 ||
      parse_nvidia_driver(line, v, 5) != -1 || v[0] != '\0') {
    printf("FAIL: parse_nvidia_driver took a line without the version, or cut it\n");
    return 1;
  }
  return 0;
}

/* One y element's exponent top bit flipped (fp32 bit 30, 16-bit types bit 14): off by a
   factor of 2^128 (fp32, bf16) or 2^16 (fp16), or inf/NaN; undone by a second call. */
static void flip_exponent(void* y, sbnDataType_t t, int64_t i) {
  if (t == sbnFloat32)
    ((uint32_t*)y)[i] ^= 0x40000000u;
  else
    ((uint16_t*)y)[i] ^= 0x4000u;
}

static bench_row_t infer_check(bench_team_bufs_t* b, const bench_shape_t* shape) {
  bench_row_t row;
  memset(&row, 0, sizeof row);
  row.shape = shape;
  row.spatial = b->desc.spatial;
  row.dtype = b->desc.dtype;
  row.layout = b->desc.layout;
  row.W = 1;
  row.path = BENCH_PATH_CPU;
  row.inference = 1;
  check_inference(&row, b, 0, &kCheckLibrary); /* every channel */
  return row;
}

/* (3)-(6) for one dtype and layout; the number of failures. */
static int inference_checked(sbnDataType_t t, sbnLayout_t l) {
  static const bench_shape_t shape = {"I", 3, 45, 5, 7, "test_check.c (inference)"};
  const sbnTensorDesc_t d = {t, l, shape.n, shape.c, shape.h * shape.w};
  const int64_t numel = d.n * d.c * d.spatial;
  const sbnParams_t params = SBN_PARAMS_DEFAULT;
  const float eps = params.eps;
  const int before = failures;
  bench_team_bufs_t b;
  if (bufs_alloc(&b, 1, &d) != 0 || bufs_init(&b, shape.id) != 0) {
    printf("FAIL: out of memory\n");
    return 1;
  }
  infer_stats_fill(b.rm[0], b.rv[0], d.c);
  sbnResult_t res = sbnForwardInference(&d, b.x[0], b.y[0], b.weight, b.bias, b.rm[0], b.rv[0], eps, NULL);
  EXPECT(res == sbnSuccess, "sbnForwardInference on host memory: %s", sbnGetLastError(NULL));
  bench_row_t row = infer_check(&b, &shape);
  EXPECT(row.error[0] == '\0' && row.wrong == 0 && row.checked == numel + 2 * d.c,
         "inference %s %s: %lld wrong of %lld checked (expected 0 of %lld; worst %.3g: %s) %s",
         kDtypeNames[t], kLayoutNames[l], (long long)row.wrong, (long long)row.checked,
         (long long)(numel + 2 * d.c), row.worst, row.worst_what, row.error);
  printf("inference %s %s: %lld values checked, %lld wrong, worst %.3g of tolerance (%s)",
         kDtypeNames[t], kLayoutNames[l], (long long)row.checked, (long long)row.wrong, row.worst,
         row.worst_what);
  /* (4) one y value wrong: element (n 1, c 17, s 3) */
  const int64_t at = l == sbnLayoutNCHW ? (1 * d.c + 17) * d.spatial + 3 : (1 * d.spatial + 3) * d.c + 17;
  flip_exponent(b.y[0], t, at);
  row = infer_check(&b, &shape);
  EXPECT(row.wrong == 1 && strstr(row.worst_what, "y r0 c17") != NULL,
         "inference %s %s, one y value wrong: %lld wrong (expected 1), worst %s", kDtypeNames[t],
         kLayoutNames[l], (long long)row.wrong, row.worst_what);
  printf("; one y flipped: %lld wrong", (long long)row.wrong);
  flip_exponent(b.y[0], t, at);
  /* (4b) fp16: every y rounded through bf16 on the way (8 significant bits, as a conversion
     through the wrong type would): errors up to 2^-8 |y|, beyond fp16's 2e-3 (1 + |y|)
     where |y| is a few and the rounding near its half ulp (~4 % of these values); bf16's
     1e-2, which fp16 had, let every one through */
  if (t == sbnFloat16) {
    uint16_t* y = b.y[0];
    uint16_t* keep = malloc((size_t)numel * sizeof *keep);
    memcpy(keep, y, (size_t)numel * sizeof *keep);
    for (int64_t i = 0; i < numel; i++) {
      uint16_t bf;
      sbn_ref_store(&bf, sbnBFloat16, 0, sbn_ref_load(y, sbnFloat16, i));
      sbn_ref_store(y, sbnFloat16, i, sbn_ref_load(&bf, sbnBFloat16, 0));
    }
    row = infer_check(&b, &shape);
    EXPECT(row.wrong > numel / 100,
           "inference fp16 %s, y rounded through bf16: %lld wrong of %lld (expected > 1%%)",
           kLayoutNames[l], (long long)row.wrong, (long long)numel);
    printf("; y through bf16: %lld of %lld wrong", (long long)row.wrong, (long long)numel);
    memcpy(y, keep, (size_t)numel * sizeof *keep);
    free(keep);
  }
  /* (6) a running statistic the call changed */
  b.rm[0][5] += 0.25f;
  row = infer_check(&b, &shape);
  EXPECT(row.wrong == 1, "inference %s %s, running_mean[5] changed: %lld wrong (expected 1)",
         kDtypeNames[t], kLayoutNames[l], (long long)row.wrong);
  printf("; running_mean changed: %lld wrong", (long long)row.wrong);
  /* (5) y without the running statistics: the call given (0, 1), checked against them */
  bufs_reset_state(&b);
  res = sbnForwardInference(&d, b.x[0], b.y[0], b.weight, b.bias, b.rm[0], b.rv[0], eps, NULL);
  infer_stats_fill(b.rm[0], b.rv[0], d.c);
  row = infer_check(&b, &shape);
  EXPECT(res == sbnSuccess && row.wrong > numel * 9 / 10,
         "inference %s %s, y of running stats (0, 1): %lld wrong of %lld y values (expected > 90%%)",
         kDtypeNames[t], kLayoutNames[l], (long long)row.wrong, (long long)numel);
  printf("; y of running stats (0, 1): %lld of %lld wrong\n", (long long)row.wrong, (long long)numel);
  bufs_free(&b);
  return failures - before;
}

/* (12) The latency table's exch (print_latency, to a file here): empty(W) - empty(1) only
   where W = 1's empty op ran the same kernel on the same kind of team ('-' for small at W = 1
   against stream at W = 2, and for the nccl path's sbnCommInitAll team of one against its
   virtual team of two, both "host": neither difference is the exchange's), and each empty
   row's kernel. */
static void latency_exch(void) {
  static const bench_shape_t empty = {"empty", 0, 512, 1, 1, "test_check.c (latency)"};
  static const struct {
    int path;
    const char *k1, *k2, *note1, *note2;
    int exch; /* whether the W = 2 line shows the difference */
  } cases[] = {
      {BENCH_PATH_COOP, "small", "stream", "", "", 0},
      {BENCH_PATH_COOP, "stream", "stream", "", "", 1},
      {BENCH_PATH_NCCL, "host", "host", "sbnCommInitAll", "virtual", 0},
      {BENCH_PATH_NCCL, "host", "host", "virtual", "virtual", 1},
  };
  for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
    const int p = cases[c].path;
    bench_row_t lat[2 * 2 * 2];
    memset(lat, 0, sizeof lat);
    for (int W = 1; W <= 2; W++) {
      bench_row_t* r = lat_slot(lat, W, 1, p);
      r->shape = &empty;
      r->W = W;
      r->path = p;
      r->t[1].med = W == 1 ? 6.0 : 9.5; /* forward */
      r->t[0].med = W == 1 ? 5.0 : 8.0;
      const char* k = W == 1 ? cases[c].k1 : cases[c].k2;
      snprintf(r->kernel[1], sizeof r->kernel[1], "%s", k);
      snprintf(r->kernel[0], sizeof r->kernel[0], "%s", k);
      snprintf(r->note, sizeof r->note, "%s", W == 1 ? cases[c].note1 : cases[c].note2);
    }
    char buf[4096] = "";
    FILE* f = tmpfile();
    fflush(stdout);
    const int saved = dup(1);
    if (f == NULL || saved < 0 || dup2(fileno(f), 1) < 0) {
      EXPECT(0, "latency: no temporary file");
      return;
    }
    print_latency(lat, 2);
    fflush(stdout);
    dup2(saved, 1);
    close(saved);
    rewind(f);
    const size_t got = fread(buf, 1, sizeof buf - 1, f);
    buf[got] = '\0';
    fclose(f);
    char head[32];
    snprintf(head, sizeof head, "\n   2 %-5s", kPathNames[p]);
    const char* w2 = strstr(buf, head);
    EXPECT(w2 != NULL, "latency: no W = 2 %s line in:\n%s", kPathNames[p], buf);
    if (w2 == NULL) continue;
    char line[256];
    snprintf(line, sizeof line, "%.*s", (int)strcspn(w2 + 1, "\n"), w2 + 1);
    const int exch = strstr(line, "     3.5     3.0") != NULL,
              dash = strstr(line, "       -       -") != NULL;
    EXPECT(cases[c].exch ? exch : dash && !exch,
           "latency, %s %s/%s at W = 1/2: the W = 2 line is '%s'", kPathNames[p], cases[c].k1,
           cases[c].note1, line);
    EXPECT(strstr(line, cases[c].k2) != NULL, "latency: the W = 2 line names no kernel: '%s'",
           line);
    printf("latency exch, %s %s (%s) at W = 1: %s\n", kPathNames[p], cases[c].k1, cases[c].note1,
           line);
  }
}

/* GPU mode's options that plan no row (cuDNN's rows are W = 1's; an --epilogue run has no
   inference rows) are refused (exit status 2) before any work, where such a run checked
   nothing and said OK; the same with a 1 in -w, or without --epilogue, plan rows. */
static void no_row_refused(void) {
  static const struct {
    const char* args[8];
    int want;
  } cases[] = {{{"--paths", "cudnn", "-w", "2", "--epilogue", "relu"}, 2},
               {{"--paths", "cudnn", "-w", "2,4", "--epilogue", "add-relu"}, 2},
               {{"--paths", "cudnn", "-w", "1,2", "--epilogue", "relu"}, 0},
               {{"--paths", "cudnn", "-w", "2"}, 0}, /* cuDNN's inference rows */
               {{"--paths", "coop", "-w", "2", "--epilogue", "relu"}, 0},
               /* the in-place backward is the library's: no split or cudnn path */
               {{"--paths", "cudnn", "-w", "1", "--epilogue", "leaky-inplace"}, 2},
               {{"--paths", "coop,split", "--epilogue", "add-leaky-inplace"}, 2},
               {{"--paths", "coop,nccl", "-w", "1", "--epilogue", "add-leaky-inplace"}, 0}};
  for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
    char* argv[10] = {"sbn-bench"};
    int argc = 1;
    for (int i = 0; cases[k].args[i]; i++) argv[argc++] = (char*)cases[k].args[i];
    bench_opts_t o;
    memset(&o, 0, sizeof o);
    int rc = opts_parse(argc, argv, &o);
    if (rc == 0) rc = opts_resolve(&o, 1, "", "sbn-bench");
    EXPECT(rc == cases[k].want, "GPU options %s %s %s %s %s %s: %d, expected %d", argv[1], argv[2],
           argv[3], argv[4], argc > 5 ? argv[5] : "", argc > 6 ? argv[6] : "", rc, cases[k].want);
  }
  /* without --paths, an in-place epilogue runs coop and nccl only (relu's adds split, cudnn) */
  for (int e = BENCH_EPI_RELU; e < BENCH_EPI_COUNT; e++) {
    char* argv[4] = {"sbn-bench", "--epilogue", (char*)kEpilogueNames[e]};
    bench_opts_t o;
    memset(&o, 0, sizeof o);
    int rc = opts_parse(3, argv, &o);
    if (rc == 0) rc = opts_resolve(&o, 1, "", "sbn-bench");
    const int lib_only = epi_inplace(e);
    EXPECT(rc == 0 && o.path_on[BENCH_PATH_COOP] && o.path_on[BENCH_PATH_NCCL] &&
               o.path_on[BENCH_PATH_SPLIT] == !lib_only && o.path_on[BENCH_PATH_CUDNN] == !lib_only,
           "--epilogue %s's default paths: rc %d, coop %d nccl %d split %d cudnn %d",
           kEpilogueNames[e], rc, o.path_on[BENCH_PATH_COOP], o.path_on[BENCH_PATH_NCCL],
           o.path_on[BENCH_PATH_SPLIT], o.path_on[BENCH_PATH_CUDNN]);
  }
}

/* The in-place epilogue's ops on the CPU team (forward sbnForwardTrainEx with leaky ReLU and
   z, backward sbnBackwardInPlaceEx from y and zb: the forward's z, or not); 0 or -1. */
static int inplace_call(sbnComm_t* comms, bench_team_bufs_t* b, int fwd, const sbnParams_t* p,
                        void* const* zb) {
  sbnEpilogue_t epi = SBN_EPILOGUE_INITIALIZER;
  epi.activation = sbnActivationLeakyRelu;
  epi.slope = BENCH_LEAKY_SLOPE;
  if (sbnGroupStart() != sbnSuccess) return -1;
  for (int r = 0; r < TW; r++) {
    sbnResult_t res =
        fwd ? sbnForwardTrainEx(comms[r], &b->desc, b->x[r], b->z[r], b->y[r], b->weight, b->bias,
                                b->rm[r], b->rv[r], &b->nbt[r], b->save_mean[r], b->save_invstd[r],
                                p, &epi, NULL)
            : sbnBackwardInPlaceEx(comms[r], &b->desc, b->y[r], zb[r], b->dy[r], b->dx[r], b->dz[r],
                                   b->weight, b->bias, b->save_mean[r], b->save_invstd[r],
                                   b->dweight[r], b->dbias[r], p, &epi, NULL);
    if (res != sbnSuccess) return -1;
  }
  return sbnGroupEnd() == sbnSuccess ? 0 : -1;
}

/* (8)-(11); the number of failures. */
static int inplace_checked(const bench_shape_t* shape) {
  const sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, TN, TC, TSP};
  const int before = failures;
  bench_team_bufs_t b;
  if (bufs_alloc(&b, TW, &d) != 0 || bufs_alloc_epilogue(&b, BENCH_EPI_ADD_LEAKY_INPLACE) != 0 ||
      bufs_init(&b, shape->id) != 0) {
    printf("FAIL: out of memory\n");
    return 1;
  }
  float *zeros[TW] = {NULL}, *good_dx[TW] = {NULL};
  sbnComm_t comms[TW];
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  sbnParams_t params = SBN_PARAMS_DEFAULT;
  params.grad_mode = sbnGradGlobal;
  if (sbnCommInitCpu(comms, TW, &cfg) != sbnSuccess ||
      inplace_call(comms, &b, 1, &params, b.z) != 0) {
    printf("FAIL: the CPU team's forward with leaky ReLU and z: %s\n", sbnGetLastError(NULL));
    bufs_free(&b);
    return 1;
  }
  for (int r = 0; r < TW; r++) { /* c0: every term of dweight positive */
    const float* x = b.x[r];
    float* dy = b.dy[r];
    for (int64_t n = 0; n < TN; n++)
      for (int64_t s = 0; s < TSP; s++) {
        const double a = 0.5 + unif(40 + (uint64_t)r, (uint64_t)(n * TSP + s));
        dy[n * TC * TSP + s] = (float)(x[n * TC * TSP + s] >= b.save_mean[r][0] ? a : -a);
      }
  }
  for (int r = 0; r < TW; r++) {
    zeros[r] = calloc(TC * TN * TSP, sizeof(float));
    good_dx[r] = malloc(TC * TN * TSP * sizeof(float));
  }
  for (int mutant = 0; mutant < 2; mutant++) {
    if (!zeros[TW - 1] || !good_dx[TW - 1] ||
        inplace_call(comms, &b, 0, &params, mutant ? (void* const*)zeros : b.z) != 0) {
      EXPECT(0, "the CPU team's in-place backward (z %s): %s", mutant ? "zeros" : "the forward's",
             sbnGetLastError(NULL));
      break;
    }
    bench_row_t row;
    if (mutant) { /* (10): dx put back, so that dweight alone must show it */
      row = check(&b, shape);
      const int64_t all_wrong = row.wrong;
      for (int r = 0; r < TW; r++) memcpy(b.dx[r], good_dx[r], TC * TN * TSP * sizeof(float));
      row = check(&b, shape);
      EXPECT(all_wrong > TW * TC && row.wrong == TW * TC &&
                 strncmp(row.worst_what, "dweight r", 9) == 0,
             "a backward given zeros for z: %lld wrong (expected dx's and dweight's), with dx put "
             "back "
             "%lld (expected %d, dweight's), worst %s",
             (long long)all_wrong, (long long)row.wrong, TW * TC, row.worst_what);
      printf(
          "in place, z ignored in the backward: %lld wrong; with the right dx, %lld, worst %.3g of "
          "tolerance (%s)\n",
          (long long)all_wrong, (long long)row.wrong, row.worst, row.worst_what);
      break;
    }
    row = check(&b, shape);
    EXPECT(row.error[0] == '\0' && row.wrong == 0,
           "in place: %lld wrong (worst %.3g of tolerance: %s) %s", (long long)row.wrong, row.worst,
           row.worst_what, row.error); /* (8) */
    printf(
        "in place, correct results: %lld values checked, %lld wrong, worst %.3g of tolerance "
        "(%s)\n",
        (long long)row.checked, (long long)row.wrong, row.worst, row.worst_what);
    for (int r = 0; r < TW; r++) memcpy(good_dx[r], b.dx[r], TC * TN * TSP * sizeof(float));
    const float good = b.dweight[0][0]; /* (9) */
    for (int r = 0; r < TW; r++) b.dweight[r][0] = (float)(good * (1.0 + 1e-4));
    row = check(&b, shape);
    EXPECT(row.wrong == TW && strncmp(row.worst_what, "dweight r", 9) == 0,
           "in place, dweight c0 off by 1e-4 relative: %lld wrong (expected %d), worst %s",
           (long long)row.wrong, TW, row.worst_what);
    printf("in place, dweight c0 * (1 + 1e-4): %lld wrong, worst %.3g of tolerance (%s)\n",
           (long long)row.wrong, row.worst, row.worst_what);
    for (int r = 0; r < TW; r++) b.dweight[r][0] = good;
    /* (11) one dz value wrong: rank 1, element (n 1, c 2, s 7) */
    float* dz1 = b.dz[1];
    const int64_t at = (1 * TC + 2) * TSP + 7;
    const float dz_good = dz1[at];
    dz1[at] = dz_good + 0.5f;
    row = check(&b, shape);
    EXPECT(row.wrong == 1 && strncmp(row.worst_what, "dz r1 c2", 8) == 0,
           "in place, one dz value off by 0.5: %lld wrong (expected 1), worst %s",
           (long long)row.wrong, row.worst_what);
    printf("in place, one dz value off by 0.5: %lld wrong (%s)\n", (long long)row.wrong,
           row.worst_what);
    dz1[at] = dz_good;
  }
  for (int r = 0; r < TW; r++) {
    free(zeros[r]);
    free(good_dx[r]);
    sbnCommDestroy(comms[r]);
  }
  bufs_free(&b);
  return failures - before;
}

int main(void) {
  if (nvidia_driver_parsed() != 0) return 1;
  no_row_refused();
  static const sbnDataType_t kInferDtypes[3] = {sbnFloat32, sbnBFloat16, sbnFloat16};
  for (int t = 0; t < 3; t++)
    for (int l = 0; l < 2; l++) inference_checked(kInferDtypes[t], (sbnLayout_t)l);
  const int infer_failures = failures;
  latency_exch();
  static const bench_shape_t shape = {"T", TN, TC, TSP, 1, "test_check.c"};
  const sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, TN, TC, TSP};
  bench_team_bufs_t b;
  if (bufs_alloc(&b, TW, &d) != 0) return 1;
  for (int64_t c = 0; c < TC; c++) {
    b.weight[c] = 1.0f;
    b.bias[c] = 0.0f;
  }
  for (int r = 0; r < TW; r++) {
    float* x = b.x[r];
    for (int64_t n = 0; n < TN; n++)
      for (int64_t c = 0; c < TC; c++)
        for (int64_t s = 0; s < TSP; s++) {
          const int64_t i = (n * TC + c) * TSP + s;
          x[i] = (float)((c == 3 ? 10000.0 : 0.0) + gauss(10 + (uint64_t)r, (uint64_t)i));
        }
  }
  bufs_reset_state(&b);
  sbnComm_t comms[TW];
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  sbnParams_t params = SBN_PARAMS_DEFAULT;
  params.grad_mode = sbnGradGlobal;
  if (sbnCommInitCpu(comms, TW, &cfg) != sbnSuccess || team_call(comms, &b, 1, &params) != 0) {
    printf("FAIL: the CPU team's forward: %s\n", sbnGetLastError(NULL));
    return 1;
  }
  /* dy from the saved mean (the same bits on every rank) */
  for (int r = 0; r < TW; r++) {
    const float* x = b.x[r];
    float* dy = b.dy[r];
    for (int64_t n = 0; n < TN; n++)
      for (int64_t c = 0; c < TC; c++)
        for (int64_t s = 0; s < TSP; s++) {
          const int64_t i = (n * TC + c) * TSP + s;
          const double a = 0.5 + unif(20 + (uint64_t)r, (uint64_t)i);
          dy[i] = (float)(c == 0   ? (x[i] >= b.save_mean[r][c] ? a : -a)
                          : c == 2 ? gauss(30 + (uint64_t)r, (uint64_t)i)
                                   : a);
        }
  }
  if (team_call(comms, &b, 0, &params) != 0) {
    printf("FAIL: the CPU team's backward: %s\n", sbnGetLastError(NULL));
    return 1;
  }
  for (int r = 0; r < TW; r++) sbnCommDestroy(comms[r]);

  bench_row_t row = check(&b, &shape);
  EXPECT(row.error[0] == '\0', "check_row: %s", row.error);
  EXPECT(row.wrong == 0, "the CPU team's results: %lld wrong (worst %.3g of tolerance: %s)",
         (long long)row.wrong, row.worst, row.worst_what);
  printf("correct results: %lld values checked, %lld wrong, worst %.3g of tolerance (%s)\n",
         (long long)row.checked, (long long)row.wrong, row.worst, row.worst_what);

  /* a wrong team sum, 1e-4 relative, on every rank (the ranks still agree bitwise) */
  static const struct {
    const char* what;
    int64_t c;
  } wrong[2] = {{"dweight", 0}, {"dbias", 1}};
  for (int k = 0; k < 2; k++) {
    float** v = k == 0 ? b.dweight : b.dbias;
    const float good = v[0][wrong[k].c];
    for (int r = 0; r < TW; r++) v[r][wrong[k].c] = (float)(good * (1.0 + 1e-4));
    row = check(&b, &shape);
    char where[64];
    snprintf(where, sizeof where, "%s r", wrong[k].what);
    EXPECT(row.wrong == TW && strncmp(row.worst_what, where, strlen(where)) == 0,
           "%s of channel %lld off by 1e-4 relative: %lld wrong (expected %d), worst %s",
           wrong[k].what, (long long)wrong[k].c, (long long)row.wrong, TW, row.worst_what);
    printf("%s c%lld * (1 + 1e-4): %lld wrong, worst %.3g of tolerance (%s)\n", wrong[k].what,
           (long long)wrong[k].c, (long long)row.wrong, row.worst, row.worst_what);
    for (int r = 0; r < TW; r++) v[r][wrong[k].c] = good;
  }
  bufs_free(&b);
  static const bench_shape_t ishape = {"P", TN, TC, TSP, 1, "test_check.c (in place)"};
  const int inplace_failures = inplace_checked(&ishape);
  /* the team check's 3; 4 per inference dtype x layout, 5 for fp16's; in place 4; the
     latency table's 6 */
  const int cases = 3 + 6 * 4 + 2 + 4 + 6;
  printf("%d passed, %d failed (%d of them the inference checks, %d the in-place ones)\n",
         cases - (failures > cases ? cases : failures), failures, infer_failures, inplace_failures);
  return failures ? 1 : 0;
}
