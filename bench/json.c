/* json.c — the one JSON writer (--json FILE), for both modes. A regular file is written whole
 * after every row (a temporary file beside it, renamed over it: valid JSON at any moment, a
 * run cut short leaves the rows it finished); anything else (a pipe) once, at the end. The
 * schema, schema 5 (every key always present; null where the mode has no value):
 *
 * Top level: schema 5, complete (false while the run goes on, or when it was cut short),
 *   rows_planned, latency_planned, inference_planned (the rows the run meant to write), tool
 *   "sbn-bench", library_version "0.1.0", commit, date (UTC, ISO 8601), mode "cpu" | "gpu",
 *   why_cpu (CPU mode: why not the GPU; null in GPU mode), path (the path under test:
 *   "coop", CPU mode "cpu"; every row has its own), paths [the paths run: "coop", "nccl",
 *   "cudnn", "split" (--epilogue); CPU mode ["cpu"]], epilogue (--epilogue's: "none",
 *   "relu", "add-relu", "leaky-inplace", "add-leaky-inplace"; each row of the main table
 *   carries it too), team "virtual" |
 *   "cpu", device (GPU mode {index, name, arch "sm_90", pci, sm_count, l2_bytes, memory_bytes}; CPU mode a
 *   string: the CPU team and why not the GPU; a GPU run that failed before it had a device,
 *   the reason as a string, with the device's fields below null, complete and ok false), driver_version (cudaDriverGetVersion: the
 *   CUDA version the driver supports, e.g. 13000), runtime_version and cuda_runtime_version
 *   (both cudaRuntimeGetVersion, e.g. 13000), nvidia_driver (the kernel module's version
 *   from /proc/driver/nvidia/version, e.g. "580.159.04"; null where it cannot be read),
 *   nccl_version
 *   (ncclGetVersion of a dlopen'd libnccl.so.2, e.g. 22809 = 2.28.9; null when not
 *   loadable), nccl_library (what was loaded, or null), cudnn_version (cudnnGetVersion of the
 *   dlopen'd libcudnn.so.9, e.g. 91900 = 9.19.0; null when not loadable), cudnn_library (or
 *   null), cudnn_status ("ok", or why the cudnn rows did not run) — these null in CPU
 *   mode —, sbn_algo_env, sbn_kernel_env (SBN_ALGO, SBN_KERNEL as the caller set them, or
 *   null), cores_online, threads (CPU mode: the team's threads; null), copy_bandwidth {gbps,
 *   bytes, us_median, reps, formula} (null in CPU mode: no B, so no floor in us), ranks (GPU
 *   mode: the W list; CPU mode: the team size, a number), latency_ranks [1..max W] ([] in
 *   CPU mode), scale, warmup, iters, l2_flush_bytes (null in CPU mode), check_channels,
 *   grad_mode "global" | "local" (CPU mode: the library's default), timing, shapes_source,
 *   bytes, floors and ratio (the formulas, as text), tolerance {stat, fp32, fp16, bf16},
 *   tolerance_sums {depth, u, formula} (the bound of dweight and dbias: check.c),
 *   tolerance_cudnn {stat, fp32, half, sums}, inference_formula (the bytes, floor and x_copy
 *   of the inference rows, as text), inference_running_stats (the running statistics the
 *   inference rows are given, as text), inference_target (1.1: x_copy of the library's
 *   inference, the target), rows [...], latency [...] ([] in CPU mode), inference [...] ([]
 *   with --epilogue, or --paths without coop and cudnn), wrong, failed_rows, skipped_rows
 *   (every table's rows), total_s (so far), ok (complete, nothing wrong or failed, and the
 *   table written to stdout).
 * rows and latency: flat objects, one per (shape, dtype, layout, W, path), in run order:
 *   path        "coop" | "nccl" | "cudnn" | "split" | "cpu"
 *   shape, where, n, c, h, w, spatial, dtype ("fp32" | "bf16" | "fp16"), layout ("NCHW" |
 *               "NHWC"), ranks (W; 1 for cudnn), kernel {fwd, bwd} (what ran, "" if nothing)
 *   bytes_x_rank, bytes_x_total   bytes of one rank's x, of all W ranks' x
 *   us_fwd, us_bwd, gbps_fwd, gbps_bwd   the median times and GB/s per rank of fwd and bwd
 *   fwd, bwd    {us_median, us_min, us_p90, host_us_median, bytes_rank, bytes_total,
 *               gbps_rank, gbps_total, floor_a_bytes, floor_b_bytes, floor_a_us, floor_b_us,
 *               pct_floor_a, pct_floor_b}; times in us (GPU: CUDA events, host_us_median the
 *               enqueueing calls; CPU: the wall time of the calls, both), null when the row
 *               failed or did not run. bytes and floors (floors.c, the one definition:
 *               floor_*_bytes of all W ranks, floor_*_us = bytes / B) are always there;
 *               floor_*_us and pct_floor_* are null in CPU mode (no B)
 *   checked, wrong, tol_used (worst |got-ref| / tolerance; cudnn rows: of tolerance_cudnn;
 *               an nccl row whose outputs are bitwise the coop row's: the coop row's),
 *               worst (where), error (null, or why the row failed)
 *   note        "" or the path's remark: "nccl-path on a virtual team: stats kernel, ...",
 *               the cuDNN mode used, "cuDNN not available: ...", "not supported by cuDNN:
 *               ..." (a row that did not run has error null, timings null and says why here)
 * inference: flat objects, one per (shape, dtype, layout, path), in run order; W = 1, no team:
 *   path        "coop" (sbnForwardInference on device pointers) | "cudnn"
 *               (cudnnBatchNormalizationForwardInference, CUDNN_BATCHNORM_SPATIAL) | "cpu"
 *               (CPU mode: sbnForwardInference on host pointers)
 *   shape, where, n, c, h, w, spatial, dtype, layout, ranks (1)   as in rows
 *   kernel      what ran: "infer" (the library's inference kernel), "cudnn", "cpu"; "" if nothing
 *   us_median, us_min, us_p90, host_us_median   the call's times in us (GPU: CUDA events, L2
 *               flushed before each call, host_us_median the enqueueing call; CPU: the wall
 *               time of the call, both); null when the row failed or did not run
 *   bytes       2|x| (read x, write y), exact
 *   gbps        bytes / us_median (null without a time)
 *   floor_us    bytes / B: a device-to-device copy of x (null in CPU mode: no B)
 *   x_copy      us_median / floor_us, the target's measure (<= inference_target); null
 *               without either
 *   copy_us_median  a copy of x into y timed as the call, on the same buffers (GPU:
 *               cudaMemcpyAsync device to device behind the L2 flush; CPU: memcpy); a cudnn
 *               row: its coop row's; null without one
 *   t_over_copy us_median / copy_us_median: the target against a copy that pays its own
 *               launch (<= inference_target); null without either
 *   t_over_coop cudnn rows: us_median / the coop row's of the same shape, dtype and layout;
 *               null otherwise or without both times
 *   checked, wrong, tol_used, worst, error, note   as in rows (checked: y on the checked
 *               channels and the running statistics, which must stay bitwise as given)
 * Speed ratios of rows and latency are not stored: t_path / t_coop from the rows of the same
 * shape, dtype, layout and W (cudnn: the coop row with ranks 1).
 * Schema 1 (no "schema" key) was two: GPU-mode rows with fwd and bwd objects, CPU-mode rows
 * with us_fwd, us_bwd, gbps_fwd and gbps_bwd alone. Schema 2 writes both in every row of
 * either mode and adds floor_a_bytes, floor_b_bytes. Schema 3 adds complete, rows_planned,
 * latency_planned (a file may hold part of a run), tolerance_sums and tolerance_cudnn.sums;
 * rows and latency hold the finished rows only. Schema 4 adds the inference table:
 * inference_planned, inference_formula, inference_running_stats, inference_target and
 * inference (finished rows only); every key of schema 3 is unchanged. Schema 5: tolerance's
 * half (fp16 and bf16 alike, 1e-2) is fp16 (2e-3) and bf16 (1e-2); tolerance_cudnn keeps half;
 * nothing else changed. */
