/* sbn-bench — times SyncBN forward and backward on real per-GPU shapes and checks every
 * result against the double-precision reference (reference/sbn_ref.h). main.c chooses the
 * mode and runs the rows; the other files each have one job (bench.h lists them).
 *
 * For each shape of bench/shapes.tsv (embedded at build time; --shapes overrides) x dtype
 * x layout, every rank of a team of W holds that shape's tensor (N, C, H*W): the shapes
 * are per GPU. Every row is checked: y, save_mean, save_invstd, the running stats, dx,
 * dweight and dbias against the reference on up to 16 channels spread over C, plus the
 * bitwise guarantees (every rank has the same statistics).
 *
 * Two modes; the header says which one ran and why (--gpu auto|on|off, default auto):
 *
 * GPU mode — the build has CUDA (SBN_BENCH_HAVE_CUDA) and cudaGetDeviceCount > 0: VIRTUAL
 *   teams, W ranks on GPU 0 (sbnCommInitVirtual), for every W of -w (default 1,2,4,8), and
 *   per row one of three paths (--paths, default all): coop and nccl (syncbn.c), cudnn at
 *   W = 1 (cudnn.c). Every rank holds the full per-GPU shape, so a W-rank row moves W x one
 *   GPU's bytes through one GPU. Real sizes (--scale 1). Every path is timed the same way
 *   (gpu.c: CUDA events, L2 flushed before every call, median / min / p90 of -i calls after
 *   --warmup); B, the copy bandwidth measured in the same run, gives each row's floors
 *   (floors.c). After the timed calls, one more forward + backward on fresh inputs is
 *   copied back and checked. Then a latency table for every W from 1 to the largest of -w,
 *   coop and nccl: a tiny op (N=4, C=512, 1x1, fp32 NCHW, like S10) and an empty one (n=0
 *   on every rank), forward and backward: empty(W) - empty(1) is what the exchange with
 *   W-1 peers adds. And an inference table (not with --epilogue): per shape x dtype x
 *   layout, W = 1 (no team), sbnForwardInference on device pointers (coop) and cuDNN's
 *   cudnnBatchNormalizationForwardInference (cudnn), timed as the other rows, against the
 *   copy floor 2|x|/B (t / floor: "x a copy of x", the target <= 1.1), y checked; run
 *   after the main rows of each shape x dtype x layout, on the same host inputs. The
 *   default W list is not trimmed for the large shapes: by the byte
 *   count, the GPU time of the whole default run is seconds on an H100 (at W=8, S8 fp32 is
 *   1.2 GB per tensor); host-side input generation (threaded; once per shape x dtype x
 *   layout, for the largest W), copies and the checks dominate: estimated 3-5 minutes (not
 *   measured on a GPU machine yet).
 *
 * CPU mode — otherwise (a build without CUDA, no device, --gpu off): the CPU team (ranks
 *   are host threads), W = -w (default 2), shapes scaled down by --scale (default 8).
 *   Each timed call is one group, timed on the wall clock; median of -i calls (default 5)
 *   after --warmup (default 1). Also checks that NCHW and NHWC of the same data give the
 *   same bits (a CPU-team guarantee only). The inference table (not with --epilogue):
 *   sbnForwardInference on host memory (W = 1), timed on the wall clock and checked.
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
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "paths.h"

static void row_init(bench_row_t* r, const bench_shape_t* shape, int64_t spatial,
                     sbnDataType_t dtype, sbnLayout_t layout, int W, bench_path_t path) {
  r->shape = shape;
  r->spatial = spatial;
  r->dtype = dtype;
  r->layout = layout;
  r->W = W;
  r->path = path;
}

/* The JSON of the run so far, rewritten whole (a failure to write it is said once and ends
   the rewriting). */
static void json_progress(const char* argv0, const bench_opts_t* o, bench_run_t* run,
                          const bench_results_t* res) {
  if (run->json.path && json_write(&run->json, o, run, res, 0) != 0) {
    fprintf(stderr, "%s: cannot write %s: %s\n", argv0, o->json_file, strerror(errno));
    run->json_failed = 1;
    json_discard(&run->json);
  }
}

/* A GPU run that failed before it had a device: its JSON says so (mode gpu, device the
   reason, the device's fields null, no rows, complete and ok false), where an earlier
   run's file would stay in place. */
