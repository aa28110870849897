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
 * there), (9b) right at 0.7 times that bound and wrong at 1.5 times; (10) a backward given
 * zeros for z (the residual ignored in the recovery) is caught in dx, and in dweight on every
 * rank and channel with the right dx put back;
 * (11) one dz value wrong is one wrong. And (12) the latency table's exch only against a
 * W = 1 row of the same kernel.
 * On the team's right results, each kind of value made wrong where the check looks: (13) a
 * NaN in y (wrong, the worst infinite), (14) one y value, (15) each statistic (save_mean,
 * save_invstd, running_mean, running_var) of one channel on every rank, (16)
 * num_batches_tracked, (17) one rank's save_mean or team dweight one ulp from rank 0's
 * (bitwise), (18) a y in the last channel with --check-channels 2, (19) dweight and dbias at
 * 0.7 (right) and 1.5 (wrong) times their bound, (20) cuDNN's tolerances (the running
 * statistics not compared), (21) the nccl rows' digests (one ulp in one rank's dbias); and
 * (4c) the digests see the last element of a y whose bytes are no whole number of words,
 * and (4d) the inference check with --check-channels 2 looks at the last channel.
 * And what the verdicts read: (22) the floors and the inference rows' x copy (op_derived,
 * infer_derived) against the definition, (23) the totals (results_add), the table's % of
 * floor and t/coop columns, the footer's inference target count and median t_path / t_coop,
 * (24) the JSON's wrong, error, ok, bytes_x_total, l2_bytes, kernels, t_over_coop, and no
 * bare inf. */
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

/* check_row on b (fp32, b's layout) as the GPU rows are checked (one forward + backward,
   team sums), on kmax channels (0: all) at how's tolerances; with keep, the CPU rows' layout
   check too. */