#define _XOPEN_SOURCE 700 /* realpath */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "sbn_bench_commit.h" /* generated at build time: SBN_BENCH_COMMIT */

/* A JSON string of s; a byte that is not part of well-formed UTF-8 (a path or an
   environment variable's value in another encoding) is written as U+FFFD: the file stays
   UTF-8, which JSON readers require. */
static void json_string(FILE* f, const char* s) {
  fputc('"', f);
  long bad = utf8_bad_at(s);
  for (long i = 0; s[i]; i++) {
    if (i == bad) {
      fputs("\\ufffd", f);
      bad = utf8_bad_at(s + i + 1);
      if (bad >= 0) bad += i + 1;
      continue;
    }
    unsigned char ch = (unsigned char)s[i];
    if (ch == '"' || ch == '\\')
      fprintf(f, "\\%c", ch);
    else if (ch < 0x20)
      fprintf(f, "\\u%04x", ch);
    else
      fputc(ch, f);
  }
  fputc('"', f);
}

static void json_string_or_null(FILE* f, const char* s) {
  if (s)
    json_string(f, s);
  else
    fprintf(f, "null");
}

/* An integer where there is one (have != 0), else null. */
static void json_int_or_null(FILE* f, int have, long long v) {
  if (have)
    fprintf(f, "%lld", v);
  else
    fprintf(f, "null");
}