#if SBN_BENCH_HAVE_CUDA
static void gpu_failed_json(const char* argv0, const bench_opts_t* o, bench_run_t* run,
                            const char* what, const char* why) {
  run->gpu_failed = 1;
  snprintf(run->device, sizeof run->device, "none: %s: %.300s", what, why);
  bench_results_t none;
  memset(&none, 0, sizeof none);
  json_progress(argv0, o, run, &none);
}
#endif

/* The rows are planned: the JSON is valid (no row yet, complete: false) before the first
   row runs, so a run stopped during it leaves a file that parses; then the plan is said on
   stderr. */
static void plan_done(const char* argv0, const bench_opts_t* o, bench_run_t* run,
                      const bench_results_t* res) {
  json_progress(argv0, o, run, res);
  report_plan(run, res);
}

/* A row has finished: into the totals, the table (stdout), the progress (stderr) and the
   JSON. */
static void row_done(const char* argv0, const bench_opts_t* o, bench_run_t* run,
                     bench_results_t* res, bench_row_t* r, int in_table) {
  r->done = 1;
  run->finished++;
  /* the plan said the rows in run order (GPU mode): a row out of it would make "plan k/N"
     and "done k/N" name different rows */
  if (res->order && res->order[run->finished - 1] != r) {
    char label[96];
    fprintf(stderr, "%s: done %d/%d is %s, which the plan put elsewhere (sbn-bench's own mistake)\n", argv0,
            run->finished, run->planned, row_label(r, label, sizeof label));
  }
  results_add(res, r);
  if (in_table) report_row(run, r);
  report_progress(run, r);
  json_progress(argv0, o, run, res);
}

/* Writes the JSON (when asked) a last time, complete, and the last lines; the exit status. */
static int finish(const char* argv0, const bench_opts_t* o, bench_run_t* run,
                  const bench_results_t* res) {
  /* the table so far written out before the JSON's last write, whose ok says so too */
  if (fflush(stdout) != 0 || ferror(stdout)) run->table_failed = 1;
  int status = (res->wrong == 0 && res->failed == 0 && !run->json_failed && !run->table_failed) ? 0 : 1;
  const char* written = NULL;
  if (run->json.path) {
    if (json_write(&run->json, o, run, res, 1) != 0) {
      fprintf(stderr, "%s: cannot write %s: %s\n", argv0, o->json_file, strerror(errno));
      status = 1;
    } else {
      written = o->json_file;
    }
  }
  report_end(written, status);
  /* the table is the main job's output: one that could not be written (a full disk, a
     closed stdout) is a failed run, not a silent exit 0 */
  if (fflush(stdout) != 0 || ferror(stdout)) {
    fprintf(stderr, "%s: cannot write the table to standard output: %s\n", argv0, strerror(errno));
    status = 1;
  }
  return status;
}

/* After a row that failed: a team its failure aborted (a timeout: a tiny SBN_TIMEOUT_MS,
   more ranks than the cores can keep up with) fails every later op without running it,
   so the next rows get a new team. 0, or -1 when the new team could not be made (the
   comms then all NULL). */
static int cpu_team_renew(const char* argv0, sbnComm_t* comms, int ranks, const sbnConfig_t* cfg,
                          const bench_row_t* row) {
  sbnResult_t async = sbnSuccess;
  if (sbnCommGetAsyncError(comms[0], &async) != sbnSuccess || async == sbnSuccess) return 0;
  char label[96];
  fprintf(stderr, "%s: the CPU team was aborted (%s) in row %s; a new team runs the rows after it\n",
          argv0, sbnGetResultName(async), row_label(row, label, sizeof label));
  for (int r = 0; r < ranks; r++) {
    sbnCommDestroy(comms[r]);
    comms[r] = NULL;
  }
  sbnResult_t rc = sbnCommInitCpu(comms, ranks, cfg);
  if (rc == sbnSuccess) return 0;
  fprintf(stderr, "%s: sbnCommInitCpu(%d ranks): %s: %s\n", argv0, ranks, sbnGetResultName(rc),
          sbnGetLastError(NULL));
  return -1; /* the comms NULL since the destroys: a failed init writes none */
}