static bench_row_t check_kept(const bench_team_bufs_t* b, const bench_shape_t* shape, int kmax,
                              const bench_check_t* how, bench_layout_keep_t* keep) {
  bench_row_t row;
  memset(&row, 0, sizeof row);
  row.shape = shape;
  row.spatial = TSP;
  row.dtype = sbnFloat32;
  row.layout = b->desc.layout;
  row.W = TW;
  row.path = BENCH_PATH_CPU;
  check_row(&row, b, 1, kmax, keep, sbnGradGlobal, how);
  return row;
}
static bench_row_t check_as(bench_team_bufs_t* b, const bench_shape_t* shape, int kmax,
                            const bench_check_t* how) {
  return check_kept(b, shape, kmax, how, NULL);
}
static bench_row_t check(bench_team_bufs_t* b, const bench_shape_t* shape) {
  return check_as(b, shape, 0, &kCheckLibrary);
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

static bench_row_t infer_check_k(bench_team_bufs_t* b, const bench_shape_t* shape, int kmax) {
  bench_row_t row;
  memset(&row, 0, sizeof row);
  row.shape = shape;
  row.spatial = b->desc.spatial;
  row.dtype = b->desc.dtype;
  row.layout = b->desc.layout;
  row.W = 1;
  row.path = BENCH_PATH_CPU;
  row.inference = 1;
  check_inference(&row, b, kmax, &kCheckLibrary);
  return row;
}
static bench_row_t infer_check(bench_team_bufs_t* b, const bench_shape_t* shape) {
  return infer_check_k(b, shape, 0); /* every channel */
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
  /* (4d) --check-channels 2: the first and the LAST channel (44); a wrong y there is found */
  const int64_t at_last = l == sbnLayoutNCHW ? (2 * d.c + d.c - 1) * d.spatial + 6
                                             : (2 * d.spatial + 6) * d.c + d.c - 1;
  flip_exponent(b.y[0], t, at_last);
  row = infer_check_k(&b, &shape, 2);
  EXPECT(row.wrong == 1 && strstr(row.worst_what, "y r0 c44") != NULL,
         "inference %s %s, --check-channels 2, one y value of the last channel wrong: %lld wrong "
         "(expected 1), worst %s",
         kDtypeNames[t], kLayoutNames[l], (long long)row.wrong, row.worst_what);
  flip_exponent(b.y[0], t, at_last);
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
  /* (4c) the nccl rows' bitwise check (digests) sees y's last element: numel * size is no
     whole number of 8-byte words here */
  {
    static bench_digest_t dg;
    bench_row_t drow;
    memset(&drow, 0, sizeof drow);
    drow.shape = &shape;
    digest_team(&dg, &b);
    unsigned char* last = (unsigned char*)b.y[0] + (size_t)(numel - 1) * dtype_size(t);
    *last ^= 1;
    digest_compare(&drow, &dg, &b);
    EXPECT(drow.wrong == 1,
           "inference %s %s, y's last element one bit off the digest's: %lld wrong (expected 1)",
           kDtypeNames[t], kLayoutNames[l], (long long)drow.wrong);
    *last ^= 1;
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
    /* (9b) the bound itself, as kSumsFormula writes it for the in-place backward: dweight of
       c0 at 0.7 (right) and 1.5 (wrong) times gamma(D + 10) sum |g (|act^-1(y)| + |z| +
       |bias|) / weight|, g = dy where y > 0, else slope dy (D = BENCH_SUM_DEPTH + W), about
       the reference sum g (act^-1(y) - z - bias) / weight, both from this test's own sums */
    {
      const double slope = BENCH_LEAKY_SLOPE, wt = b.weight[0], bs = b.bias[0];
      double ref = 0.0, abs_sum = 0.0;
      for (int r = 0; r < TW; r++)
        for (int64_t n = 0; n < TN; n++)
          for (int64_t s = 0; s < TSP; s++) {
            const int64_t i = n * TC * TSP + s;
            const double y = ((const float*)b.y[r])[i], z = ((const float*)b.z[r])[i],
                         dy = ((const float*)b.dy[r])[i];
            const double g = y > 0.0 ? dy : slope * dy, a = y > 0.0 ? y : y / slope;
            ref += g * (a - z - bs) / wt;
            abs_sum += fabs(g * (fabs(a) + fabs(z) + fabs(bs)) / wt);
          }
      const double k = BENCH_SUM_DEPTH + TW + 10, u = 1.0 / 16777216.0;
      const double bound = k * u / (1.0 - k * u) * abs_sum;
      for (int f = 0; f < 2; f++) {
        const double by = f ? 1.5 : 0.7;
        for (int r = 0; r < TW; r++) b.dweight[r][0] = (float)(ref + by * bound);
        row = check(&b, shape);
        EXPECT(row.wrong == (f ? TW : 0),
               "in place, dweight c0 at %.1f times its bound (%.3g): %lld wrong (expected %d), "
               "worst %.3g (%s)",
               by, bound, (long long)row.wrong, f ? TW : 0, row.worst, row.worst_what);
      }
    }
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

/* What print(arg) writes to stdout, into buf (cut at cap - 1); 0, or -1 without a
   temporary file. */
static int captured(void (*print)(const void*), const void* arg, char* buf, size_t cap) {
  buf[0] = '\0';
  FILE* f = tmpfile();
  fflush(stdout);
  const int saved = dup(1);
  if (f == NULL || saved < 0 || dup2(fileno(f), 1) < 0) {
    if (f) fclose(f);
    if (saved >= 0) close(saved);
    return -1;
  }
  print(arg);
  fflush(stdout);
  dup2(saved, 1);
  close(saved);
  rewind(f);
  const size_t got = fread(buf, 1, cap - 1, f);
  buf[got] = '\0';
  fclose(f);
  return 0;
}

/* One float moved by one ulp (away from zero). */
static float ulp_up(float v) {
  return nextafterf(v, v < 0.0f ? -INFINITY : INFINITY);
}

/* (13)-(21) on the team's right results b: each kind of value the check compares, made
   wrong where the check looks (and put back), is counted; how many, and where. */
static void team_wrongs(bench_team_bufs_t* b, const bench_shape_t* shape) {
  bench_row_t row;
  /* (13) a NaN in y: wrong (a NaN compares false with any tolerance), the worst infinite */
  float* y1 = b->y[1];
  const int64_t at = (1 * TC + 2) * TSP + 5; /* rank 1: n 1, c 2, s 5 */
  const float y_good = y1[at];
  y1[at] = NAN;
  row = check(b, shape);
  EXPECT(row.wrong == 1 && isinf(row.worst) && strncmp(row.worst_what, "y r1 c2", 7) == 0,
         "a NaN in y: %lld wrong (expected 1), worst %g (expected inf) at %s", (long long)row.wrong,
         row.worst, row.worst_what);
  /* (14) y off by 0.01: 1e-4 (1 + |y|) allows less wherever |y| < 99 */
  y1[at] = y_good + 0.01f;
  row = check(b, shape);
  EXPECT(row.wrong == 1 && strncmp(row.worst_what, "y r1 c2", 7) == 0,
         "one y value off by 0.01: %lld wrong (expected 1), worst %s", (long long)row.wrong,
         row.worst_what);
  y1[at] = y_good;
  /* (15) each statistic of channel 2 off by 1e-4 on every rank (the ranks still agree):
     its tolerance is 1e-5 (1 + |ref|), its values here within 2 of 0 */
  struct {
    const char* what;
    float** v;
    double by;
  } stats[4] = {{"save_mean", b->save_mean, 1e-4},
                {"save_invstd", b->save_invstd, 1e-4},
                {"running_mean", b->rm, 1e-4},
                {"running_var", b->rv, 1e-4}};
  for (int q = 0; q < 4; q++) {
    const float good = stats[q].v[0][2];
    for (int r = 0; r < TW; r++) stats[q].v[r][2] = (float)(good + stats[q].by);
    row = check(b, shape);
    char where[32];
    snprintf(where, sizeof where, "%s r", stats[q].what);
    EXPECT(row.wrong == TW && strncmp(row.worst_what, where, strlen(where)) == 0,
           "%s of channel 2 off by %g on every rank: %lld wrong (expected %d), worst %s",
           stats[q].what, stats[q].by, (long long)row.wrong, TW, row.worst_what);
    for (int r = 0; r < TW; r++) stats[q].v[r][2] = good;
  }
  /* (16) num_batches_tracked: 2 after one call, on every rank */
  for (int r = 0; r < TW; r++) b->nbt[r] = 2;
  row = check(b, shape);
  EXPECT(row.wrong == TW, "num_batches_tracked 2 after one call: %lld wrong (expected %d)",
         (long long)row.wrong, TW);
  for (int r = 0; r < TW; r++) b->nbt[r] = 1;
  /* (17) one rank's save_mean, and one rank's team dweight, one ulp from rank 0's: within
     every tolerance, but the ranks must agree bitwise */
  float* keep[2] = {&b->save_mean[1][1], &b->dweight[1][1]};
  for (int q = 0; q < 2; q++) {
    const float good = *keep[q];
    *keep[q] = ulp_up(good);
    row = check(b, shape);
    EXPECT(row.wrong == 1,
           "rank 1's %s of channel 1 one ulp from rank 0's: %lld wrong (expected 1)",
           q ? "dweight" : "save_mean", (long long)row.wrong);
    *keep[q] = good;
  }
  /* (18) --check-channels 2: the first and the LAST channel; a wrong y in the last is found */
  float* y0 = b->y[0];
  const int64_t last = (0 * TC + (TC - 1)) * TSP + 9;
  const float last_good = y0[last];
  y0[last] = last_good + 0.5f;
  row = check_as(b, shape, 2, &kCheckLibrary);
  EXPECT(row.wrong == 1 && strncmp(row.worst_what, "y r0 c3", 7) == 0,
         "--check-channels 2, a wrong y in the last channel: %lld wrong (expected 1), worst %s",
         (long long)row.wrong, row.worst_what);
  y0[last] = last_good;
  /* (19) the bound itself: dweight of c0 (every term positive: sum |term| = the sum) and dbias
     of c1 (every dy positive), the team sums at 0.7 and 1.5 times gamma(D + 3) sum |term|,
     gamma(D) sum |dy| (D = BENCH_SUM_DEPTH + W), from this test's own double sums */
  const double u = 1.0 / 16777216.0;
  for (int q = 0; q < 2; q++) {
    const int64_t c = q; /* c0 dweight, c1 dbias */
    double sum = 0.0;
    for (int r = 0; r < TW; r++)
      for (int64_t n = 0; n < TN; n++)
        for (int64_t s = 0; s < TSP; s++) {
          const int64_t i = (n * TC + c) * TSP + s;
          const double dy = ((const float*)b->dy[r])[i];
          sum += q ? dy
                   : dy * (((const float*)b->x[r])[i] - (double)b->save_mean[0][c]) *
                         (double)b->save_invstd[0][c];
        }
    const double k = BENCH_SUM_DEPTH + TW + (q ? 0 : 3), bound = k * u / (1.0 - k * u) * fabs(sum);
    float** v = q ? b->dbias : b->dweight;
    const float good = v[0][c];
    for (int f = 0; f < 2; f++) {
      const double by = f ? 1.5 : 0.7;
      for (int r = 0; r < TW; r++) v[r][c] = (float)(sum + by * bound);
      row = check(b, shape);
      EXPECT(row.wrong == (f ? TW : 0),
             "%s of channel %lld at %.1f times its bound (%.3g): %lld wrong (expected %d), "
             "worst %.3g (%s)",
             q ? "dbias" : "dweight", (long long)c, by, bound, (long long)row.wrong, f ? TW : 0,
             row.worst, row.worst_what);
    }
    for (int r = 0; r < TW; r++) v[r][c] = good;
  }
  /* (20) cuDNN's rows: its tolerances (10x, and 1e-3 (1 + |ref|) on top of the sums' bound),
     not the running statistics; a y or dweight beyond them is still wrong */
  row = check_as(b, shape, 0, &kCheckCudnn);
  EXPECT(row.wrong == 0, "cuDNN's check of the right results: %lld wrong", (long long)row.wrong);
  const float rm_good = b->rm[0][1];
  for (int r = 0; r < TW; r++) b->rm[r][1] = rm_good + 1.0f;
  row = check_as(b, shape, 0, &kCheckCudnn);
  EXPECT(row.wrong == 0,
         "cuDNN's check, running_mean changed: %lld wrong (expected 0: not compared)",
         (long long)row.wrong);
  for (int r = 0; r < TW; r++) b->rm[r][1] = rm_good;
  y1[at] = (float)(y_good + 3e-3 * (1.0 + fabs(y_good)));
  row = check_as(b, shape, 0, &kCheckCudnn);
  EXPECT(row.wrong == 1, "cuDNN's check, y off by 3e-3 (1 + |y|): %lld wrong (expected 1)",
         (long long)row.wrong);
  y1[at] = y_good;
  const float dw_good = b->dweight[0][0];
  for (int r = 0; r < TW; r++) b->dweight[r][0] = (float)(dw_good * (1.0 + 3e-3));
  row = check_as(b, shape, 0, &kCheckCudnn);
  EXPECT(row.wrong == TW, "cuDNN's check, dweight c0 * (1 + 3e-3): %lld wrong (expected %d)",
         (long long)row.wrong, TW);
  for (int r = 0; r < TW; r++) b->dweight[r][0] = dw_good;
  /* (21) the nccl rows' bitwise check against the coop row's digests: the same bits pass,
     one ulp in one rank's dbias of the last channel is one wrong */
  static bench_digest_t dg;
  digest_team(&dg, b);
  memset(&row, 0, sizeof row);
  row.shape = shape;
  digest_compare(&row, &dg, b);
  EXPECT(row.wrong == 0 && row.checked > 0, "digests of the same buffers: %lld wrong",
         (long long)row.wrong);
  const float db_good = b->dbias[1][TC - 1];
  b->dbias[1][TC - 1] = ulp_up(db_good);
  digest_compare(&row, &dg, b);
  EXPECT(row.wrong == 1, "rank 1's dbias c3 one ulp off the coop row's: %lld wrong (expected 1)",
         (long long)row.wrong);
  b->dbias[1][TC - 1] = db_good;
  printf("team checks (13)-(21) done\n");
}

/* (22) The floors and ratios of one op (op_derived, infer_derived) at B = 1000 GB/s, a row
   of W = 3 ranks of 1 MiB each: the bytes of the definition (asserted here: fwd (a) 3|x|, (b)
   2|x|, bwd (a) 5|x|, (b) 3|x| of all W ranks; a z adds |x| to the forward, y read and dz
   written to the backward: +3|x| (a), +2|x| (b); relu and the in-place ones as the plain
   op's, or add-relu's), floor us = bytes / B, % = floor / time; no time, no %. */
/* A row of shape (1024 values per plane, fp32) at W ranks on path, the rest 0. */
static bench_row_t row_of(const bench_shape_t* shape, int W, int path) {
  bench_row_t r;
  memset(&r, 0, sizeof r);
  r.shape = shape;
  r.spatial = 1024;
  r.dtype = sbnFloat32;
  r.W = W;
  r.path = path;
  return r;
}
static void floors_checked(void) {
  static const bench_shape_t shape = {"F", 4, 64, 32, 32, "test_check.c (floors)"};
  const double B = 1000.0, x = 4.0 * 64 * 1024 * 4, xa = 3 * x; /* one rank's, all ranks' */
  bench_row_t r = row_of(&shape, 3, BENCH_PATH_COOP);
  r.t[1].med = 20.0;
  r.t[0].med = 40.0;
  int bad = 0;
  for (int e = 0; e < BENCH_EPI_COUNT; e++)
    for (int fwd = 0; fwd < 2; fwd++) {
      r.epilogue = e;
      const int z = epi_has_z(e);
      const double ka = fwd ? 3 + z : 5 + 3 * z, kb = fwd ? 2 + z : 3 + 2 * z;
      const bench_op_derived_t d = op_derived(&r, fwd, B);
      const double want[8] = {kb * x,
                              kb * xa,
                              ka * xa,
                              kb * xa,
                              ka * xa / 1e6,
                              kb * xa / 1e6,
                              ka * xa / 1e6 / r.t[fwd].med * 100,
                              kb * xa / 1e6 / r.t[fwd].med * 100};
      const double got[8] = {d.bytes_rank, d.bytes_total, d.floor_a_bytes, d.floor_b_bytes,
                             d.floor_a_us, d.floor_b_us,  d.pct_a,         d.pct_b};
      for (int q = 0; q < 8; q++)
        if (!(fabs(got[q] - want[q]) <= 1e-12 * want[q])) {
          printf("FAIL: op_derived, epilogue %s %s, value %d: %.9g, expected %.9g\n",
                 kEpilogueNames[e], fwd ? "fwd" : "bwd", q, got[q], want[q]);
          bad = 1;
        }
    }
  r.epilogue = BENCH_EPI_NONE;
  r.skipped = 1; /* a row that did not run has no time, so no rate and no % */
  const bench_op_derived_t d = op_derived(&r, 1, B);
  EXPECT(!bad && isnan(d.gbps_rank) && isnan(d.pct_a) && d.floor_a_bytes == 3 * xa,
         "op_derived: the floors above, and none of a row that did not run (gbps %g, %% %g)",
         d.gbps_rank, d.pct_a);
  /* the inference rows: 2|x| (W = 1), floor = 2|x| / B, x_copy = t / floor; a cudnn row's
     copy is its coop row's */
  bench_row_t c = row_of(&shape, 1, BENCH_PATH_COOP), k;
  c.inference = 1;
  c.t[1].med = 3.0; /* the call */
  c.t[0].med = 2.5; /* the copy of x */
  k = c;
  k.path = BENCH_PATH_CUDNN;
  k.coop = &c;
  k.t[1].med = 6.0;
  k.t[0].med = 99.0; /* unused in a cudnn row */
  const bench_infer_derived_t ic = infer_derived(&c, B), ik = infer_derived(&k, B);
  const double fl = 2 * x / 1e6;
  EXPECT(ic.bytes == 2 * x && fabs(ic.floor_us - fl) <= 1e-12 * fl &&
             fabs(ic.ratio - 3.0 / fl) <= 1e-12 * ic.ratio && ic.copy_us == 2.5 &&
             ic.t_over_copy == 3.0 / 2.5 && ik.copy_us == 2.5 && ik.t_over_copy == 6.0 / 2.5,
         "infer_derived: bytes %g, floor %g us, x copy %g, copy %g us, t/copy %g; cudnn's copy %g "
         "us, t/copy %g",
         ic.bytes, ic.floor_us, ic.ratio, ic.copy_us, ic.t_over_copy, ik.copy_us, ik.t_over_copy);
}

/* (23) The totals (results_add): wrong values and failed rows counted, the worst of the
   rows that ran; the table's t/coop (path over coop) and % of the floors in their columns;
   the footer's inference target count (library rows only, x copy <= 1.1) and median
   t_path / t_coop. */
static const bench_run_t* g_run;
static const bench_row_t* g_row;
static const bench_results_t* g_res;
static void print_row(const void* a) {
  (void)a;
  report_row(g_run, g_row);
}
static void print_footer(const void* a) {
  (void)a;
  report_footer(g_run, g_res);
}
static void report_checked(void) {
  static const bench_shape_t shape = {"R", 4, 64, 32, 32, "test_check.c (report)"};
  bench_row_t rows[4];
  memset(rows, 0, sizeof rows);
  for (int i = 0; i < 4; i++) {
    rows[i].shape = &shape;
    rows[i].spatial = 1024;
    rows[i].W = 1;
    rows[i].done = 1;
  }
  rows[0].wrong = 2;
  rows[0].worst = 3.0;
  snprintf(rows[1].error, sizeof rows[1].error, "failed");
  rows[2].skipped = 1;
  rows[2].worst = 99.0;
  rows[3].worst = 0.5;
  bench_results_t res;
  memset(&res, 0, sizeof res);
  for (int i = 0; i < 4; i++) results_add(&res, &rows[i]);
  EXPECT(res.wrong == 2 && res.failed == 1 && res.skipped == 1 && res.worst == &rows[0],
         "results_add: wrong %lld (expected 2), failed %d (1), skipped %d (1), worst row %d (0)",
         (long long)res.wrong, res.failed, res.skipped, res.worst ? (int)(res.worst - rows) : -1);

  /* a cudnn row at 2x and 3x coop's time (1 MiB of x, B = 1000 GB/s) */
  bench_device_info_t dev;
  memset(&dev, 0, sizeof dev);
  bench_run_t run;
  memset(&run, 0, sizeof run);
  run.dev = &dev;
  run.B = 1000.0;
  bench_row_t coop, cud;
  memset(&coop, 0, sizeof coop);
  coop.shape = &shape;
  coop.spatial = 1024;
  coop.W = 1;
  coop.done = 1;
  coop.t[1].med = 10.0;
  coop.t[0].med = 10.0;
  cud = coop;
  cud.path = BENCH_PATH_CUDNN;
  cud.coop = &coop;
  cud.t[1].med = 20.0;
  cud.t[0].med = 30.0;
  char buf[8192], want[64];
  g_run = &run;
  g_row = &cud;
  const double x = 1048576.0;
  if (captured(print_row, NULL, buf, sizeof buf) == 0) {
    for (int fwd = 1; fwd >= 0; fwd--) {
      const double t = cud.t[fwd].med, a = (fwd ? 3 : 5) * x / 1e6, bb = (fwd ? 2 : 3) * x / 1e6;
      snprintf(want, sizeof want, " %7.1f %7.1f %6s", a / t * 100, bb / t * 100,
               fwd ? "2.00" : "3.00");
      EXPECT(strstr(buf, want) != NULL,
             "report_row: no '%s' (%s: %% of floor (a), (b), t/coop) in '%s'", want,
             fwd ? "fwd" : "bwd", buf);
    }
  } else {
    EXPECT(0, "report_row: no temporary file");
  }
  /* the footer: inference rows at x copy 1.05 and 1.5 (coop) and 1.0 (cudnn: not the
     library's), a nccl row at 2x (fwd) and 3x (bwd) coop's time */
  bench_row_t main_rows[2] = {coop, cud}, inf[3];
  main_rows[1].path = BENCH_PATH_NCCL;
  main_rows[1].coop = &main_rows[0];
  memset(inf, 0, sizeof inf);
  const double fl = 2 * x / 1e6, q[3] = {1.05, 1.5, 1.0};
  for (int i = 0; i < 3; i++) {
    inf[i] = coop;
    inf[i].inference = 1;
    inf[i].path = i == 2 ? BENCH_PATH_CUDNN : BENCH_PATH_COOP;
    inf[i].coop = i == 2 ? &inf[0] : NULL;
    inf[i].t[1].med = q[i] * fl;
    inf[i].t[0].med = fl;
  }
  bench_results_t fr;
  memset(&fr, 0, sizeof fr);
  fr.rows = main_rows;
  fr.nrows = 2;
  fr.inf = inf;
  fr.ninf = 3;
  g_res = &fr;
  if (captured(print_footer, NULL, buf, sizeof buf) == 0) {
    EXPECT(strstr(buf, "# inference target x copy <= 1.1: met by 1 of 2 library rows") != NULL,
           "report_footer: not 'met by 1 of 2 library rows' in:\n%s", buf);
    EXPECT(strstr(buf, "# t_nccl / t_coop, median over 1 rows: fwd 2.00, bwd 3.00") != NULL,
           "report_footer: not the nccl row's fwd 2.00, bwd 3.00 in:\n%s", buf);
  } else {
    EXPECT(0, "report_footer: no temporary file");
  }
}

/* (24) The JSON (json_write) of a GPU run: each row's wrong and error, the totals, and ok
   false while anything is wrong or failed; bytes_x_total all W ranks'; the device's L2; the
   kernel per op; a cudnn inference row's t over coop's; never a bare inf (not JSON). */
static int json_has(const char* path, const char* const* want, int nwant, const char* const* absent,
                    int nabsent, const char* what) {
  static char buf[65536];
  FILE* f = fopen(path, "r");
  size_t got = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
  if (f) fclose(f);
  buf[got] = '\0';
  int ok = got > 0;
  for (int i = 0; i < nwant; i++)
    if (!strstr(buf, want[i])) {
      printf("FAIL: the JSON (%s) has no '%s'\n", what, want[i]);
      ok = 0;
    }
  for (int i = 0; i < nabsent; i++)
    if (strstr(buf, absent[i])) {
      printf("FAIL: the JSON (%s) has '%s'\n", what, absent[i]);
      ok = 0;
    }
  if (!ok) printf("%s\n", buf);
  return ok;
}
static void json_checked(void) {
  static const bench_shape_t shape = {"J", 4, 64, 32, 32, "test_check.c (json)"};
  bench_opts_t o;
  memset(&o, 0, sizeof o);
  o.ranks_list[0] = 1;
  o.ranks_list[1] = 2;
  o.nranks_list = 2;
  o.path_on[BENCH_PATH_COOP] = o.path_on[BENCH_PATH_CUDNN] = 1;
  o.scale = o.iters = 1;
  bench_device_info_t dev;
  memset(&dev, 0, sizeof dev);
  dev.l2_bytes = 50 << 20;
  dev.copy_gbps = 1000.0;
  bench_run_t run;
  memset(&run, 0, sizeof run);
  run.dev = &dev;
  run.B = 1000.0;
  run.shapes_source = "test_check.c";
  run.nccl.version = run.cudnn.version = -1;
  bench_row_t rows[2], inf[2];
  memset(rows, 0, sizeof rows);
  for (int i = 0; i < 2; i++) {
    rows[i].shape = &shape;
    rows[i].spatial = 1024;
    rows[i].done = 1;
  }
  rows[0].W = 2; /* coop at W = 2: 1 MiB of x per rank */
  rows[0].t[1].med = 10.0;
  rows[0].t[0].med = 20.0;
  rows[0].checked = 100;
  rows[0].wrong = 3;
  snprintf(rows[0].kernel[1], sizeof rows[0].kernel[1], "onchip");
  snprintf(rows[0].kernel[0], sizeof rows[0].kernel[0], "stream");
  rows[1].W = 1;
  rows[1].path = BENCH_PATH_CUDNN;
  snprintf(rows[1].error, sizeof rows[1].error, "boom");
  memset(inf, 0, sizeof inf);
  for (int i = 0; i < 2; i++) {
    inf[i] = rows[0];
    inf[i].W = 1;
    inf[i].wrong = 0;
    inf[i].inference = 1;
    inf[i].t[0].med = 2.0;
  }
  inf[0].t[1].med = 0.0; /* a time of 0: rates and ratios infinite, written null */
  inf[1].path = BENCH_PATH_CUDNN;
  inf[1].coop = &inf[0];
  inf[1].t[1].med = 6.0;
  bench_results_t res;
  memset(&res, 0, sizeof res);
  res.rows = rows;
  res.nrows = 2;
  res.inf = inf;
  res.ninf = 2;
  for (int i = 0; i < 2; i++) results_add(&res, &rows[i]);
  const char* path = "test_check_json.json";
  bench_json_t j;
  if (json_open(&j, path) != 0) {
    EXPECT(0, "json_open %s", path);
    return;
  }
  static const char* const want[] = {"\"checked\": 100, \"wrong\": 3,",
                                     "\"error\": \"boom\"",
                                     "\"wrong\": 3,\n  \"failed_rows\": 1,",
                                     "\"ok\": false",
                                     "\"bytes_x_rank\": 1048576, \"bytes_x_total\": 2097152",
                                     "\"l2_bytes\": 52428800",
                                     "\"kernel\": {\"fwd\": \"onchip\", \"bwd\": \"stream\"}",
                                     "\"us_fwd\": 10, \"us_bwd\": 20"};
  static const char* const never[] = {": inf", ": -inf", ": nan", ": -nan", "\"ok\": true"};
  EXPECT(json_write(&j, &o, &run, &res, 1) == 0 &&
             json_has(path, want, 8, never, 5, "wrong and failed"),
         "the JSON of a run with wrong values and a failed row");
  /* ok false with only wrong values, with only a failed row; true with neither */
  inf[0].t[1].med = 3.0;
  static const char* const ratio[] = {"\"t_over_coop\": 2,"};
  static const char *const is_ok[] = {"\"ok\": true"}, *not_ok[] = {"\"ok\": false"};
  res.failed = 0;
  EXPECT(
      json_write(&j, &o, &run, &res, 1) == 0 && json_has(path, not_ok, 1, is_ok, 1, "wrong only"),
      "the JSON of a run with wrong values only: ok false");
  res.wrong = 0;
  res.failed = 1;
  EXPECT(
      json_write(&j, &o, &run, &res, 1) == 0 && json_has(path, not_ok, 1, is_ok, 1, "failed only"),
      "the JSON of a run with a failed row only: ok false");
  res.failed = 0;
  EXPECT(json_write(&j, &o, &run, &res, 1) == 0 && json_has(path, is_ok, 1, not_ok, 1, "right") &&
             json_has(path, ratio, 1, NULL, 0, "cudnn inference t/coop"),
         "the JSON of a run with nothing wrong: ok true, cudnn's inference at 2x coop's");
  remove(path);
}

/* The layout check (check_row with a keep, as the bench's CPU rows run it): a shape's NCHW
   row keeps its bits, and its NHWC row, the same values in the other layout, must have
   them. A right pair gives no wrong; an NHWC row whose y, dx, save_mean or dweight is one
   ulp off (within the reference's tolerance, so only the bitwise check can see it) gives
   wrongs; and a keep of another shape is not compared. The bench's own rows only ever
   showed that a right pair passes. */
static int layout_row(bench_layout_keep_t* keep, const bench_shape_t* shape, sbnLayout_t lay,
                      int flip, int64_t* wrong) {
  const sbnTensorDesc_t d = {sbnFloat32, lay, TN, TC, TSP};
  bench_team_bufs_t b;
  if (bufs_alloc(&b, TW, &d) != 0) return -1;
  for (int64_t c = 0; c < TC; c++) {
    b.weight[c] = 1.0f + 0.25f * (float)c;
    b.bias[c] = 0.5f - 0.125f * (float)c;
  }
  for (int r = 0; r < TW; r++)
    for (int64_t n = 0; n < TN; n++)
      for (int64_t c = 0; c < TC; c++)
        for (int64_t sp = 0; sp < TSP; sp++) {
          const uint64_t logical = (uint64_t)((n * TC + c) * TSP + sp); /* the NCHW index */
          const int64_t i = lay == sbnLayoutNCHW ? (int64_t)logical : (n * TSP + sp) * TC + c;
          ((float*)b.x[r])[i] = (float)(0.5 * (double)c + gauss(40 + (uint64_t)r, logical));
          ((float*)b.dy[r])[i] = (float)gauss(50 + (uint64_t)r, logical);
        }
  bufs_reset_state(&b);
  sbnComm_t comms[TW];
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  sbnParams_t params = SBN_PARAMS_DEFAULT;
  params.grad_mode = sbnGradGlobal;
  int rc = sbnCommInitCpu(comms, TW, &cfg) == sbnSuccess && team_call(comms, &b, 1, &params) == 0 &&
                   team_call(comms, &b, 0, &params) == 0
               ? 0
               : -1;
  if (rc == 0 && flip) { /* one ulp up: rank 0's channel 1, its second element; the team's
                            statistics and sums on every rank (the ranks must agree) */
    const int64_t i = lay == sbnLayoutNCHW ? TSP + 1 : TC + 1;
    float *y = b.y[0], *dx = b.dx[0];
    if (flip == 1) y[i] = nextafterf(y[i], INFINITY);
    if (flip == 2) dx[i] = nextafterf(dx[i], INFINITY);
    for (int r = 0; r < TW; r++) {
      if (flip == 3) b.save_mean[r][1] = nextafterf(b.save_mean[r][1], INFINITY);
      if (flip == 4) b.dweight[r][1] = nextafterf(b.dweight[r][1], INFINITY);
    }
  }
  if (rc == 0) {
    const bench_row_t row = check_kept(&b, shape, 0, &kCheckLibrary, keep);
    *wrong = row.wrong;
    if (row.error[0]) rc = -1;
  }
  for (int r = 0; r < TW; r++) sbnCommDestroy(comms[r]);
  bufs_free(&b);
  return rc;
}
static void layout_keep_checked(void) {
  static const bench_shape_t shape = {"L", TN, TC, TSP, 1, "test_check.c"};
  static const bench_shape_t other = {"M", TN, TC, TSP, 1, "test_check.c"};
  static const char* const what[5] = {"nothing", "y", "dx", "save_mean", "dweight"};
  for (int flip = 0; flip < 5; flip++) {
    bench_layout_keep_t keep;
    memset(&keep, 0, sizeof keep);
    int64_t kept = -1, compared = -1;
    const int ok = layout_row(&keep, &shape, sbnLayoutNCHW, 0, &kept) == 0 &&
                   layout_row(&keep, &shape, sbnLayoutNHWC, flip, &compared) == 0;
    EXPECT(ok, "layout check, %s off: a row failed to run", what[flip]);
    EXPECT(kept == 0, "layout check: the NCHW row has %lld wrong", (long long)kept);
    if (flip == 0)
      EXPECT(compared == 0, "layout check: the right NHWC row has %lld wrong", (long long)compared);
    else
      EXPECT(compared > 0, "layout check: an NHWC row whose %s is one ulp off has no wrong",
             what[flip]);
    keep_free(&keep);
    /* the same row without a keep: the reference's tolerances let one ulp through, so the
       wrongs above are the layout check's */
    int64_t alone = -1;
    EXPECT(layout_row(NULL, &shape, sbnLayoutNHWC, flip, &alone) == 0 && alone == 0,
           "layout check: the NHWC row, %s one ulp off, checked alone has %lld wrong", what[flip],
           (long long)alone);
  }
  /* kept for another shape: no comparison, so even a row one ulp off passes */
  bench_layout_keep_t keep;
  memset(&keep, 0, sizeof keep);
  int64_t kept = -1, compared = -1;
  const int ok = layout_row(&keep, &other, sbnLayoutNCHW, 0, &kept) == 0 &&
                 layout_row(&keep, &shape, sbnLayoutNHWC, 1, &compared) == 0;
  EXPECT(ok && kept == 0 && compared == 0,
         "layout check: a keep of another shape was compared (%lld wrong)", (long long)compared);
  keep_free(&keep);
}

int main(void) {
  if (nvidia_driver_parsed() != 0) return 1;
  no_row_refused();
  static const sbnDataType_t kInferDtypes[3] = {sbnFloat32, sbnBFloat16, sbnFloat16};
  for (int t = 0; t < 3; t++)
    for (int l = 0; l < 2; l++) inference_checked(kInferDtypes[t], (sbnLayout_t)l);
  const int infer_failures = failures;
  latency_exch();
  layout_keep_checked();
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
  team_wrongs(&b, &shape);
  bufs_free(&b);
  static const bench_shape_t ishape = {"P", TN, TC, TSP, 1, "test_check.c (in place)"};
  const int inplace_failures = inplace_checked(&ishape);
  floors_checked();
  report_checked();
  json_checked();
  /* the team check's 3; 6 per inference dtype x layout, 7 for fp16's; in place 6; the
     latency table's 6; the team's wrong values 20; floors 2, report 5, JSON 4 */
  const int cases = 3 + 6 * 6 + 2 + 6 + 6 + 20 + 2 + 5 + 4;
  printf("%d passed, %d failed (%d of them the inference checks, %d the in-place ones)\n",
         cases - (failures > cases ? cases : failures), failures, infer_failures, inplace_failures);
  return failures ? 1 : 0;
}