static void json_number(FILE* f, double v) {
  if (isfinite(v))
    fprintf(f, "%.6g", v);
  else
    fprintf(f, "null");
}

static void json_op(FILE* f, const bench_row_t* r, int fwd, double B) {
  const bench_times_t* t = &r->t[fwd];
  const int ok = row_timed(r);
  const bench_op_derived_t d = op_derived(r, fwd, B);
  fprintf(f, "{\"us_median\": ");
  json_number(f, ok ? t->med : NAN);
  fprintf(f, ", \"us_min\": ");
  json_number(f, ok ? t->min : NAN);
  fprintf(f, ", \"us_p90\": ");
  json_number(f, ok ? t->p90 : NAN);
  fprintf(f, ", \"host_us_median\": ");
  json_number(f, ok ? t->host_med : NAN);
  /* bytes: exact */
  fprintf(f, ", \"bytes_rank\": %.0f, \"bytes_total\": %.0f", d.bytes_rank, d.bytes_total);
  fprintf(f, ", \"gbps_rank\": ");
  json_number(f, d.gbps_rank);
  fprintf(f, ", \"gbps_total\": ");
  json_number(f, d.gbps_total);
  fprintf(f, ", \"floor_a_bytes\": %.0f, \"floor_b_bytes\": %.0f", d.floor_a_bytes,
          d.floor_b_bytes);
  fprintf(f, ", \"floor_a_us\": ");
  json_number(f, d.floor_a_us);
  fprintf(f, ", \"floor_b_us\": ");
  json_number(f, d.floor_b_us);
  fprintf(f, ", \"pct_floor_a\": ");
  json_number(f, d.pct_a);
  fprintf(f, ", \"pct_floor_b\": ");
  json_number(f, d.pct_b);
  fprintf(f, "}");
}

/* What names a row in the JSON: its path (and, for the main table, the epilogue), shape,
   sizes, dtype, layout and W; the object's opening brace. */