/* CPU mode: the CPU team of o->ranks ranks over every shape x dtype x layout. */
static int cpu_main(const char* argv0, const bench_opts_t* o, const bench_shape_t* shapes,
                    int nshapes, bench_run_t* run) {
  bench_results_t res;
  memset(&res, 0, sizeof res);
  res.rows = calloc((size_t)nshapes * 6, sizeof *res.rows);
  res.inf = calloc((size_t)nshapes * 6, sizeof *res.inf);
  if (!res.rows || !res.inf) {
    free(res.rows);
    free(res.inf);
    return 1;
  }
  /* the inference table (not with --epilogue): sbnForwardInference on host memory, W = 1 */
  run->infer = o->epilogue == BENCH_EPI_NONE;
  int64_t max_c = 1;
  for (int s = 0; s < nshapes; s++) {
    if (shapes[s].c > max_c) max_c = shapes[s].c;
    for (int t = 0; t < SBN_DTYPE_COUNT; t++) {
      if (!o->dtype_on[kDtypeOrder[t]]) continue;
      for (int l = 0; l < 2; l++)
        if (o->layout_on[l]) {
          const int64_t spatial = shape_spatial(&shapes[s], o->scale);
          row_init(&res.rows[res.nrows++], &shapes[s], spatial, kDtypeOrder[t], (sbnLayout_t)l,
                   o->ranks, BENCH_PATH_CPU);
          if (run->infer) {
            row_init(&res.inf[res.ninf], &shapes[s], spatial, kDtypeOrder[t], (sbnLayout_t)l, 1,
                     BENCH_PATH_CPU);
            res.inf[res.ninf++].inference = 1;
          }
        }
    }
  }
  run->planned = res.nrows + res.ninf;
  for (int i = 0; i < res.nrows; i++) res.rows[i].epilogue = o->epilogue;

  /* the JSON of the plan first: a run that fails before its first row (the team's init)
     leaves a file saying so (complete: false, ok: false), not an earlier run's */
  json_progress(argv0, o, run, &res);
  sbnComm_t* comms = calloc((size_t)o->ranks, sizeof *comms);
  sbnConfig_t cfg = SBN_CONFIG_INITIALIZER;
  if (max_c > cfg.max_channels) cfg.max_channels = max_c;
  sbnResult_t rc = comms ? sbnCommInitCpu(comms, o->ranks, &cfg) : sbnSystemError;
  if (rc != sbnSuccess) {
    fprintf(stderr, "%s: sbnCommInitCpu(%d ranks): %s: %s\n", argv0, o->ranks, sbnGetResultName(rc),
            sbnGetLastError(NULL));
    free(comms);
    free(res.rows);
    free(res.inf);
    return 1;
  }

  report_header(o, run);
  plan_done(argv0, o, run, &res);
  bench_layout_keep_t keep;
  memset(&keep, 0, sizeof keep);
  int team_ok = 1;
  for (int i = 0; i < res.nrows; i++) {
    if (team_ok)
      syncbn_cpu_row(&res.rows[i], comms, o, &keep);
    else
      snprintf(res.rows[i].error, sizeof res.rows[i].error,
               "not run: no CPU team (a new one could not be made after an abort)");
    row_done(argv0, o, run, &res, &res.rows[i], 1);
    if (team_ok && res.rows[i].error[0] && i + 1 < res.nrows &&
        cpu_team_renew(argv0, comms, o->ranks, &cfg, &res.rows[i]) != 0)
      team_ok = 0;
  }
  keep_free(&keep);
  for (int r = 0; r < o->ranks; r++) sbnCommDestroy(comms[r]); /* NULL is accepted */
  free(comms);
  /* the inference table, after the training rows (it needs no team) */
  for (int i = 0; i < res.ninf; i++) {
    syncbn_cpu_infer_row(&res.inf[i], o);
    row_done(argv0, o, run, &res, &res.inf[i], 0);
  }
  run->total_s = (now_us() - run->t_start) * 1e-6;
  report_footer(run, &res);
  int status = finish(argv0, o, run, &res);
  free(res.rows);
  free(res.inf);
  return status;
}

#if SBN_BENCH_HAVE_CUDA
static int same_sdl(const bench_row_t* a, const bench_row_t* b) {
  return a->shape == b->shape && a->dtype == b->dtype && a->layout == b->layout;
}

