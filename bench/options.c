/* options.c — sbn-bench's command line and shape table: parsing, defaults per mode, usage,
 * and every check of them that can fail, made before any work (exit 2 with the option, the
 * value and what is allowed): bounds, the shape table, the host memory the run will take. */
#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "bench.h"
#include "sbn_bench_build.h" /* generated: sbn_bench_shapes_tsv[] */

/* Bounds of the options' values. */
#define BENCH_CPU_MAX_RANKS 4096    /* sbnCommInitCpu's limit (docs/API.md) */
#define BENCH_MAX_ITERS 100000      /* -i, --warmup: GPU mode makes 2 CUDA events per timed call */
#define BENCH_MAX_DIVISOR (1 << 30) /* --scale, --check-channels: any larger is the same */
/* A shape's tensor, elements per rank: 2^40 (4 TB in fp32) is past any host; the bound keeps
   the int64 arithmetic on sizes far from overflow. */
#define BENCH_MAX_ELEMENTS (1LL << 40)
/* Host memory: what a rank costs besides its tensors (its thread's stack, the library's
   per-rank workspace: a few floats per channel), generously; the share of the available
   memory a run may plan to take (the rest: the library, the allocator, other processes). */
#define BENCH_RANK_ALLOWANCE (256.0 * 1024)
#define BENCH_MEMORY_SHARE 0.9

const char* const kDtypeNames[SBN_DTYPE_COUNT] = {
#define SBN_DT_NAME_(value, bytes, name, tag, bits) [value] = name,
    SBN_DTYPES(SBN_DT_NAME_)
#undef SBN_DT_NAME_
};
const sbnDataType_t kDtypeOrder[] = {sbnFloat32, sbnBFloat16, sbnFloat16};
_Static_assert(sizeof kDtypeOrder / sizeof kDtypeOrder[0] == SBN_DTYPE_COUNT,
               "kDtypeOrder lists every dtype of SBN_DTYPES once");
const char* const kLayoutNames[2] = {"NCHW", "NHWC"};
const char* const kPathNames[5] = {"coop", "nccl", "cudnn", "split", "cpu"};
const char* const kEpilogueNames[BENCH_EPI_COUNT] = {"none", "relu", "add-relu", "leaky-inplace",
                                                     "add-leaky-inplace"}; /* BENCH_EPI_* order */
static const char* const kGpuReqNames[3] = {"auto", "on", "off"}; /* bench_gpu_req_t order */