static void json_row_head(FILE* f, const bench_row_t* r, int with_epilogue) {
  fprintf(f, "{\"path\": \"%s\"", kPathNames[r->path]);
  if (with_epilogue) fprintf(f, ", \"epilogue\": \"%s\"", kEpilogueNames[r->epilogue]);
  fprintf(f, ", \"shape\": ");
  json_string(f, r->shape->id);
  fprintf(f, ", \"where\": ");
  json_string(f, r->shape->where);
  fprintf(f,
          ", \"n\": %" PRId64 ", \"c\": %" PRId64 ", \"h\": %" PRId64 ", \"w\": %" PRId64
          ", \"spatial\": %" PRId64 ", \"dtype\": \"%s\", \"layout\": \"%s\", \"ranks\": %d",
          r->shape->n, r->shape->c, r->shape->h, r->shape->w, r->spatial, kDtypeNames[r->dtype],
          kLayoutNames[r->layout], r->W);
}
/* A row's check (checked, wrong, tol_used, worst), error and note; the closing brace. */
static void json_row_tail(FILE* f, const bench_row_t* r) {
  fprintf(f, ",\n     \"checked\": %" PRId64 ", \"wrong\": %" PRId64 ", \"tol_used\": ", r->checked,
          r->wrong);
  json_number(f, r->worst);
  fprintf(f, ", \"worst\": ");
  json_string(f, r->worst_what);
  fprintf(f, ", \"error\": ");
  json_string_or_null(f, r->error[0] ? r->error : NULL);
  fprintf(f, ", \"note\": ");
  json_string(f, r->note);
  fprintf(f, "}");
}

/* A row of the inference table (W = 1; the times of the one op in t[1]). */
static void json_infer_row(FILE* f, const bench_row_t* r, double B) {
  const int ok = row_timed(r);
  const bench_infer_derived_t d = infer_derived(r, B);
  const bench_row_t* c = r->coop;
  json_row_head(f, r, 0);
  fprintf(f, ", \"kernel\": ");
  json_string(f, r->kernel[1]);
  fprintf(f, ",\n     \"us_median\": ");
  json_number(f, ok ? r->t[1].med : NAN);
  fprintf(f, ", \"us_min\": ");
  json_number(f, ok ? r->t[1].min : NAN);
  fprintf(f, ", \"us_p90\": ");
  json_number(f, ok ? r->t[1].p90 : NAN);
  fprintf(f, ", \"host_us_median\": ");
  json_number(f, ok ? r->t[1].host_med : NAN);
  fprintf(f, ", \"bytes\": %.0f, \"gbps\": ", d.bytes);
  json_number(f, d.gbps);
  fprintf(f, ", \"floor_us\": ");
  json_number(f, d.floor_us);
  fprintf(f, ", \"x_copy\": ");
  json_number(f, d.ratio);
  fprintf(f, ", \"copy_us_median\": ");
  json_number(f, d.copy_us);
  fprintf(f, ", \"t_over_copy\": ");
  json_number(f, d.t_over_copy);
  fprintf(f, ", \"t_over_coop\": ");
  json_number(f, ok && c && c != r && row_timed(c) && c->t[1].med > 0 ? r->t[1].med / c->t[1].med : NAN);
  json_row_tail(f, r);
}

static void json_row(FILE* f, const bench_row_t* r, double B) {
  const int ok = row_timed(r);
  json_row_head(f, r, 1);
  fprintf(f, ", \"kernel\": {\"fwd\": ");
  json_string(f, r->kernel[1]);
  fprintf(f, ", \"bwd\": ");
  json_string(f, r->kernel[0]);
  fprintf(f, "}, \"bytes_x_rank\": %.0f, \"bytes_x_total\": %.0f", row_x_bytes(r),
          row_x_bytes(r) * r->W);
  fprintf(f, ",\n     \"us_fwd\": ");
  json_number(f, ok ? r->t[1].med : NAN);
  fprintf(f, ", \"us_bwd\": ");
  json_number(f, ok ? r->t[0].med : NAN);
  fprintf(f, ", \"gbps_fwd\": ");
  json_number(f, op_derived(r, 1, B).gbps_rank);
  fprintf(f, ", \"gbps_bwd\": ");
  json_number(f, op_derived(r, 0, B).gbps_rank);
  fprintf(f, ",\n     \"fwd\": ");
  json_op(f, r, 1, B);
  fprintf(f, ",\n     \"bwd\": ");
  json_op(f, r, 0, B);
  json_row_tail(f, r);
}