/* GPU mode's rows in run order: per shape x dtype x layout, per W of -w: coop, nccl, split
   (--epilogue), then cudnn when W is 1 (-w may repeat 1). The count. */
static int gpu_plan(const bench_opts_t* o, const bench_shape_t* shapes, int nshapes,
                    bench_row_t* rows) {
  const int run_cudnn = o->path_on[BENCH_PATH_CUDNN];
  int n = 0;
  for (int s = 0; s < nshapes; s++) {
    const int64_t spatial = shape_spatial(&shapes[s], o->scale);
    for (int t = 0; t < SBN_DTYPE_COUNT; t++) {
      if (!o->dtype_on[kDtypeOrder[t]]) continue;
      for (int l = 0; l < 2; l++) {
        if (!o->layout_on[l]) continue;
        for (int wi = 0; wi < o->nranks_list; wi++) {
          const int W = o->ranks_list[wi];
          bench_row_t* coop = NULL;
          static const bench_path_t lib[3] = {BENCH_PATH_COOP, BENCH_PATH_NCCL, BENCH_PATH_SPLIT};
          for (int k = 0; k < 3; k++) {
            const bench_path_t p = lib[k];
            if (!o->path_on[p]) continue;
            row_init(&rows[n], &shapes[s], spatial, kDtypeOrder[t], (sbnLayout_t)l, W, p);
            rows[n].epilogue = o->epilogue;
            if (p == BENCH_PATH_COOP) coop = &rows[n];
            if (p != BENCH_PATH_COOP) rows[n].coop = coop;
            n++;
          }
          if (W == 1 && run_cudnn) {
            row_init(&rows[n], &shapes[s], spatial, kDtypeOrder[t], (sbnLayout_t)l, 1,
                     BENCH_PATH_CUDNN);
            rows[n].epilogue = o->epilogue;
            rows[n++].coop = coop;
          }
        }
      }
    }
  }
  return n;
}

/* GPU mode's inference rows in run order: per shape x dtype x layout (W = 1, whatever -w
   says: no team), coop then cudnn, as --paths has them. The count. */
static int gpu_plan_infer(const bench_opts_t* o, const bench_shape_t* shapes, int nshapes,
                          bench_row_t* rows) {
  int n = 0;
  for (int s = 0; s < nshapes; s++) {
    const int64_t spatial = shape_spatial(&shapes[s], o->scale);
    for (int t = 0; t < SBN_DTYPE_COUNT; t++) {
      if (!o->dtype_on[kDtypeOrder[t]]) continue;
      for (int l = 0; l < 2; l++) {
        if (!o->layout_on[l]) continue;
        bench_row_t* coop = NULL;
        static const bench_path_t paths[2] = {BENCH_PATH_COOP, BENCH_PATH_CUDNN};
        for (int k = 0; k < 2; k++) {
          if (!o->path_on[paths[k]]) continue;
          row_init(&rows[n], &shapes[s], spatial, kDtypeOrder[t], (sbnLayout_t)l, 1, paths[k]);
          rows[n].inference = 1;
          if (paths[k] == BENCH_PATH_COOP) coop = &rows[n];
          else rows[n].coop = coop;
          n++;
        }
      }
    }
  }
  return n;
}

/* Where a row's shape x dtype x layout comes in the run order (shape, then kDtypeOrder, then
   layout), for running the main and the inference rows of one input set together. */
static int sdl_order(const bench_row_t* r, const bench_shape_t* shapes) {
  int t = 0;
  while (t < SBN_DTYPE_COUNT && kDtypeOrder[t] != r->dtype) t++;
  return ((int)(r->shape - shapes) * SBN_DTYPE_COUNT + t) * 2 + (int)r->layout;
}

/* Whether the GPU run's next row is main row i rather than inference row k: the inference
   rows of a shape x dtype x layout run after its main rows (if any), on the same inputs. */
static int main_row_next(const bench_results_t* res, int i, int k, const bench_shape_t* shapes) {
  return i < res->nrows &&
         (k >= res->ninf || sdl_order(&res->rows[i], shapes) <= sdl_order(&res->inf[k], shapes));
}

/* GPU mode's rows in the order they run (the main and the inference rows interleaved by
   main_row_next, then the latency rows), for the plan that stderr shows: `order` has room
   for every planned row. The count. */
