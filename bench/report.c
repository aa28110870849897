/* report.c — the one table printer, for both modes (nccl-tests style): the header says what
 * ran and how it was measured, one line per row as soon as it is done, the latency table
 * (GPU mode), and the footer with the formulas and the totals. */
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"
#include "sbn_bench_commit.h" /* generated at build time: SBN_BENCH_COMMIT */

const char* const kRatioFormula =
    "speed ratio = t_path / t_coop of the same op (median times), shape, dtype, layout and W "
    "(cudnn: the coop row at W = 1); > 1: coop is faster, < 1: coop is slower";
static const char* const kGpuPathLegend[3] = {
    "coop  = the library's cooperative kernel (SBN_ALGO=coop): one cooperative launch per op "
    "for all W ranks, the exchange inside it",
    "nccl  = the library's host-driven path (SBN_ALGO=nccl, PyTorch's op sequence); "
    "nccl-path on a virtual team: stats kernel, publish kernel, gather kernel in place of "
    "ncclAllGather, apply kernel (NCCL refuses two ranks on one GPU); at W = 1 an "
    "sbnCommInitAll team of one GPU with a real 1-rank ncclAllGather, and where coop runs "
    "small (a team of one's few rows) small's statistics kernel for stats and publish; its "
    "outputs must be bitwise the coop row's",
    "cudnn = cudnnBatchNormalizationForwardTrainingEx / BackwardEx, CUDNN_BATCHNORM_OPS_BN, "
    "the faster of modes SPATIAL_PERSISTENT and SPATIAL (forward + backward), W = 1 only: one "
    "GPU, no sync"};

/* Column widths: the row's description, one op (time, GB/s/rk, GB/s all; in GPU mode also
   % of floor (a), (b) and t/coop). */
#define COLS_LEFT 67
#define COLS_OP 30
#define COLS_OP_GPU 23

/* ---- rows ----------------------------------------------------------------------------------- */
const char* row_label(const bench_row_t* r, char* buf, size_t cap) {
  snprintf(buf, cap, "%s %s %s W=%d %s%s", r->shape->id, kDtypeNames[r->dtype],
           kLayoutNames[r->layout], r->W, kPathNames[r->path], r->inference ? " inference" : "");
  return buf;
}

int row_timed(const bench_row_t* r) {
  return r && r->shape && !r->error[0] && !r->skipped;
}

void row_note_append(bench_row_t* row, const char* text) {
  size_t len = strlen(row->note);
  if (len + 3 >= sizeof row->note) return;
  snprintf(row->note + len, sizeof row->note - len, "%s%s", len ? "; " : "", text);
}

/* Latency rows: lat[((W - 1) * 2 + q) * 2 + path], q = 0 tiny, 1 empty; path coop or nccl. */
bench_row_t* lat_slot(bench_row_t* lat, int W, int q, int path) {
  return &lat[((W - 1) * 2 + q) * 2 + path];
}

const bench_row_t* lat_row(const bench_row_t* lat, int W, int q, int path) {
  const bench_row_t* r = &lat[((W - 1) * 2 + q) * 2 + path];
  return r->shape ? r : NULL;
}