/* What only GPU mode knows: the device, the runtime libraries, B. */
static void json_gpu_top(FILE* f, const bench_run_t* run) {
  const bench_device_info_t* g = run->dev;
  char arch[32];
  fprintf(f, "  \"device\": {\"index\": %d, \"name\": ", g->index);
  json_string(f, g->name);
  snprintf(arch, sizeof arch, "sm_%d%d", g->cc_major, g->cc_minor);
  fprintf(f, ", \"arch\": ");
  json_string(f, arch);
  fprintf(f, ", \"pci\": ");
  json_string(f, g->pci);
  fprintf(f, ", \"sm_count\": %d, \"l2_bytes\": %d, \"memory_bytes\": %zu},\n", g->sms, g->l2_bytes,
          g->mem_total);
  fprintf(f,
          "  \"driver_version\": %d,\n  \"runtime_version\": %d,\n"
          "  \"cuda_runtime_version\": %d,\n  \"nvidia_driver\": ",
          g->driver, g->runtime, g->runtime);
  json_string_or_null(f, g->nvidia_driver[0] ? g->nvidia_driver : NULL);
  fprintf(f, ",\n  \"nccl_version\": ");
  json_int_or_null(f, run->nccl.version >= 0, run->nccl.version);
  fprintf(f, ",\n  \"nccl_library\": ");
  json_string_or_null(f, run->nccl.loaded ? run->nccl.from : NULL);
  fprintf(f, ",\n  \"cudnn_version\": ");
  json_int_or_null(f, run->cudnn.version >= 0, run->cudnn.version);
  fprintf(f, ",\n  \"cudnn_library\": ");
  json_string_or_null(f, run->cudnn.loaded ? run->cudnn.from : NULL);
  fprintf(f, ",\n  \"cudnn_status\": ");
  json_string(f, run->cudnn.why[0] ? run->cudnn.why : "ok");
  fprintf(f, ",\n");
}

int json_open(bench_json_t* j, const char* path) {
  memset(j, 0, sizeof *j);
  j->path = path;
  struct stat st;
  if (stat(path, &st) == 0 && !S_ISREG(st.st_mode)) {
    /* a pipe or a terminal: written as it is, at the end */
    j->f = fopen(path, "a");
    return j->f ? 0 : -1;
  }
  j->created = access(path, F_OK) != 0;
  /* append mode: an existing file is checked for writing, not emptied before the run */
  FILE* f = fopen(path, "a");
  if (!f) return -1;
  fclose(f);
  /* renaming over a symbolic link would replace the link: write what it names */
  char* real = realpath(path, NULL);
  if (!real) return -1;
  if (strlen(real) >= sizeof j->target) {
    free(real);
    errno = ENAMETOOLONG;
    return -1;
  }
  snprintf(j->target, sizeof j->target, "%s", real);
  free(real);
  snprintf(j->tmp, sizeof j->tmp, "%s.tmp%ld", j->target, (long)getpid());
  f = fopen(j->tmp, "w");
  if (!f) {
    const int e = errno;
    if (j->created) remove(path);
    errno = e;
    return -1;
  }
  fclose(f);
  remove(j->tmp);
  return 0;
}

void json_discard(bench_json_t* j) {
  if (j->f) {
    fclose(j->f);
    j->f = NULL;
  } else if (j->path && j->created && !j->written) {
    remove(j->path);
  }
  j->path = NULL;
}

static void json_emit(FILE* f, const bench_opts_t* o, const bench_run_t* run,
                      const bench_results_t* res, int complete);

int json_write(bench_json_t* j, const bench_opts_t* o, const bench_run_t* run,
               const bench_results_t* res, int complete) {
  if (!j->path) return 0;
  if (j->f) {
    if (!complete) return 0;
    FILE* f = j->f;
    j->f = NULL;
    json_emit(f, o, run, res, complete);
    const int failed = ferror(f);
    j->written = 1;
    return fclose(f) == 0 && !failed ? 0 : -1;
  }
  FILE* f = fopen(j->tmp, "w");
  if (!f) return -1;
  json_emit(f, o, run, res, complete);
  const int failed = ferror(f);
  if (fclose(f) != 0 || failed || rename(j->tmp, j->target) != 0) {
    const int e = errno;
    remove(j->tmp);
    errno = e;
    return -1;
  }
  j->written = 1;
  return 0;
}