static int gpu_run_order(const bench_results_t* res, const bench_shape_t* shapes,
                         const bench_row_t** order) {
  int n = 0;
  for (int i = 0, k = 0; i < res->nrows || k < res->ninf;)
    order[n++] = main_row_next(res, i, k, shapes) ? &res->rows[i++] : &res->inf[k++];
  for (int i = 0; i < res->nlat; i++)
    if (res->lat[i].shape) order[n++] = &res->lat[i];
  return n;
}

/* GPU mode: every planned row (the inference rows of a shape x dtype x layout after its
   main rows, on the same inputs), then the latency table. */
static int gpu_main(const char* argv0, const bench_opts_t* o, const bench_shape_t* shapes,
                    int nshapes, bench_run_t* run) {
  static const bench_shape_t lat_shapes[2] = {
      {"tiny", 4, 512, 1, 1, "latency: N=4, C=512, 1x1 per rank (like S10)"},
      {"empty", 0, 512, 1, 1, "latency: n=0 on every rank, C=512"}};
  bench_gpu_t g;
  char err[384] = "";
  if (gpu_setup(&g, o->iters, err, sizeof err) != 0) {
    fprintf(stderr, "%s: GPU setup failed: %s\n", argv0, err);
    gpu_failed_json(argv0, o, run, "GPU setup failed", err);
    return 1;
  }
  run->dev = &g.info;
  run->B = g.info.copy_gbps;
  nccl_load(&run->nccl);
  /* also without the cudnn path: its version, for the record */
  bench_cudnn_t* cudnn = cudnn_load(&run->cudnn);
  const int lib_paths = o->path_on[BENCH_PATH_COOP] + o->path_on[BENCH_PATH_NCCL];
  /* the latency table is the plain ops' (an --epilogue run has none) */
  run->lat_w = lib_paths && o->epilogue == BENCH_EPI_NONE ? o->ranks : 0;

  bench_results_t res;
  memset(&res, 0, sizeof res);
  /* per shape x dtype x layout and W: coop, nccl, split, and cudnn when W is 1 */
  res.rows = calloc((size_t)nshapes * 6 * (size_t)o->nranks_list * 4 + 1, sizeof *res.rows);
  res.nlat = run->lat_w * 4;
  res.lat = calloc((size_t)(run->lat_w > 0 ? run->lat_w : 1) * 4, sizeof *res.lat);
  /* the inference table, the plain op's too (none with --epilogue): coop and cudnn, W = 1 */
  run->infer = o->epilogue == BENCH_EPI_NONE &&
               (o->path_on[BENCH_PATH_COOP] || o->path_on[BENCH_PATH_CUDNN]);
  res.inf = calloc((size_t)nshapes * 6 * 2 + 1, sizeof *res.inf);
  if (!res.rows || !res.lat || !res.inf) {
    free(res.rows);
    free(res.lat);
    free(res.inf);
    cudnn_unload(cudnn);
    gpu_teardown(&g);
    return 1;
  }
  res.nrows = gpu_plan(o, shapes, nshapes, res.rows);
  res.ninf = run->infer ? gpu_plan_infer(o, shapes, nshapes, res.inf) : 0;
  run->planned = res.nrows + res.ninf;
  /* latency: the tiny and the empty op for every W from 1 to the largest, coop and nccl */
  for (int W = 1; W <= run->lat_w; W++)
    for (int q = 0; q < 2; q++)
      for (int p = 0; p < 2; p++)
        if (o->path_on[p]) {
          row_init(lat_slot(res.lat, W, q, p), &lat_shapes[q], 1, sbnFloat32, sbnLayoutNCHW, W,
                   (bench_path_t)p);
          run->planned++;
        }
  int64_t max_c = lat_shapes[0].c;
  for (int s = 0; s < nshapes; s++)
    if (shapes[s].c > max_c) max_c = shapes[s].c;

  res.order = calloc((size_t)run->planned + 1, sizeof *res.order);
  if (res.order && gpu_run_order(&res, shapes, res.order) != run->planned) {
    free(res.order); /* cannot be: then the plan is said in table order */
    res.order = NULL;
  }
  report_header(o, run);
  plan_done(argv0, o, run, &res);
  /* the inputs of the largest W, generated once per shape x dtype x layout: rank r's data
     do not depend on W */
  bench_team_bufs_t host;
  const bench_row_t* host_of = NULL; /* the row whose shape x dtype x layout host holds */
  int have_host = 0;
  char oom[384] = "";
  for (int i = 0, k = 0; i < res.nrows || k < res.ninf;) {
    /* the next row: a main row, or the inference rows of a shape x dtype x layout whose main
       rows (if any) are done */
    const int main_next = main_row_next(&res, i, k, shapes);
    bench_row_t* r = main_next ? &res.rows[i] : &res.inf[k];
    if (!host_of || !same_sdl(host_of, r)) {
      if (have_host) bufs_free(&host);
      sbnTensorDesc_t d = row_desc(r);
      have_host = bufs_alloc(&host, o->ranks, &d) == 0 && bufs_alloc_epilogue(&host, o->epilogue) == 0;
      if (have_host && bufs_init(&host, r->shape->id) != 0) {
        bufs_free(&host);
        have_host = 0;
      }
      host_of = r;
      snprintf(oom, sizeof oom,
               "out of host memory for %d ranks of (%" PRId64 ", %" PRId64 ", %" PRId64 ")",
               o->ranks, d.n, d.c, d.spatial);
    }
    if (!main_next) {
      for (const bench_row_t* first = r; k < res.ninf && same_sdl(&res.inf[k], first); k++) {
        bench_row_t* q = &res.inf[k];
        if (!have_host)
          snprintf(q->error, sizeof q->error, "%s", oom);
        else if (q->path == BENCH_PATH_CUDNN)
          cudnn_infer_row(q, &g, o, &host, cudnn);
        else
          syncbn_gpu_infer_row(q, &g, o, &host);
        row_done(argv0, o, run, &res, q, 0);
      }
      continue;
    }
    if (r->path == BENCH_PATH_CUDNN) {
      if (have_host)
        cudnn_row(r, &g, o, &host, cudnn);
      else
        snprintf(r->error, sizeof r->error, "%s", oom);
      row_done(argv0, o, run, &res, r, 1);
      i++;
      continue;
    }
    /* the library rows of one W: one team's buffers, coop, nccl, split */
    bench_row_t* team[BENCH_GPU_PATHS] = {NULL, NULL, NULL, NULL};
    int j = i;
    for (; j < res.nrows && same_sdl(&res.rows[j], r) && res.rows[j].W == r->W &&
           res.rows[j].path != BENCH_PATH_CUDNN && !team[res.rows[j].path];
         j++)
      team[res.rows[j].path] = &res.rows[j];
    if (have_host)
      syncbn_gpu_rows(team, &g, o, &host, max_c);
    else
      for (int p = 0; p < BENCH_GPU_PATHS; p++)
        if (team[p]) snprintf(team[p]->error, sizeof team[p]->error, "%s", oom);
    for (; i < j; i++) row_done(argv0, o, run, &res, &res.rows[i], 1);
  }
  if (have_host) bufs_free(&host);

  for (int W = 1; W <= run->lat_w; W++)
    for (int q = 0; q < 2; q++) {
      sbnTensorDesc_t d = {sbnFloat32, sbnLayoutNCHW, lat_shapes[q].n, lat_shapes[q].c, 1};
      bench_row_t* team[BENCH_GPU_PATHS] = {NULL, NULL, NULL, NULL};
      for (int p = 0; p < 2; p++)
        if (o->path_on[p]) team[p] = lat_slot(res.lat, W, q, p);
      bench_team_bufs_t lh;
      if (bufs_alloc(&lh, W, &d) != 0) {
        for (int p = 0; p < 2; p++)
          if (team[p]) snprintf(team[p]->error, sizeof team[p]->error, "out of host memory");
      } else {
        if (bufs_init(&lh, lat_shapes[q].id) != 0) {
          for (int p = 0; p < 2; p++)
            if (team[p]) snprintf(team[p]->error, sizeof team[p]->error, "out of host memory");
        } else {
          syncbn_gpu_rows(team, &g, o, &lh, max_c);
        }
        bufs_free(&lh);
      }
      for (int p = 0; p < 2; p++)
        if (team[p]) row_done(argv0, o, run, &res, team[p], 0);
    }
  run->total_s = (now_us() - run->t_start) * 1e-6;

  /* the caller's SBN_ALGO back (the library rows set it for their calls) */
  if (run->algo_env)
    setenv("SBN_ALGO", run->algo_env, 1);
  else
    unsetenv("SBN_ALGO");

  report_footer(run, &res);
  int status = finish(argv0, o, run, &res);
  cudnn_unload(cudnn);
  gpu_teardown(&g);
  free(res.rows);
  free(res.lat);
  free(res.inf);
  free(res.order);
  return status;
}
#endif /* SBN_BENCH_HAVE_CUDA */