void results_add(bench_results_t* res, const bench_row_t* r) {
  res->wrong += r->wrong;
  res->checked += r->checked;
  res->failed += r->error[0] != 0;
  res->skipped += r->skipped;
  if (row_timed(r) && (!res->worst || r->worst > res->worst->worst)) res->worst = r;
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

/* t_path / t_coop of one op; NaN when either is missing. */
static double speed_ratio(const bench_row_t* r, int fwd) {
  const bench_row_t* coop = r->coop;
  if (!row_timed(r) || !row_timed(coop) || r == coop) return NAN;
  const double t = r->t[fwd].med, tc = coop->t[fwd].med;
  return tc > 0 ? t / tc : NAN;
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
void format_nccl_version(long long v, char* buf, size_t cap) {
  format_version(v, v >= 20900, buf, cap);
}
void format_cudnn_version(long long v, char* buf, size_t cap) {
  format_version(v, v >= 90000, buf, cap);
}
int parse_nvidia_driver(const char* line, char* buf, size_t cap) {
  if (cap > 0) buf[0] = '\0';
  const char* p = line ? strstr(line, "Kernel Module") : NULL;
  if (p == NULL || cap == 0) return -1;
  p += strlen("Kernel Module");
  /* the first word of digits and dots with a dot in it ("for x86_64" may come first: the
     open kernel modules' line) */
  for (;;) {
    while (*p == ' ' || *p == '\t') p++;
    if (*p == '\0' || *p == '\n') return -1;
    size_t n = 0;
    int dots = 0, digits_only = 1;
    while (p[n] && p[n] != ' ' && p[n] != '\t' && p[n] != '\n') {
      if (p[n] == '.') dots++;
      else if (p[n] < '0' || p[n] > '9') digits_only = 0;
      n++;
    }
    if (digits_only && dots > 0 && p[0] != '.') {
      if (n >= cap) return -1;
      memcpy(buf, p, n);
      buf[n] = '\0';
      return 0;
    }
    p += n;
  }
}

/* ---- the header ------------------------------------------------------------------------------ */
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


/* The header's "checked channels per row": "<= N", or "all" (--check-channels 0). */
static const char* checked_channels(const bench_opts_t* o) {
  static char buf[32];
  if (o->check_channels == 0) return "all";
  snprintf(buf, sizeof buf, "<= %d", o->check_channels);
  return buf;
}

/* The header line of an in-place epilogue (--epilogue leaky-inplace, add-leaky-inplace). */
static void print_inplace_line(const bench_opts_t* o, const char* who) {
  const int z = epi_has_z(o->epilogue);
  printf(
      "# epilogue %s: %ssbnForwardTrainEx, y = leaky_relu(bn(x)%s, %g) into a buffer of its own "
      "(the kernel and bytes of y written over x, as a layer in place does), then the in-place "
      "backward %s from y%s, x not given%s; the bytes of --epilogue %s, whose rows compare\n",
      kEpilogueNames[o->epilogue], who, z ? " + z" : "", (double)BENCH_LEAKY_SLOPE,
      z ? "sbnBackwardInPlaceEx" : "sbnBackwardEx (x NULL)", z ? " and z" : "", z ? ", dz" : "",
      z ? "add-relu" : "relu");
}

static void print_gpu_lines(const bench_opts_t* o, const bench_run_t* run) {
  const bench_device_info_t* g = run->dev;
  char wl[160], ver[32];
  format_rank_list(o, wl, sizeof wl);
  printf("# mode: GPU, virtual teams (W ranks on device %d) and cuDNN (W = 1); paths:%s%s%s%s\n",
         g->index, o->path_on[BENCH_PATH_COOP] ? " coop" : "",
         o->path_on[BENCH_PATH_NCCL] ? " nccl" : "", o->path_on[BENCH_PATH_CUDNN] ? " cudnn" : "",
         o->path_on[BENCH_PATH_SPLIT] ? " split" : "");
  printf("# device %d: %s, sm_%d%d, %d SMs, L2 %.1f MiB, memory %.1f GiB, PCI %s\n", g->index,
         g->name, g->cc_major, g->cc_minor, g->sms, g->l2_bytes / 1048576.0,
         (double)g->mem_total / 1073741824.0, g->pci);
  printf("# NVIDIA driver %s, CUDA driver API %d.%d (%d), runtime %d.%d (%d), host cores online "
         "%ld\n",
         g->nvidia_driver[0] ? g->nvidia_driver : "unknown (not read from /proc/driver/nvidia/version)",
         g->driver / 1000, g->driver % 1000 / 10, g->driver, g->runtime / 1000,
         g->runtime % 1000 / 10, g->runtime, run->cores);
  if (run->nccl.version >= 0) {
    format_nccl_version(run->nccl.version, ver, sizeof ver);
    printf("# NCCL %s (%s; for the record: virtual teams make no NCCL call)\n", ver,
           run->nccl.from);
  } else {
    printf("# NCCL: no version: %s\n", run->nccl.why);
  }
  format_cudnn_version(run->cudnn.version, ver, sizeof ver);
  if (!run->cudnn.loaded)
    printf("# cuDNN not available: %s\n", run->cudnn.why);
  else if (run->cudnn.why[0])
    printf("# cuDNN %s (%s) not usable: %s\n", ver, run->cudnn.from, run->cudnn.why);
  else
    printf("# cuDNN %s (%s, loaded at run time)\n", ver, run->cudnn.from);
  printf(
      "# SBN_ALGO: set by the bench around each library row's calls (coop rows: coop, nccl "
      "rows: nccl); the caller's value (%s) is put back at the end\n",
      run->algo_env ? run->algo_env : "unset");
  const char* kernel_env = getenv("SBN_KERNEL");
  printf(
      "# SBN_KERNEL (the cooperative kernel's variant, read by the library at each call): "
      "%s; each row's kernel column says what ran (forward/backward when they differ)\n",
      kernel_env && kernel_env[0] ? kernel_env : "auto");
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
  if (epi_inplace(o->epilogue))
    print_inplace_line(o, "coop and nccl run ");
  else if (o->epilogue != BENCH_EPI_NONE)
    printf("# epilogue %s: coop and nccl run sbnForwardTrainEx / sbnBackwardEx, y = relu(bn(x)%s) and "
           "the backward's mask from y%s; split runs the plain coop op and bench/act.cu's kernel "
           "(t/coop of a split row: its time over the fused op's); cudnn runs "
           "CUDNN_BATCHNORM_OPS_BN_%sACTIVATION with a ReLU\n",
           kEpilogueNames[o->epilogue], o->epilogue == BENCH_EPI_ADD_RELU ? " + z" : "",
           o->epilogue == BENCH_EPI_ADD_RELU ? ", dz" : "",
           o->epilogue == BENCH_EPI_ADD_RELU ? "ADD_" : "");
  printf(
      "# scale %d (spatial = H*W / %d, >= 1), checked channels per row %s (one more "
      "forward + backward per row on fresh inputs, copied back)\n",
      o->scale, o->scale, checked_channels(o));
  printf(
      "# shapes: %d from %s; sizes are per rank (= per GPU): a row of W ranks moves W x "
      "those bytes through one GPU\n",
      run->nshapes, run->shapes_source);
}

static void print_cpu_lines(const bench_opts_t* o, const bench_run_t* run) {
  printf("# device: %s\n", run->device);
  printf("# ranks %d (one host thread each), threads %d, cores online %ld\n", o->ranks, o->ranks,
         run->cores);
  printf(
      "# scale %d (spatial = H*W / %d, >= 1), warm-up %d, iters %d (median), checked "
      "channels per row %s\n",
      o->scale, o->scale, o->warmup, o->iters, checked_channels(o));
  printf("# shapes: %d from %s; sizes are per rank (= per GPU)\n", run->nshapes,
         run->shapes_source);
  if (epi_inplace(o->epilogue))
    print_inplace_line(o, "");
  else if (o->epilogue != BENCH_EPI_NONE)
    printf("# epilogue %s: sbnForwardTrainEx / sbnBackwardEx, y = relu(bn(x)%s)\n", kEpilogueNames[o->epilogue],
           o->epilogue == BENCH_EPI_ADD_RELU ? " + z" : "");
}

void report_header(const bench_opts_t* o, const bench_run_t* run) {
  printf("# sbn-bench  syncbn %d.%d.%d (header %d.%d.%d)  commit %s  %s\n", run->version / 10000,
         run->version / 100 % 100, run->version % 100, SBN_VERSION_MAJOR, SBN_VERSION_MINOR,
         SBN_VERSION_PATCH, SBN_BENCH_COMMIT, run->date);
  if (run->dev)
    print_gpu_lines(o, run);
  else
    print_cpu_lines(o, run);
  const int op_width = COLS_OP + (run->dev ? COLS_OP_GPU : 0);
  printf("#\n#%*s", COLS_LEFT - 1, "");
  print_title("forward", op_width - 1);
  print_title("backward", op_width - 1);
  printf("\n# %5s %5s %6s %8s %5s %6s %4s %-5s %-13s", "shape", "N", "C", "spatial", "dtype",
         "layout", "W", "path", "kernel");
  for (int k = 0; k < 2; k++) {
    printf(" %10s %8s %9s", "time(us)", "GB/s/rk", "GB/s all");
    if (run->dev) printf(" %7s %7s %6s", "%fl(a)", "%fl(b)", "t/coop");
  }
  printf(" %7s %8s\n", "#wrong", "tol used");
  fflush(stdout);
}

/* ---- progress (stderr) ------------------------------------------------------------------------ */
void report_plan(bench_run_t* run, const bench_results_t* res) {
  const int nlat = run->planned - res->nrows - res->ninf;
  char label[96];
  fprintf(stderr, "sbn-bench: plan: %d rows + %d latency rows + %d inference rows\n", res->nrows,
          nlat, res->ninf);
  int k = 0;
  if (res->order) {
    for (int i = 0; i < run->planned; i++) {
      const bench_row_t* r = res->order[i];
      const int lat = i >= res->nrows + res->ninf; /* gpu_run_order puts them last */
      fprintf(stderr, "sbn-bench: plan %d/%d: %s%s\n", ++k, run->planned, lat ? "latency " : "",
              row_label(r, label, sizeof label));
    }
    run->t_last = now_us();
    return;
  }
  for (int i = 0; i < res->nrows; i++)
    fprintf(stderr, "sbn-bench: plan %d/%d: %s\n", ++k, run->planned,
            row_label(&res->rows[i], label, sizeof label));
  for (int i = 0; i < res->nlat; i++)
    if (res->lat[i].shape)
      fprintf(stderr, "sbn-bench: plan %d/%d: latency %s\n", ++k, run->planned,
              row_label(&res->lat[i], label, sizeof label));
  for (int i = 0; i < res->ninf; i++)
    fprintf(stderr, "sbn-bench: plan %d/%d: %s\n", ++k, run->planned,
            row_label(&res->inf[i], label, sizeof label));
  run->t_last = now_us();
}

void report_progress(bench_run_t* run, const bench_row_t* r) {
  const double now = now_us();
  char label[96], what[64] = "";
  if (r->error[0])
    snprintf(what, sizeof what, ", FAILED");
  else if (r->skipped)
    snprintf(what, sizeof what, ", not run");
  else if (r->wrong)
    snprintf(what, sizeof what, ", %" PRId64 " wrong", r->wrong);
  fprintf(stderr, "sbn-bench: done %d/%d: %s%s: %.2f s, elapsed %.1f s\n", run->finished,
          run->planned, row_label(r, label, sizeof label), what, (now - run->t_last) * 1e-6,
          (now - run->t_start) * 1e-6);
  run->t_last = now;
}

/* ---- rows ------------------------------------------------------------------------------------ */
void report_row(const bench_run_t* run, const bench_row_t* r) {
  char kl[52];
  printf("  %5s %5" PRId64 " %6" PRId64 " %8" PRId64 " %5s %6s %4d %-5s %-13s", r->shape->id,
         r->shape->n, r->shape->c, r->spatial, kDtypeNames[r->dtype], kLayoutNames[r->layout], r->W,
         kPathNames[r->path], kernel_label(r, kl, sizeof kl));
  if (r->error[0]) {
    printf("   FAILED: %s\n", r->error);
  } else if (r->skipped) {
    printf("   -- %s\n", r->note);
  } else {
    for (int fwd = 1; fwd >= 0; fwd--) {
      bench_op_derived_t d = op_derived(r, fwd, run->B);
      printf(" %10.1f %8.2f %9.2f", r->t[fwd].med, d.gbps_rank, d.gbps_total);
      if (run->dev) {
        char ratio[16] = "-";
        double q = speed_ratio(r, fwd);
        if (isfinite(q)) snprintf(ratio, sizeof ratio, "%.2f", q);
        printf(" %7.1f %7.1f %6s", d.pct_a, d.pct_b, ratio);
      }
    }
    printf(r->worst < 1000 ? " %7" PRId64 " %8.3f\n" : " %7" PRId64 " %8.1e\n", r->wrong, r->worst);
  }
  fflush(stdout);
}

void print_latency(const bench_row_t* lat, int lat_w) {
  printf(
      "#\n# latency: fp32 NCHW, C=512; tiny = N=4, 1x1 per rank (like S10); empty = n=0 on "
      "every rank (the launches and the exchange, no data). Median us: GPU = CUDA events, "
      "host = the enqueueing calls; exch = empty(W) - empty(W=1) of the same path and kernel: "
      "what the exchange with W-1 peers adds ('-' where W = 1 ran another kernel or team: auto "
      "runs small for a team of one, SBN_KERNEL=stream times one kernel at every W; the nccl "
      "path's W = 1 is an sbnCommInitAll team with NCCL's collective, its W > 1 virtual teams "
      "with a gather kernel); kernel: the empty op's (forward/backward where they differ)\n");
  printf("#%9s", "");
  print_title("tiny", 35);
  print_title("empty", 35);
  print_title("exch", 15);
  printf("\n# %2s %-5s %8s %8s %8s %8s %8s %8s %8s %8s %7s %7s %7s  %s\n", "W", "path", "fwd",
         "bwd", "host fwd", "host bwd", "fwd", "bwd", "host fwd", "host bwd", "fwd", "bwd",
         "#wrong", "kernel");
  for (int W = 1; W <= lat_w; W++)
    for (int p = 0; p < 2; p++) {
      const bench_row_t* rq[2] = {lat_row(lat, W, 0, p), lat_row(lat, W, 1, p)};
      if (!rq[0] && !rq[1]) continue;
      printf("  %2d %-5s", W, kPathNames[p]);
      int64_t wrong = 0;
      for (int q = 0; q < 2; q++) {
        if (row_timed(rq[q]))
          printf(" %8.1f %8.1f %8.1f %8.1f", rq[q]->t[1].med, rq[q]->t[0].med, rq[q]->t[1].host_med,
                 rq[q]->t[0].host_med);
        else
          printf(" %8s %8s %8s %8s", rq[q] ? "FAILED" : "-", "-", "-", "-");
        if (rq[q]) wrong += rq[q]->wrong;
      }
      const bench_row_t* e1 = lat_row(lat, 1, 1, p);
      for (int fwd = 1; fwd >= 0; fwd--) {
        /* the same kernel and the same team (the row's note: the nccl path's W = 1 team is
           an sbnCommInitAll one with NCCL's collective, its W > 1 teams virtual ones with a
           gather kernel; both say "host") */
        if (W > 1 && row_timed(rq[1]) && row_timed(e1) &&
            strcmp(rq[1]->kernel[fwd], e1->kernel[fwd]) == 0 && strcmp(rq[1]->note, e1->note) == 0)
          printf(" %7.1f", rq[1]->t[fwd].med - e1->t[fwd].med);
        else
          printf(" %7s", "-");
      }
      char kl[52];
      printf(" %7" PRId64 "  %s\n", wrong, rq[1] ? kernel_label(rq[1], kl, sizeof kl) : "-");
      for (int q = 0; q < 2; q++)
        if (rq[q] && rq[q]->error[0])
          printf("#   W=%d %s %s FAILED: %s\n", W, kPathNames[p], rq[q]->shape->id, rq[q]->error);
    }
}

/* An inference row's ratio against the target (x copy, t/copy) into its cell, and counted
   for the library's rows (n of them with one, met of those at most BENCH_INFER_TARGET). */
static void target_cell(const bench_row_t* r, double q, char* cell, size_t cap, int* n, int* met) {
  if (!isfinite(q)) return;
  snprintf(cell, cap, "%.2f", q);
  if (r->path != BENCH_PATH_CUDNN) {
    (*n)++;
    *met += q <= BENCH_INFER_TARGET;
  }
}

/* The inference table: one line per row (W = 1), its times, bytes, the copy floor and t over
   it (the target), and cudnn's time over coop's. */
static void print_inference(const bench_run_t* run, const bench_row_t* inf, int ninf) {
  printf("#\n# inference (W = 1: no team, no statistics): y = (x - running_mean) / sqrt(running_var + "
         "eps) * weight + bias\n");
  if (run->dev)
    printf("#   coop = sbnForwardInference on device pointers, on the bench stream; cudnn = "
           "cudnnBatchNormalizationForwardInference, CUDNN_BATCHNORM_SPATIAL; times: CUDA events "
           "around the call, L2 flushed before each, host = the enqueueing call\n");
  else
    printf("#   cpu = sbnForwardInference on host pointers (the library's CPU code); times: the wall "
           "time of the call (host the same); no B in CPU mode, so no floor\n");
  printf("#   running statistics: %s\n#   %s\n", kInferStatsFormula, kInferFormula);
  printf("# %5s %5s %6s %8s %5s %6s %-5s %-7s %9s %9s %9s %9s %9s %8s %9s %6s %8s %6s %6s %7s %8s\n",
         "shape", "N", "C", "spatial", "dtype", "layout", "path", "kernel", "time(us)", "min(us)", "p90(us)",
         "host(us)", "MB", "GB/s", "floor(us)", "xcopy", "copy(us)", "t/copy", "t/coop", "#wrong", "tol used");
  int nmet = 0, nratio = 0, ncopy_met = 0, ncopy = 0;
  for (int i = 0; i < ninf; i++) {
    const bench_row_t* r = &inf[i];
    if (!r->done) continue;
    printf("  %5s %5" PRId64 " %6" PRId64 " %8" PRId64 " %5s %6s %-5s %-7s", r->shape->id, r->shape->n,
           r->shape->c, r->spatial, kDtypeNames[r->dtype], kLayoutNames[r->layout], kPathNames[r->path],
           r->kernel[1][0] ? r->kernel[1] : "-");
    if (r->error[0]) {
      printf("   FAILED: %s\n", r->error);
      continue;
    }
    if (r->skipped) {
      printf("   -- %s\n", r->note);
      continue;
    }
    const bench_infer_derived_t d = infer_derived(r, run->B);
    char floor_s[16] = "-", ratio_s[16] = "-", coop_s[16] = "-", copy_s[16] = "-", tcopy_s[16] = "-";
    if (isfinite(d.floor_us)) snprintf(floor_s, sizeof floor_s, "%.2f", d.floor_us);
    if (isfinite(d.copy_us)) snprintf(copy_s, sizeof copy_s, "%.3g", d.copy_us);
    target_cell(r, d.t_over_copy, tcopy_s, sizeof tcopy_s, &ncopy, &ncopy_met);
    target_cell(r, d.ratio, ratio_s, sizeof ratio_s, &nratio, &nmet);
    const double q = speed_ratio(r, 1);
    if (isfinite(q)) snprintf(coop_s, sizeof coop_s, "%.2f", q);
    printf(" %9.1f %9.1f %9.1f %9.1f %9.3f %8.2f %9s %6s %8s %6s %6s", r->t[1].med, r->t[1].min, r->t[1].p90,
           r->t[1].host_med, d.bytes * 1e-6, d.gbps, floor_s, ratio_s, copy_s, tcopy_s, coop_s);
    printf(r->worst < 1000 ? " %7" PRId64 " %8.3f\n" : " %7" PRId64 " %8.1e\n", r->wrong, r->worst);
  }
  if (nratio)
    printf("# inference target x copy <= %.1f: met by %d of %d library rows\n", BENCH_INFER_TARGET, nmet,
           nratio);
  if (ncopy && run->dev) /* CPU mode's copy is a memcpy: not the target's copy */
    printf("# inference target t/copy <= %.1f (against the timed copy of x): met by %d of %d library rows\n",
           BENCH_INFER_TARGET, ncopy_met, ncopy);
  printf(
      "# inference #wrong: y on the checked channels outside |got-ref| <= atol + rtol*|ref| "
      "(fp32 %g, fp16 %g, bf16 %g; cudnn rows %g, %g; reference: double, sbn_ref_inference of "
      "the same running statistics), plus running_mean and running_var not bitwise what the "
      "call was given\n",
      TOL_F32, TOL_F16, TOL_BF16, TOL_CUDNN_F32, TOL_CUDNN_HALF);
}

/* Median of the speed ratios t_path / t_coop over the main table's rows of one path. */
static void print_ratio_summary(const bench_row_t* rows, int nrows) {
  for (int p = BENCH_PATH_NCCL; p <= BENCH_PATH_SPLIT; p++) {
    double* q[2];
    int n[2] = {0, 0};
    q[0] = malloc((size_t)(nrows + 1) * sizeof(double));
    q[1] = malloc((size_t)(nrows + 1) * sizeof(double));
    if (q[0] && q[1])
      for (int i = 0; i < nrows; i++) {
        if (rows[i].path != (bench_path_t)p) continue;
        for (int fwd = 1; fwd >= 0; fwd--) {
          double v = speed_ratio(&rows[i], fwd);
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

/* ---- the footer ------------------------------------------------------------------------------ */
void report_footer(const bench_run_t* run, const bench_results_t* res) {
  if (run->lat_w > 0) print_latency(res->lat, run->lat_w);
  if (res->ninf > 0) print_inference(run, res->inf, res->ninf);
  printf("#\n");
  if (run->dev) {
    printf("# path: %s\n#       %s\n#       %s\n", kGpuPathLegend[0], kGpuPathLegend[1],
           kGpuPathLegend[2]);
    printf("# t/coop: %s\n", kRatioFormula);
  }
  printf("# %s\n", kBytesFormula);
  if (run->dev) {
    printf("# %%fl(a), %%fl(b): %s; B = %.1f GB/s\n", kFloorFormula, run->B);
    printf(
        "# #wrong: checked values outside |got-ref| <= atol + rtol*|ref| (statistics %g, fp32 "
        "%g, fp16 %g, bf16 %g; reference: double, sbn_ref over all W ranks) in y, dx, save_mean, "
        "save_invstd, running stats, and dweight, dbias (team sums) outside %s, on the checked "
        "channels of one more forward + backward, plus broken bitwise guarantees (ranks agree "
        "on the statistics and the team sums; nccl rows: every output bitwise the coop row's, "
        "one per differing buffer)\n",
        TOL_STAT, TOL_F32, TOL_F16, TOL_BF16, kSumsFormula);
    printf(
        "#         cudnn rows: y, dx, save_mean, save_invstd (not the running stats) at 10x: "
        "statistics %g, fp32 %g, fp16/bf16 %g, dweight and dbias at %g (1 + |ref|) on top of "
        "the bound (cuDNN's reduction and variance algorithm are not ours; a wrong "
        "descriptor, layout or channel order gives errors of order 1)\n",
        TOL_CUDNN_STAT, TOL_CUDNN_F32, TOL_CUDNN_HALF, TOL_CUDNN_F32);
  } else {
    printf(
        "# #wrong: checked values outside |got-ref| <= atol + rtol*|ref| (statistics %g, fp32 "
        "%g, fp16 %g, bf16 %g; reference: double, sbn_ref) in y, dx, save_mean, save_invstd, "
        "running stats, and dweight, dbias outside %s, on the checked channels, plus broken "
        "bitwise guarantees (ranks agree; NCHW == NHWC)\n",
        TOL_STAT, TOL_F32, TOL_F16, TOL_BF16, kSumsFormula);
  }
  printf("# tol used: worst |got-ref| / tolerance of the row (1.0 = at the limit)\n");
  if (run->dev)
    printf(
        "# --: the row did not run (cuDNN not available, or not supported by cuDNN): not a "
        "failure\n");
  print_ratio_summary(res->rows, res->nrows);
  int nlat = 0;
  for (int i = 0; i < res->nlat; i++) nlat += res->lat[i].shape != NULL;
  printf("# rows %d + latency %d + inference %d, failed %d, not run %d, values checked %" PRId64
         ", wrong %" PRId64,
         res->nrows, nlat, res->ninf, res->failed, res->skipped, res->checked, res->wrong);
  if (res->worst) {
    char label[96];
    printf(", worst %.3f of tolerance (%s: %s)", res->worst->worst,
           row_label(res->worst, label, sizeof label), res->worst->worst_what);
  }
  printf("\n# total time %.1f s\n", run->total_s);
  fflush(stdout);
}

void report_end(const char* json_path, int status) {
  if (json_path) printf("# json: %s\n", json_path);
  printf("# %s\n", status == 0 ? "OK" : "FAILED");
}