static void usage(FILE* f, const char* argv0) {
  fprintf(f,
          "usage: %s [options]\n"
          "Times SyncBN forward + backward on per-GPU shapes and checks every result\n"
          "against the double-precision reference. With CUDA in the build and a CUDA\n"
          "device: virtual teams (W ranks on GPU 0), the library's cooperative path\n"
          "(coop) and host-driven path (nccl, SBN_ALGO=nccl) side by side, and cuDNN's\n"
          "batch norm at W = 1 (libcudnn.so.9 loaded at run time), timed with CUDA\n"
          "events. Otherwise: the CPU team (ranks are host threads), and the header says\n"
          "why. Also an inference table (not with --epilogue): sbnForwardInference at\n"
          "W = 1 (GPU mode: on device memory, beside cuDNN's, against a copy of x; CPU\n"
          "mode: on host memory), timed and checked. This build: %s.\n"
          "  --gpu auto|on|off     auto: GPU mode when a device is there (default);\n"
          "                        on: GPU mode or exit 2; off: CPU team\n"
          "  -w, --ranks LIST      GPU: comma list of at most %d team sizes W in [1, %d]\n"
          "                        (default %s);\n"
          "                        CPU: ranks in the team, one value in [1, %d] (default %d)\n"
          "  -i, --iters N         timed calls per op, in [1, %d]; the median is reported\n"
          "                        (GPU default %d, the methodology's minimum; CPU default %d)\n"
          "      --warmup N        untimed calls before them, in [0, %d]\n"
          "                        (GPU default %d, CPU default %d)\n"
          "      --scale S         divide each shape's H*W by S, in [1, %d] (kept >= 1;\n"
          "                        N, C kept); 1 = full size (GPU default %d, CPU default %d)\n"
          "      --shapes FILE     shape table, lines 'id N C H W [where]', '#' comments;\n"
          "                        default: bench/shapes.tsv as embedded at build time\n"
          "      --only LIST       comma list of shape ids, e.g. S3,S5\n"
          "      --dtype LIST      comma list of fp32, bf16, fp16 (default fp32,bf16)\n"
          "      --layout LIST     comma list of NCHW, NHWC (default NCHW,NHWC)\n"
          "      --paths LIST      GPU: comma list of coop, nccl, cudnn, split (default coop,\n"
          "                        nccl, cudnn; with --epilogue relu or add-relu coop, nccl,\n"
          "                        split, cudnn; with an in-place one coop, nccl); cudnn\n"
          "                        runs at W = 1 only\n"
          "      --epilogue E      none (default), relu: y = relu(bn(x)), add-relu: y =\n"
          "                        relu(bn(x) + z) and the backward's dz (the library's fused\n"
          "                        ops, sbnForwardTrainEx / sbnBackwardEx); with it the path\n"
          "                        split is the plain coop op and a separate activation\n"
          "                        kernel, cudnn cuDNN's BN_ACTIVATION / BN_ADD_ACTIVATION\n"
          "                        (where it has them); leaky-inplace, add-leaky-inplace:\n"
          "                        the same with leaky ReLU (slope 0.01), and the in-place\n"
          "                        backward, which takes y (and z) for x (sbnBackwardEx with\n"
          "                        x NULL, sbnBackwardInPlaceEx); the forward writes y into\n"
          "                        its own buffer (the same kernel and bytes as over x); paths\n"
          "                        coop and nccl only\n"
          "      --check-channels K  channels checked per row, spread over C, in [0, %d];\n"
          "                        0 = all (GPU default %d, CPU default %d)\n"
          "      --quick           the shapes %s (of the embedded table; every shape\n"
          "                        of --shapes FILE) at W %s in GPU mode, and the latency\n"
          "                        table: a run of <= 60 s on an H100/H200 (options given\n"
          "                        with it win)\n"
          "      --json FILE       also write the metadata and every row as JSON, the whole\n"
          "                        file again after every row (\"complete\": false until the\n"
          "                        end; checked before the run: a path that cannot be\n"
          "                        written is a usage error)\n"
          "  -h, --help            this text\n"
          "The planned rows, then each row as it finishes, go to stderr.\n"
          "Before any work, a run that would need more than %.0f%% of the host memory\n"
          "available (MemAvailable, the cgroup's limit, ulimit -v) is refused.\n"
          "Exit status: 0 all correct, 1 a wrong value or a failed call, 2 usage error.\n",
          argv0, SBN_BENCH_HAVE_CUDA ? "with CUDA" : "without CUDA (CPU team only)",
          BENCH_MAX_RANK_LIST, SBN_MAX_GPU_TEAM_RANKS, BENCH_GPU_DEFAULT_RANKS, BENCH_CPU_MAX_RANKS,
          BENCH_DEFAULT_RANKS, BENCH_MAX_ITERS, BENCH_GPU_DEFAULT_ITERS, BENCH_DEFAULT_ITERS,
          BENCH_MAX_ITERS, BENCH_GPU_DEFAULT_WARMUP, BENCH_DEFAULT_WARMUP, BENCH_MAX_DIVISOR,
          BENCH_GPU_DEFAULT_SCALE, BENCH_DEFAULT_SCALE, BENCH_MAX_DIVISOR, BENCH_GPU_CHECK_CHANNELS,
          BENCH_CHECK_CHANNELS, BENCH_QUICK_SHAPES, BENCH_QUICK_RANKS, BENCH_MEMORY_SHARE * 100);
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

/* Comma list of integers in [lo, hi], at most max of them; -1 when malformed or empty. */
static int parse_int_list(const char* list, int lo, int hi, int* out, int max, int* count) {
  char buf[256];
  int k = 0;
  if (strlen(list) >= sizeof buf) return -1;
  strcpy(buf, list);
  for (char* tok = strtok(buf, ","); tok; tok = strtok(NULL, ",")) {
    if (k == max || parse_int(tok, lo, hi, &out[k])) return -1;
    k++;
  }
  if (k == 0) return -1;
  *count = k;
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

/* The next item of a comma list from *p (spaces around it dropped; empty items skipped, as
   torch_baseline.py skips them) into tok (at most cap - 1 characters: a longer item is cut,
   and so matches no id); *p moves past it. 0 at the end. */
static int list_next(const char** p, char* tok, size_t cap) {
  while (**p == ',' || **p == ' ' || **p == '\t') (*p)++;
  if (**p == '\0') return 0;
  const char* end = strchr(*p, ',');
  size_t tl = end ? (size_t)(end - *p) : strlen(*p);
  const char* b = *p;
  while (tl > 0 && (*b == ' ' || *b == '\t')) b++, tl--;
  while (tl > 0 && (b[tl - 1] == ' ' || b[tl - 1] == '\t')) tl--;
  if (tl >= cap) tl = cap - 1;
  memcpy(tok, b, tl);
  tok[tl] = '\0';
  *p = end ? end + 1 : *p + strlen(*p);
  return 1;
}

/* Every option but -h takes a value; long and short names of one option share an entry. */
static const char* const kOptionList =
    "-w/--ranks, -i/--iters, --warmup, --scale, --check-channels, --shapes, --only, --dtype, "
    "--layout, --paths, --epilogue, --gpu, --json, --quick, -h/--help";

/* An argument that is an option, not a value: "-" then a letter, or "--" then anything
   (-5, a negative number, is a value: the option's check refuses it). */
static int looks_like_option(const char* a) {
  return a[0] == '-' && ((a[1] >= 'a' && a[1] <= 'z') || (a[1] >= 'A' && a[1] <= 'Z') || a[1] == '-');
}

long utf8_bad_at(const char* s) {
  const unsigned char* p = (const unsigned char*)s;
  long i = 0;
  while (p[i]) {
    const unsigned char b = p[i];
    int len = 0;
    unsigned char lo = 0x80, hi = 0xbf; /* the second byte's range */
    if (b < 0x80) len = 1;
    else if (b >= 0xc2 && b <= 0xdf) len = 2;
    else if (b >= 0xe0 && b <= 0xef) len = 3, lo = b == 0xe0 ? 0xa0 : 0x80, hi = b == 0xed ? 0x9f : 0xbf;
    else if (b >= 0xf0 && b <= 0xf4) len = 4, lo = b == 0xf0 ? 0x90 : 0x80, hi = b == 0xf4 ? 0x8f : 0xbf;
    else return i;
    for (int k = 1; k < len; k++) {
      const unsigned char c = p[i + k];
      if (k == 1 ? (c < lo || c > hi) : (c < 0x80 || c > 0xbf)) return i;
    }
    i += len;
  }
  return -1;
}

/* Whether c ends a token of a shapes line: a blank or the end. */
static int ends_token(char c) { return c == '\0' || c == ' ' || c == '\t' || c == '\r'; }

int opts_parse(int argc, char** argv, bench_opts_t* o) {
  const char* argv0 = argv[0];
  o->gpu = BENCH_GPU_AUTO;
  o->nranks_list = 0;                   /* -w: default by mode (opts_resolve) */
  o->iters = o->warmup = o->scale = -1; /* default by mode */
  o->check_channels = -1; /* default by mode */
  o->dtype_on[sbnFloat32] = o->dtype_on[sbnBFloat16] = 1;
  o->layout_on[sbnLayoutNCHW] = o->layout_on[sbnLayoutNHWC] = 1;
  o->path_on[BENCH_PATH_COOP] = o->path_on[BENCH_PATH_NCCL] = o->path_on[BENCH_PATH_CUDNN] = 1;
  for (int i = 1; i < argc; i++) {
    const char* a = argv[i];
    if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
      usage(stdout, argv0);
      return 1;
    }
    if (!strcmp(a, "--quick")) {
      o->quick = 1;
      continue;
    }
    if (a[0] != '-')
      return usage_error(argv0, "unexpected argument '%s': sbn-bench takes options only (%s)", a,
                         kOptionList);
    /* "--opt value" or "--opt=value" */
    static const char* const known[] = {
        "-w",       "--ranks", "-i",     "--iters", "--warmup", "--scale", "--check-channels",
        "--shapes", "--json",  "--only", "--dtype", "--layout", "--gpu",   "--paths", "--epilogue"};
    char name[32];
    const char* val = NULL;
    const char* eq = strncmp(a, "--", 2) == 0 ? strchr(a, '=') : NULL;
    size_t name_len = eq ? (size_t)(eq - a) : strlen(a);
    int is_known = 0;
    if (name_len < sizeof name) {
      memcpy(name, a, name_len);
      name[name_len] = '\0';
      for (size_t k = 0; k < sizeof known / sizeof *known; k++) is_known |= !strcmp(name, known[k]);
    }
    if (!is_known)
      return usage_error(argv0, "unknown option '%s' (the options: %s)", a, kOptionList);
    if (eq)
      val = eq + 1;
    else if (i + 1 >= argc)
      return usage_error(argv0, "%s needs a value", name);
    else if (looks_like_option(argv[i + 1])) /* `--json --quick` wrote a file named --quick */
      return usage_error(argv0, "%s needs a value, got the option '%s' (%s=VALUE takes any value)",
                         name, argv[i + 1], name);
    else
      val = argv[++i];
    if (!strcmp(name, "-w") || !strcmp(name, "--ranks")) {
      if (parse_int_list(val, 1, BENCH_CPU_MAX_RANKS, o->ranks_list, BENCH_MAX_RANK_LIST,
                         &o->nranks_list))
        return usage_error(argv0,
                           "%s '%s': a comma list of at most %d team sizes, each an integer in "
                           "[1, %d] (a CPU team; a GPU team: [1, %d])",
                           name, val, BENCH_MAX_RANK_LIST, BENCH_CPU_MAX_RANKS,
                           SBN_MAX_GPU_TEAM_RANKS);
    } else if (!strcmp(name, "-i") || !strcmp(name, "--iters")) {
      if (parse_int(val, 1, BENCH_MAX_ITERS, &o->iters))
        return usage_error(argv0, "%s '%s': an integer in [1, %d]", name, val, BENCH_MAX_ITERS);
    } else if (!strcmp(name, "--warmup")) {
      if (parse_int(val, 0, BENCH_MAX_ITERS, &o->warmup))
        return usage_error(argv0, "%s '%s': an integer in [0, %d]", name, val, BENCH_MAX_ITERS);
    } else if (!strcmp(name, "--scale")) {
      if (parse_int(val, 1, BENCH_MAX_DIVISOR, &o->scale))
        return usage_error(argv0, "%s '%s': an integer in [1, %d]", name, val, BENCH_MAX_DIVISOR);
    } else if (!strcmp(name, "--check-channels")) {
      if (parse_int(val, 0, BENCH_MAX_DIVISOR, &o->check_channels))
        return usage_error(argv0, "%s '%s': an integer in [0, %d] (0: every channel)", name, val,
                           BENCH_MAX_DIVISOR);
    } else if (!strcmp(name, "--shapes")) {
      o->shapes_file = val;
    } else if (!strcmp(name, "--json")) {
      o->json_file = val;
    } else if (!strcmp(name, "--only")) {
      o->only = val;
    } else if (!strcmp(name, "--dtype")) {
      if (parse_name_list(val, kDtypeNames, SBN_DTYPE_COUNT, o->dtype_on))
        return usage_error(argv0, "%s '%s': a comma list of fp32, bf16, fp16", name, val);
    } else if (!strcmp(name, "--layout")) {
      if (parse_name_list(val, kLayoutNames, 2, o->layout_on))
        return usage_error(argv0, "%s '%s': a comma list of NCHW, NHWC", name, val);
    } else if (!strcmp(name, "--paths")) {
      if (parse_name_list(val, kPathNames, BENCH_GPU_PATHS, o->path_on))
        return usage_error(argv0, "%s '%s': a comma list of coop, nccl, cudnn, split", name, val);
      o->paths_given = 1;
    } else if (!strcmp(name, "--epilogue")) {
      int found = 0;
      for (int k = 0; k < BENCH_EPI_COUNT; k++)
        if (ascii_casecmp(val, kEpilogueNames[k]) == 0) {
          o->epilogue = k;
          found = 1;
        }
      if (!found)
        return usage_error(
            argv0, "%s '%s': none, relu, add-relu, leaky-inplace or add-leaky-inplace", name, val);
    } else {
      int found = 0;
      for (int k = 0; k < 3; k++)
        if (ascii_casecmp(val, kGpuReqNames[k]) == 0) {
          o->gpu = (bench_gpu_req_t)k;
          found = 1;
        }
      if (!found) return usage_error(argv0, "%s '%s': auto, on or off", name, val);
    }
  }
  return 0;
}

int opts_resolve(bench_opts_t* o, int gpu_mode, const char* why_cpu, const char* argv0) {
  const int inplace = epi_inplace(o->epilogue);
  if (!o->paths_given) { /* the default paths: the epilogue's compare fused and split too */
    o->path_on[BENCH_PATH_SPLIT] = o->epilogue != BENCH_EPI_NONE && !inplace;
    if (inplace) o->path_on[BENCH_PATH_CUDNN] = 0;
  }
  if (o->path_on[BENCH_PATH_SPLIT] && (o->epilogue == BENCH_EPI_NONE || inplace))
    return usage_error(argv0,
                       "--paths split: the plain op and a ReLU kernel, which needs --epilogue "
                       "relu or add-relu");
  /* the in-place backward is the library's alone: cuDNN has no leaky ReLU in its fused batch
     norm, nor a backward from y */
  if (o->path_on[BENCH_PATH_CUDNN] && inplace)
    return usage_error(argv0,
                       "--paths cudnn with --epilogue %s: cuDNN's batch norm has no leaky ReLU and "
                       "no backward from y (paths coop and nccl)",
                       kEpilogueNames[o->epilogue]);
  if (gpu_mode) {
    if (o->nranks_list == 0)
      parse_int_list(o->quick ? BENCH_QUICK_RANKS : BENCH_GPU_DEFAULT_RANKS, 1,
                     SBN_MAX_GPU_TEAM_RANKS, o->ranks_list, BENCH_MAX_RANK_LIST, &o->nranks_list);
    o->ranks = 0;
    for (int i = 0; i < o->nranks_list; i++) {
      if (o->ranks_list[i] > SBN_MAX_GPU_TEAM_RANKS)
        return usage_error(argv0, "-w %d: a GPU team has at most %d ranks (W in [1, %d])",
                           o->ranks_list[i], SBN_MAX_GPU_TEAM_RANKS, SBN_MAX_GPU_TEAM_RANKS);
      if (o->ranks_list[i] > o->ranks) o->ranks = o->ranks_list[i];
    }
    /* a run of no row would check nothing and say OK: cuDNN's rows are W = 1's only, and
       an --epilogue run has no inference or latency rows */
    int has_w1 = 0;
    for (int i = 0; i < o->nranks_list; i++) has_w1 |= o->ranks_list[i] == 1;
    if (!o->path_on[BENCH_PATH_COOP] && !o->path_on[BENCH_PATH_NCCL] && !o->path_on[BENCH_PATH_SPLIT] &&
        !(o->path_on[BENCH_PATH_CUDNN] && (has_w1 || o->epilogue == BENCH_EPI_NONE)))
      return usage_error(argv0, "--paths cudnn with --epilogue and no 1 in -w: no row to run (cuDNN's "
                                "rows are W = 1's; an --epilogue run has no inference rows): add 1 to -w, "
                                "or another path");
    if (o->iters < 0) o->iters = BENCH_GPU_DEFAULT_ITERS;
    if (o->warmup < 0) o->warmup = BENCH_GPU_DEFAULT_WARMUP;
    if (o->scale < 0) o->scale = BENCH_GPU_DEFAULT_SCALE;
    if (o->check_channels < 0) o->check_channels = BENCH_GPU_CHECK_CHANNELS;
  } else {
    if (o->nranks_list > 1)
      return usage_error(
          argv0, "-w: the CPU team (not the GPU: %s) takes one team size, not a list", why_cpu);
    if (o->paths_given)
      return usage_error(argv0, "--paths: GPU mode only (not the GPU: %s)", why_cpu);
    o->ranks = o->nranks_list ? o->ranks_list[0] : BENCH_DEFAULT_RANKS;
    o->ranks_list[0] = o->ranks;
    o->nranks_list = 1;
    if (o->iters < 0) o->iters = BENCH_DEFAULT_ITERS;
    if (o->warmup < 0) o->warmup = BENCH_DEFAULT_WARMUP;
    if (o->scale < 0) o->scale = BENCH_DEFAULT_SCALE;
    if (o->check_channels < 0) o->check_channels = BENCH_CHECK_CHANNELS;
  }
  return 0;
}

/* ---- the shape table ---------------------------------------------------------------------- */
/* A shape table's error: "--shapes 'FILE': line N: what (try -h)", or the embedded table's
   name in place of the option (a build error: bench/shapes.tsv itself is wrong). */
static void shapes_error(const char* argv0, const char* label, int lineno, const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  fprintf(stderr, "%s: %s: ", argv0, label);
  if (lineno > 0) fprintf(stderr, "line %d: ", lineno);
  vfprintf(stderr, fmt, ap);
  fprintf(stderr, " (try -h)\n");
  va_end(ap);
}

/* Parses a shape table: 'id N C H W [where...]' per line, '#' starts a comment line; ids
   unique (case-insensitively, as --only matches them). Returns the number of shapes, or -1
   after printing what is wrong (label: how the messages name the table). */
static int parse_shapes(const char* text, const char* label, const char* argv0,
                        bench_shape_t* shapes, int max) {
  int count = 0, lineno = 0;
  int* lines = malloc((size_t)max * sizeof *lines); /* where each shape was defined */
  if (!lines) {
    shapes_error(argv0, label, 0, "out of memory");
    return -1;
  }
  const char* p = text;
  /* a UTF-8 byte order mark (an editor's) is no part of the first id */
  if ((unsigned char)p[0] == 0xef && (unsigned char)p[1] == 0xbb && (unsigned char)p[2] == 0xbf) p += 3;
  while (*p) {
    const char* eol = strchr(p, '\n');
    size_t len = eol ? (size_t)(eol - p) : strlen(p);
    char line[512];
    lineno++;
    size_t lead = 0; /* a comment line of any length is skipped */
    while (lead < len && (p[lead] == ' ' || p[lead] == '\t' || p[lead] == '\r')) lead++;
    if (lead < len && p[lead] == '#') {
      p += len + (eol ? 1 : 0);
      continue;
    }
    if (len >= sizeof line) {
      shapes_error(argv0, label, lineno, "longer than %zu characters", sizeof line - 1);
      goto fail;
    }
    memcpy(line, p, len);
    line[len] = '\0';
    p += len + (eol ? 1 : 0);
    char* s = line;
    while (*s == ' ' || *s == '\t' || *s == '\r') s++;
    if (*s == '\0' || *s == '#') continue;
    const long bad = utf8_bad_at(s);
    if (bad >= 0) { /* its text goes into the JSON, which is UTF-8 */
      shapes_error(argv0, label, lineno, "not UTF-8 text (byte 0x%02x at column %ld)",
                   (unsigned char)s[bad], (long)(s - line) + bad + 1);
      goto fail;
    }
    if (count == max) {
      shapes_error(argv0, label, lineno, "more than %d shapes", max);
      goto fail;
    }
    bench_shape_t* sh = &shapes[count];
    long long n, c, h, w;
    int id_end = 0, used = 0;
    const int got =
        sscanf(s, "%31s%n %lld %lld %lld %lld%n", sh->id, &id_end, &n, &c, &h, &w, &used);
    if (got >= 1 && !ends_token(s[id_end])) { /* cut at 31: what follows may even read as N */
      shapes_error(argv0, label, lineno, "a shape id is at most %d characters",
                   (int)sizeof sh->id - 1);
      goto fail;
    }
    if (got < 5 || n < 1 || c < 1 || h < 1 || w < 1 || !ends_token(s[used])) {
      /* W must end at a blank (1e3 read as 1, and 16x as 16, ran other shapes) */
      shapes_error(argv0, label, lineno,
                   "expected 'id N C H W [where]' with N, C, H, W integers >= 1");
      goto fail;
    }
    while (s[used] == ' ' || s[used] == '\t') used++;
    for (int k = 0; k < count; k++)
      if (ascii_casecmp(shapes[k].id, sh->id) == 0) {
        shapes_error(argv0, label, lineno,
                     "shape id '%s' again (line %d has '%s'); each id must be unique, "
                     "ignoring case (--only selects shapes by id)",
                     sh->id, lines[k], shapes[k].id);
        goto fail;
      }
    if ((double)n * (double)c * (double)h * (double)w > (double)BENCH_MAX_ELEMENTS) {
      shapes_error(argv0, label, lineno, "%s: N*C*H*W = %.3g elements, more than 2^40 per rank",
                   sh->id, (double)n * (double)c * (double)h * (double)w);
      goto fail;
    }
    sh->n = n;
    sh->c = c;
    sh->h = h;
    sh->w = w;
    /* cut to the field at a character's start (the JSON takes it: UTF-8 whole) */
    size_t wl = strlen(s + used);
    if (wl >= sizeof sh->where) {
      wl = sizeof sh->where - 1;
      while (wl > 0 && ((unsigned char)s[used + wl] & 0xc0) == 0x80) wl--;
    }
    memcpy(sh->where, s + used, wl);
    sh->where[wl] = '\0';
    for (size_t i = strlen(sh->where);
         i > 0 && (sh->where[i - 1] == '\r' || sh->where[i - 1] == ' '); i--)
      sh->where[i - 1] = '\0';
    lines[count++] = lineno;
  }
  free(lines);
  return count;
fail:
  free(lines);
  return -1;
}

/* The whole of a regular file, NUL-terminated, its length in *length (a NUL byte in the
   file stands before it); NULL with errno set (EISDIR: a directory). */
static char* read_file(const char* path, size_t* length) {
  FILE* f = fopen(path, "rb");
  if (!f) return NULL;
  struct stat st;
  if (fstat(fileno(f), &st) != 0 || S_ISDIR(st.st_mode)) {
    const int e = S_ISDIR(st.st_mode) ? EISDIR : errno;
    fclose(f);
    errno = e;
    return NULL;
  }
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
  if (buf && ferror(f)) {
    free(buf);
    buf = NULL;
    errno = EIO;
  } else if (!buf) {
    errno = ENOMEM;
  } else {
    buf[len] = '\0';
    *length = len;
  }
  const int e = errno;
  fclose(f);
  errno = e;
  return buf;
}

int opts_check_files(const bench_opts_t* o, const char* argv0) {
  if (o->json_file) {
    /* the regular file standard output or error goes to (--json /dev/stdout > log.txt):
       the JSON, renamed over it after every row, would replace the table or the progress
       lines (a pipe or a terminal there is written once, at the end, after them) */
    static const struct {
      int fd;
      const char* name;
    } std[2] = {{STDOUT_FILENO, "standard output (the table)"},
                {STDERR_FILENO, "standard error (the plan and the progress)"}};
    struct stat js, fs;
    const int regular = stat(o->json_file, &js) == 0 && S_ISREG(js.st_mode);
    for (int i = 0; i < 2 && regular; i++)
      if (fstat(std[i].fd, &fs) == 0 && js.st_dev == fs.st_dev && js.st_ino == fs.st_ino)
        return usage_error(argv0,
                           "--json '%s' is the file %s goes to: the JSON would replace what "
                           "is written there; --json takes another file (or a pipe)",
                           o->json_file, std[i].name);
  }
  if (!o->shapes_file || !o->json_file) return 0;
  struct stat ss, js;
  const int same = stat(o->shapes_file, &ss) == 0 && stat(o->json_file, &js) == 0
                       ? ss.st_dev == js.st_dev && ss.st_ino == js.st_ino
                       : strcmp(o->shapes_file, o->json_file) == 0;
  if (!same) return 0;
  return usage_error(argv0,
                     "--json '%s' is the file --shapes '%s' names: the run would overwrite the "
                     "shape table it reads; --json takes another file",
                     o->json_file, o->shapes_file);
}

int shapes_load(const bench_opts_t* o, const char* argv0, bench_shape_t* shapes, int max,
                const char** source) {
  char* file_text = NULL;
  const char* text = (const char*)sbn_bench_shapes_tsv;
  char label[300];
  *source = "bench/shapes.tsv (embedded)";
  snprintf(label, sizeof label, "%s", *source);
  if (o->shapes_file) {
    snprintf(label, sizeof label, "--shapes '%s'", o->shapes_file);
    size_t file_len = 0;
    file_text = read_file(o->shapes_file, &file_len);
    const char* nul = file_text ? memchr(file_text, '\0', file_len) : NULL;
    if (nul) { /* the lines after it were dropped unseen */
      int at_line = 1;
      for (const char* q = file_text; q < nul; q++) at_line += *q == '\n';
      shapes_error(argv0, label, at_line, "a NUL byte: not a text file of lines 'id N C H W [where]'");
      free(file_text);
      return -1;
    }
    if (!file_text) {
      if (errno == EISDIR)
        shapes_error(argv0, label, 0,
                     "a directory; --shapes takes a file of lines 'id N C H W [where]'");
      else
        shapes_error(argv0, label, 0, "cannot read it: %s", strerror(errno));
      return -1;
    }
    text = file_text;
    *source = o->shapes_file;
  }
  int nshapes = parse_shapes(text, label, argv0, shapes, max < BENCH_MAX_SHAPES ? max : BENCH_MAX_SHAPES);
  free(file_text);
  if (nshapes < 0) return -1;
  if (nshapes == 0) {
    shapes_error(argv0, label, 0,
                 "no shape rows (expected lines 'id N C H W [where]'; '#' starts a comment)");
    return -1;
  }
  const char* only = o->only;
  if (!only && o->quick && !o->shapes_file) only = BENCH_QUICK_SHAPES;
  if (only) {
    char ids[512] = "";
    for (int i = 0, len = 0; i < nshapes && len < (int)sizeof ids; i++)
      len += snprintf(ids + len, sizeof ids - (size_t)len, "%s%s", i ? ", " : "", shapes[i].id);
    /* every id it names must be one of the table's (ids are unique; exact, case-insensitive):
       a typo must not drop rows unseen; and it must name one. The named shapes are kept in
       the table's order */
    char tok[64];
    char named[BENCH_MAX_SHAPES] = {0};
    int items = 0;
    for (const char* p = only; list_next(&p, tok, sizeof tok); items++) {
      int i = 0;
      while (i < nshapes && ascii_casecmp(tok, shapes[i].id) != 0) i++;
      if (i == nshapes) {
        usage_error(argv0, "--only '%s': '%s' is no shape of %s (its shapes: %s)", only, tok,
                    *source, ids);
        return -1;
      }
      named[i] = 1;
    }
    if (items == 0) {
      usage_error(argv0, "--only '%s' names no shape (its shapes: %s)", only, ids);
      return -1;
    }
    int kept = 0;
    for (int i = 0; i < nshapes; i++)
      if (named[i]) shapes[kept++] = shapes[i];
    nshapes = kept;
  }
  return nshapes;
}

int64_t shape_spatial(const bench_shape_t* s, int scale) {
  int64_t spatial = s->h * s->w / scale;
  return spatial < 1 ? 1 : spatial;
}

/* ---- the host memory a run takes ---------------------------------------------------------- */
/* A number read from the first line of a file, or -1 (missing, "max", not a number). */
static double read_number(const char* path) {
  FILE* f = fopen(path, "r");
  if (!f) return -1;
  double v = -1;
  if (fscanf(f, "%lf", &v) != 1) v = -1;
  fclose(f);
  return v;
}

/* Keeps the smaller of what is known (*best < 0: nothing yet). */
static void consider(double v, const char* what, double* best, char* from, size_t cap) {
  if (v < 0 || (*best >= 0 && v >= *best)) return;
  *best = v;
  snprintf(from, cap, "%s", what);
}

/* The bytes of memory this process can still take before the kernel refuses or kills it,
   and where that number comes from; -1 when nothing says. The smaller of: MemAvailable
   (/proc/meminfo; else the free physical pages) and the memory cgroup's limit minus its
   usage (v2, v1). */
static double memory_available(char* from, size_t cap) {
  double best = -1, kb = -1;
  FILE* f = fopen("/proc/meminfo", "r");
  if (f) {
    char line[256];
    while (fgets(line, sizeof line, f))
      if (sscanf(line, "MemAvailable: %lf kB", &kb) == 1) break;
    fclose(f);
  }
  if (kb >= 0)
    consider(kb * 1024.0, "MemAvailable in /proc/meminfo", &best, from, cap);
  else if (sysconf(_SC_AVPHYS_PAGES) > 0 && sysconf(_SC_PAGESIZE) > 0)
    consider((double)sysconf(_SC_AVPHYS_PAGES) * (double)sysconf(_SC_PAGESIZE),
             "free physical memory (sysconf)", &best, from, cap);
  static const char* const cgroup[2][2] = {
      {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"},
      {"/sys/fs/cgroup/memory/memory.limit_in_bytes",
       "/sys/fs/cgroup/memory/memory.usage_in_bytes"}};
  for (int v = 0; v < 2; v++) {
    const double limit = read_number(cgroup[v][0]), used = read_number(cgroup[v][1]);
    char what[128];
    snprintf(what, sizeof what, "the memory cgroup's limit (%s) minus its usage", cgroup[v][0]);
    if (limit >= 0 && used >= 0) consider(limit > used ? limit - used : 0, what, &best, from, cap);
  }
  return best;
}

/* The address space this process can still map: RLIMIT_AS (ulimit -v) minus the address
   space in use, and where that number comes from; -1 without a limit. It bounds the bytes
   a run maps, its threads' whole stacks among them. */
static double address_space_available(char* from, size_t cap) {
  double best = -1;
  struct rlimit rl;
  if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return best;
  double pages = -1;
  FILE* f = fopen("/proc/self/statm", "r");
  if (f) {
    if (fscanf(f, "%lf", &pages) != 1) pages = -1;
    fclose(f);
  }
  const double used = pages > 0 ? pages * (double)sysconf(_SC_PAGESIZE) : 0;
  const double limit = (double)rl.rlim_cur;
  consider(limit > used ? limit - used : 0, "RLIMIT_AS (ulimit -v) minus the address space in use",
           &best, from, cap);
  return best;
}

int opts_check_memory(const bench_opts_t* o, const bench_shape_t* shapes, int nshapes, int gpu_mode,
                      const char* argv0) {
  /* rows run one after the other: the run's peak is its largest row's. CPU mode: the team's
     buffers, the check's, and the NCHW row's bits kept for the NHWC row. GPU mode: the
     inputs of the largest W (kept for every W of a shape x dtype x layout) and the check of
     the largest W (device memory is not counted: a row that cannot have it fails alone). */
  double peak = 0, per_tensor = 0;
  const bench_shape_t* worst = NULL;
  sbnDataType_t worst_dtype = sbnFloat32;
  const int keep = !gpu_mode && o->layout_on[sbnLayoutNCHW] && o->layout_on[sbnLayoutNHWC];
  for (int s = 0; s < nshapes; s++)
    for (int t = 0; t < SBN_DTYPE_COUNT; t++) {
      if (!o->dtype_on[kDtypeOrder[t]]) continue;
      const sbnTensorDesc_t d = {kDtypeOrder[t], sbnLayoutNCHW, shapes[s].n, shapes[s].c,
                                 shape_spatial(&shapes[s], o->scale)};
      const double tensor = (double)d.n * (double)d.c * (double)d.spatial * dtype_size(d.dtype);
      const double bytes = bufs_bytes(o->ranks, &d) +
                           (o->epilogue != BENCH_EPI_NONE ? 8.0 * o->ranks * tensor : 0.0) + /* z, dz; the check's */
                           check_bytes(o->ranks, &d, o->check_channels, keep) +
                           (gpu_mode ? 0.0 : o->ranks * BENCH_RANK_ALLOWANCE);
      if (bytes > peak) {
        peak = bytes;
        worst = &shapes[s];
        worst_dtype = kDtypeOrder[t];
        per_tensor = (double)d.n * (double)d.c * (double)d.spatial * dtype_size(d.dtype);
      }
    }
  /* the address space also holds each rank thread's whole stack, touched or not: the CPU
     team's ranks run on the threads sbnGroupEnd starts, SBN_GROUP_THREAD_STACK each (and
     a guard page; generously 64 KiB) */
  const double mapped = peak + (gpu_mode ? 0.0 : o->ranks * ((double)SBN_GROUP_THREAD_STACK + 65536.0));
  /* the bound that refuses the run, the smaller where both do (as before: the smallest) */
  int as = -1;
  double need = 0, avail = -1;
  char from[160] = "";
  for (int k = 0; k < 2; k++) {
    char what[160] = "";
    const double n = k ? mapped : peak;
    const double a = k ? address_space_available(what, sizeof what) : memory_available(what, sizeof what);
    if (a < 0 || n <= BENCH_MEMORY_SHARE * a || (as >= 0 && a >= avail)) continue;
    as = k;
    need = n;
    avail = a;
    snprintf(from, sizeof from, "%s", what);
  }
  if (as >= 0)
    return usage_error(argv0,
                       "this run needs about %.3g GB of host memory at once (%s %s, scale %d: %d "
                       "ranks x 4 tensors of %.3g MB, plus the check's buffers%s), more than %.0f%% of "
                       "the %.3g GB available (%s); use fewer ranks (-w), a larger --scale, fewer "
                       "--check-channels, or fewer shapes (--only)",
                       need * 1e-9, worst->id, kDtypeNames[worst_dtype], o->scale, o->ranks,
                       per_tensor * 1e-6, as && !gpu_mode ? " and the rank threads' stacks" : "",
                       BENCH_MEMORY_SHARE * 100, avail * 1e-9, from);
  return 0;
}