static void json_emit(FILE* f, const bench_opts_t* o, const bench_run_t* run,
                      const bench_results_t* res, int complete) {
  /* GPU mode: a device, or a GPU run that failed before it had one (gpu_failed: device the
     reason, as text; the device's fields null) */
  const int gpu = run->dev != NULL || run->gpu_failed;
  char ver[32];
  snprintf(ver, sizeof ver, "%d.%d.%d", run->version / 10000, run->version / 100 % 100,
           run->version % 100);
  int nlat = 0;
  for (int i = 0; i < res->nlat; i++) nlat += res->lat[i].shape != NULL;
  fprintf(f,
          "{\n  \"schema\": 5,\n  \"complete\": %s,\n  \"rows_planned\": %d,\n"
          "  \"latency_planned\": %d,\n  \"inference_planned\": %d,\n  \"tool\": \"sbn-bench\",\n"
          "  \"library_version\": ",
          complete ? "true" : "false", res->nrows, nlat, res->ninf);
  json_string(f, ver);
  fprintf(f, ",\n  \"commit\": ");
  json_string(f, SBN_BENCH_COMMIT);
  fprintf(f, ",\n  \"date\": ");
  json_string(f, run->date);
  fprintf(f, ",\n  \"mode\": \"%s\",\n  \"why_cpu\": ", gpu ? "gpu" : "cpu");
  json_string_or_null(f, gpu ? NULL : run->why_cpu);
  fprintf(f, ",\n  \"path\": \"%s\",\n  \"paths\": [", gpu ? "coop" : "cpu");
  if (gpu) {
    for (int p = 0, k = 0; p < BENCH_GPU_PATHS; p++)
      if (o->path_on[p]) fprintf(f, "%s\"%s\"", k++ ? ", " : "", kPathNames[p]);
  } else {
    fprintf(f, "\"%s\"", kPathNames[BENCH_PATH_CPU]);
  }
  fprintf(f, "],\n  \"epilogue\": \"%s\",\n  \"team\": \"%s\",\n", kEpilogueNames[o->epilogue],
          gpu ? "virtual" : "cpu");
  if (run->dev) {
    json_gpu_top(f, run);
  } else {
    fprintf(f, "  \"device\": ");
    json_string(f, run->device);
    fprintf(f,
            ",\n  \"driver_version\": null,\n  \"runtime_version\": null,\n"
            "  \"cuda_runtime_version\": null,\n  \"nvidia_driver\": null,\n"
            "  \"nccl_version\": null,\n"
            "  \"nccl_library\": null,\n  \"cudnn_version\": null,\n  \"cudnn_library\": null,\n"
            "  \"cudnn_status\": null,\n");
  }
  fprintf(f, "  \"sbn_algo_env\": ");
  json_string_or_null(f, run->algo_env);
  fprintf(f, ",\n  \"sbn_kernel_env\": ");
  json_string_or_null(f, getenv("SBN_KERNEL"));
  fprintf(f, ",\n  \"cores_online\": %ld,\n  \"threads\": ", run->cores);
  json_int_or_null(f, !gpu, o->ranks);
  fprintf(f, ",\n  \"copy_bandwidth\": ");
  if (run->dev) {
    fprintf(f, "{\"gbps\": ");
    json_number(f, run->dev->copy_gbps);
    fprintf(f, ", \"bytes\": %zu, \"us_median\": ", run->dev->copy_bytes);
    json_number(f, run->dev->copy_us);
    fprintf(f,
            ", \"reps\": %d, \"formula\": \"B = 2*bytes/time (device-to-device "
            "cudaMemcpyAsync: every byte read and written)\"}",
            BENCH_GPU_COPY_REPS);
  } else {
    fprintf(f, "null");
  }
  fprintf(f, ",\n  \"ranks\": ");
  if (gpu) {
    fprintf(f, "[");
    for (int i = 0; i < o->nranks_list; i++) fprintf(f, "%s%d", i ? ", " : "", o->ranks_list[i]);
    fprintf(f, "]");
  } else {
    fprintf(f, "%d", o->ranks);
  }
  fprintf(f, ",\n  \"latency_ranks\": [");
  for (int W = 1; W <= run->lat_w; W++) fprintf(f, "%s%d", W > 1 ? ", " : "", W);
  fprintf(f, "],\n  \"scale\": %d,\n  \"warmup\": %d,\n  \"iters\": %d,\n  \"l2_flush_bytes\": ",
          o->scale, o->warmup, o->iters);
  json_int_or_null(f, run->dev != NULL, run->dev ? (long long)run->dev->flush_bytes : 0);
  fprintf(f, ",\n  \"check_channels\": %d,\n  \"grad_mode\": \"%s\",\n  \"timing\": ",
          o->check_channels, gpu ? "global" : "local");
  json_string(f, gpu ? "CUDA events recorded around the op only; L2 flushed (memset) before "
                       "every call, outside the events"
                     : "wall clock around each op's group (sbnGroupStart..sbnGroupEnd)");
  fprintf(f, ",\n  \"shapes_source\": ");
  json_string(f, run->shapes_source);
  fprintf(f, ",\n  \"bytes\": ");
  json_string(f, kBytesFormula);
  fprintf(f, ",\n  \"floors\": ");
  json_string(f, kFloorFormula);
  fprintf(f, ",\n  \"ratio\": ");
  json_string(f, kRatioFormula);
  fprintf(f, ",\n  \"tolerance\": {\"stat\": %g, \"fp32\": %g, \"fp16\": %g, \"bf16\": %g},\n",
          TOL_STAT, TOL_F32, TOL_F16, TOL_BF16);
  fprintf(f, "  \"tolerance_cudnn\": {\"stat\": %g, \"fp32\": %g, \"half\": %g, \"sums\": %g},\n",
          TOL_CUDNN_STAT, TOL_CUDNN_F32, TOL_CUDNN_HALF, TOL_CUDNN_F32);
  fprintf(f, "  \"tolerance_sums\": {\"depth\": %d, \"u\": %.9g, \"formula\": ", BENCH_SUM_DEPTH,
          1.0 / 16777216.0);
  json_string(f, kSumsFormula);
  fprintf(f, "},\n  \"inference_formula\": ");
  json_string(f, kInferFormula);
  fprintf(f, ",\n  \"inference_running_stats\": ");
  json_string(f, kInferStatsFormula);
  fprintf(f, ",\n  \"inference_target\": %g,\n", BENCH_INFER_TARGET);
  fprintf(f, "  \"rows\": [");
  for (int i = 0, k = 0; i < res->nrows; i++) {
    if (!res->rows[i].done) continue;
    fprintf(f, "%s\n    ", k++ ? "," : "");
    json_row(f, &res->rows[i], run->B);
  }
  fprintf(f, "\n  ],\n  \"latency\": [");
  for (int i = 0, k = 0; i < res->nlat; i++) {
    if (!res->lat[i].done) continue;
    fprintf(f, "%s\n    ", k++ ? "," : "");
    json_row(f, &res->lat[i], run->B);
  }
  fprintf(f, "\n  ],\n  \"inference\": [");
  for (int i = 0, k = 0; i < res->ninf; i++) {
    if (!res->inf[i].done) continue;
    fprintf(f, "%s\n    ", k++ ? "," : "");
    json_infer_row(f, &res->inf[i], run->B);
  }
  fprintf(f,
          "\n  ],\n  \"wrong\": %" PRId64
          ",\n  \"failed_rows\": %d,\n  \"skipped_rows\": %d,\n"
          "  \"total_s\": ",
          res->wrong, res->failed, res->skipped);
  json_number(f, complete ? run->total_s : (now_us() - run->t_start) * 1e-6);
  fprintf(f, ",\n  \"ok\": %s\n}\n",
          complete && res->wrong == 0 && res->failed == 0 && !run->table_failed ? "true" : "false");
}