int main(int argc, char** argv) {
  bench_opts_t o;
  memset(&o, 0, sizeof o);
  int pa = opts_parse(argc, argv, &o);
  if (pa == 1) /* -h: the text written, or exit 1 (a full disk, a closed stdout) */
    return fflush(stdout) == 0 && !ferror(stdout) ? 0 : 1;
  if (pa) return pa;
  if (opts_check_files(&o, argv[0])) return 2;
  bench_run_t run;
  memset(&run, 0, sizeof run);
  run.t_start = now_us();
  run.B = NAN;
  /* every check that needs no device comes first: nothing below runs on bad input */
  static bench_shape_t shapes[BENCH_MAX_SHAPES];
  int nshapes = shapes_load(&o, argv[0], shapes, BENCH_MAX_SHAPES, &run.shapes_source);
  if (nshapes < 0) return 2;
  run.nshapes = nshapes;

  /* the mode: the GPU path when the build has CUDA and a device is there */
  int gpu_mode = 0;
#if SBN_BENCH_HAVE_CUDA
  if (o.gpu == BENCH_GPU_OFF)
    snprintf(run.why_cpu, sizeof run.why_cpu, "--gpu off");
  else if (gpu_present(run.why_cpu, sizeof run.why_cpu))
    gpu_mode = syncbn_gpu_probe(run.why_cpu, sizeof run.why_cpu);
  /* a device that is there but cannot be used: the options are checked as GPU mode's, the
     JSON (when asked) says why, and the run fails */
  const int gpu_probe_failed = gpu_mode < 0;
  if (gpu_probe_failed) {
    fprintf(stderr, "%s: %s\n", argv[0], run.why_cpu);
    gpu_mode = 1;
  }
#else
  snprintf(run.why_cpu, sizeof run.why_cpu,
           "this build has no CUDA (SYNCBN_CUDA=OFF or no nvcc at configure time)");
#endif
  if (!gpu_mode && o.gpu == BENCH_GPU_ON) {
    fprintf(stderr, "%s: --gpu on: %s\n", argv[0], run.why_cpu);
    return 2;
  }
  int ro = opts_resolve(&o, gpu_mode, run.why_cpu, argv[0]);
  if (ro) return ro;
  if (opts_check_memory(&o, shapes, nshapes, gpu_mode, argv[0])) return 2;
  if (o.json_file && json_open(&run.json, o.json_file) != 0) {
    fprintf(stderr, "%s: --json '%s': cannot open it for writing: %s (try -h)\n", argv[0],
            o.json_file, strerror(errno));
    return 2;
  }
  snprintf(run.device, sizeof run.device, "CPU team (ranks are host threads); not the GPU: %s",
           run.why_cpu);

  if (sbnGetVersion(&run.version) != sbnSuccess) run.version = -1;
  time_t now = time(NULL);
  struct tm tm_utc;
  gmtime_r(&now, &tm_utc);
  strftime(run.date, sizeof run.date, "%Y-%m-%dT%H:%M:%SZ", &tm_utc);
  run.cores = sysconf(_SC_NPROCESSORS_ONLN);
  /* the caller's SBN_ALGO (a copy: GPU mode sets it around the library rows' calls) */
  const char* env = getenv("SBN_ALGO");
  char* algo_env = env ? strdup(env) : NULL;
  run.algo_env = algo_env;

  int status;
#if SBN_BENCH_HAVE_CUDA
  if (gpu_probe_failed) {
    gpu_failed_json(argv[0], &o, &run, "the GPU probe failed", run.why_cpu);
    status = 1;
  } else if (gpu_mode)
    status = gpu_main(argv[0], &o, shapes, nshapes, &run);
  else
#endif
    status = cpu_main(argv[0], &o, shapes, nshapes, &run);
  json_discard(&run.json); /* a run that ended before its JSON: no empty file left */
  free(algo_env);
  return status;
}
