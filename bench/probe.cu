/* probe.cu — sbn-probe: the questions issue 27 asks of a GPU, answered in seconds (< 30 s).
 *
 * The first GPU run (H200) measured an EMPTY op (n = 0 on every rank) at 26-29 us and
 * +15 us per virtual rank, and a small op's time growing with its kernel's code size. Its
 * explanations (reads of mapped host memory served one at a time, ~1.15 us each; the
 * instruction fetch of unrolled code; dependent round trips of the exchange) are
 * hypotheses until measured. Each part below measures one of them, with nothing else in
 * the kernel, and prints a line of JSON per result (and a table):
 *
 *   host_word    N blocks (1 .. 4 per SM) each read ONE word once, as the cooperative
 *                kernel read its error words: mapped host memory vs device memory. Per
 *                block: the load's latency; in all: the span. Served one at a time, the
 *                host reads' span grows ~1.15 us per block; device reads stay ~1 us.
 *   round_trip   two blocks of one GPU ping-pong through a flag: st.release + ld.acquire
 *                at .gpu and .sys scope (device memory), and .sys in mapped host memory;
 *                __threadfence() and __threadfence_system() each alone.
 *   code_fetch   16, 64, 256 KB of multiply-adds (four independent chains), one block
 *                per SM, executed once from straight-line code or as a 1 KB loop body
 *                (the same work): the difference per KB is the instruction fetch (the
 *                first run's fit: 0.23 us per KB of the kernel), cold and warm.
 *   launch       what an op pays outside its kernel: an empty kernel launched ordinary or
 *                cooperative, with 16 B or the library's ~2.9 KB of parameters, with no or
 *                the most dynamic shared memory; event-timed busy (behind a memset, as
 *                sbn-bench), idle, chained and from a CUDA graph; the host's launch call,
 *                cudaPointerGetAttributes, cudaGetDevice/SetDevice (probe_launch).
 *   bandwidth    kernels that only read, write or copy 1 GiB with 16-byte accesses, at the
 *                stream kernel's 2 blocks of 256 threads per SM and at 8, U = 4 or 8
 *                loads in flight per thread, laid out per block or per grid round, with
 *                and without evict_last (probe_bandwidth): the ceiling the stream kernel's
 *                loads have on this GPU, beside B (a copy's rate).
 *   op           the library's cooperative kernel (kernels/coop.cu, compiled into this
 *                program with stage stamps: SBN_STAMP), planned as the library plans it,
 *                fp32 forward: the median op time (events; idle and busy, as in
 *                launch) and, per stage, when the
 *                median and the last block got there (%globaltimer, from the launch's
 *                first block start; the last block is the critical path). Shapes:
 *                "empty" (n = 0 on every rank, C = 512), stream and onchip, W = 1, 2, 4,
 *                8 virtual ranks, once as built and once with the old read of host memory
 *                at every publishing block's start (SBN_MUT_HOST_WORDS_AT_START, switched
 *                at run time here: the difference is what the fix saved); then S10, S2
 *                (W = 1 stream, W = 8 auto: 934 us on the first run), S10 stream, S3 and S5
 *                stream; the small kernel on S10 and the empty op, the unit kernel on S2
 *                (W = 1). The W = 1 plane rows name stream: auto runs unit there since
 *                the H200 A/B of dd9256e (E32).
 *
 * The probe's kernels read their mutant switch from device memory (sbn_probe_mutants): a
 * load the library's kernels do not make, in the failure checks only.
 *
 * Usage: sbn-probe [--quick] [--json FILE]   (no arguments: everything, ~10 s on an H100)
 * Exit status 0 when every part ran (the numbers are reported, never judged), 77 without
 * a GPU, 1 on a CUDA error.
 */
#include <cuda_runtime.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <algorithm>
#include <vector>

/* ---- the library's kernels, with the probe's stage stamps and run-time mutants ---------- */
__device__ int sbn_probe_mutants; /* SBN_MUT_* switched on by the probe */
#define SBN_KERNEL_MUTANTS sbn_probe_mutants
#define SBN_PROBE_MAX_BLOCKS 4096
__device__ unsigned long long sbn_probe_stamps[SBN_PROBE_MAX_BLOCKS * 8];
__device__ __forceinline__ unsigned long long probe_now() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}
#define SBN_STAMP(i)                                                                        \
  do {                                                                                      \
    if (threadIdx.x == 0 && blockIdx.x < SBN_PROBE_MAX_BLOCKS)                              \
      sbn_probe_stamps[blockIdx.x * 8 + (i)] = probe_now();                                 \
  } while (0)
#define SBN_STAMP_BY(i, t)                                                                  \
  do {                                                                                      \
    if (threadIdx.x == (t) && blockIdx.x < SBN_PROBE_MAX_BLOCKS)                            \
      sbn_probe_stamps[blockIdx.x * 8 + (i)] = probe_now();                                 \
  } while (0)
/* the plain ops' kernels only: every kernel the probe launches is one (epi 0), and the
   epilogue's copies (nullptr here: coop.cu) would double this file's compile */
#define SBN_PLAIN_KERNELS_ONLY
#include "coop.cu"

#define CK(call)                                                                            \
  do {                                                                                      \
    cudaError_t e_ = (call);                                                                \
    if (e_ != cudaSuccess) {                                                                \
      fprintf(stderr, "sbn-probe: %s: %s (%s:%d)\n", #call, cudaGetErrorString(e_), __FILE__, \
              __LINE__);                                                                    \
      exit(1);                                                                              \
    }                                                                                       \
  } while (0)

static FILE* g_json;
static void json(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
static void json(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  vprintf(fmt, ap);
  va_end(ap);
  printf("\n");
  if (g_json) {
    va_start(ap, fmt);
    vfprintf(g_json, fmt, ap);
    va_end(ap);
    fprintf(g_json, "\n");
  }
}

static double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/* ---- host_word -------------------------------------------------------------------------- */
__global__ void read_word_kernel(const volatile int* w, unsigned long long* out) {
  if (threadIdx.x != 0) return;
  const unsigned long long t0 = probe_now();
  const int v = *w;
  const unsigned long long t1 = probe_now() + (v == 12345 ? 1 : 0); /* depends on the load */
  out[2 * blockIdx.x] = t0;
  out[2 * blockIdx.x + 1] = t1;
}

static void probe_host_word(int sms, bool quick) {
  int *hw = nullptr, *dw = nullptr;
  unsigned long long* out = nullptr;
  CK(cudaHostAlloc((void**)&hw, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  memset(hw, 0, 64);
  CK(cudaMalloc((void**)&dw, 64));
  CK(cudaMemset(dw, 0, 64));
  const int maxb = 4 * sms;
  CK(cudaMalloc((void**)&out, (size_t)maxb * 2 * sizeof(unsigned long long)));
  std::vector<unsigned long long> h((size_t)maxb * 2);
  const int counts[] = {1, 16, sms, 2 * sms, 4 * sms};
  for (int where = 0; where < 2; where++)
    for (int ci = 0; ci < 5; ci++) {
      const int nb = counts[ci];
      std::vector<double> lat, slowest, span;
      for (int rep = 0; rep < (quick ? 3 : 7); rep++) {
        read_word_kernel<<<nb, 32>>>(where ? dw : hw, out);
        CK(cudaGetLastError());
        CK(cudaDeviceSynchronize());
        CK(cudaMemcpy(h.data(), out, (size_t)nb * 2 * sizeof(unsigned long long),
                      cudaMemcpyDeviceToHost));
        if (rep == 0) continue; /* the first launch loads the kernel */
        unsigned long long lo = ~0ull, hi = 0;
        std::vector<double> l;
        for (int b = 0; b < nb; b++) {
          l.push_back((double)(h[2 * b + 1] - h[2 * b]) / 1000.0);
          lo = std::min(lo, h[2 * b]);
          hi = std::max(hi, h[2 * b + 1]);
        }
        lat.push_back(median(l));
        slowest.push_back(*std::max_element(l.begin(), l.end()));
        span.push_back((double)(hi - lo) / 1000.0);
      }
      json("{\"probe\": \"host_word\", \"memory\": \"%s\", \"blocks\": %d, "
           "\"median_load_us\": %.3f, \"slowest_load_us\": %.3f, \"span_us\": %.3f, "
           "\"span_per_block_us\": %.3f}",
           where ? "device" : "mapped-host", nb, median(lat), median(slowest), median(span),
           median(span) / nb);
    }
  CK(cudaFreeHost(hw));
  CK(cudaFree(dw));
  CK(cudaFree(out));
}

/* ---- round_trip ------------------------------------------------------------------------- */
template <int SCOPE> /* 0: gpu, 1: sys */
__device__ __forceinline__ void st_rel(unsigned* p, unsigned v) {
  if (SCOPE == 0) asm volatile("st.release.gpu.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
  else asm volatile("st.release.sys.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
template <int SCOPE>
__device__ __forceinline__ unsigned ld_acq(const unsigned* p) {
  unsigned v;
  if (SCOPE == 0) asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  else asm volatile("ld.acquire.sys.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
/* Block 0 sends i (odd), block 1 answers i + 1; flag[0] carries both ways. out: ns per
   round trip (block 0), and the time of `iters` fences of each kind. */
template <int SCOPE>
__global__ void ping_pong_kernel(unsigned* flag, int iters, unsigned long long* out) {
  if (threadIdx.x != 0) return;
  const unsigned long long deadline = probe_now() + 2000000000ull; /* never a hang */
  if (blockIdx.x == 0) {
    const unsigned long long t0 = probe_now();
    for (int i = 0; i < iters; i++) {
      st_rel<SCOPE>(flag, 2u * i + 1u);
      while (ld_acq<SCOPE>(flag) != 2u * i + 2u)
        if (probe_now() > deadline) return;
    }
    out[0] = probe_now() - t0;
  } else if (blockIdx.x == 1) {
    for (int i = 0; i < iters; i++) {
      while (ld_acq<SCOPE>(flag) != 2u * i + 1u)
        if (probe_now() > deadline) return;
      st_rel<SCOPE>(flag, 2u * i + 2u);
    }
  }
}
__global__ void fence_kernel(int iters, unsigned long long* out, unsigned* sink) {
  if (threadIdx.x != 0) return;
  unsigned long long t0 = probe_now();
  for (int i = 0; i < iters; i++) {
    sink[0] = i;
    __threadfence();
  }
  unsigned long long t1 = probe_now();
  for (int i = 0; i < iters; i++) {
    sink[1] = i;
    __threadfence_system();
  }
  out[1] = t1 - t0;
  out[2] = probe_now() - t1;
}

static void probe_round_trip(bool quick) {
  const int iters = quick ? 200 : 2000;
  unsigned *dflag = nullptr, *hflag = nullptr;
  unsigned long long* out = nullptr;
  CK(cudaMalloc((void**)&dflag, 64));
  CK(cudaHostAlloc((void**)&hflag, 64, cudaHostAllocMapped | cudaHostAllocPortable));
  CK(cudaMalloc((void**)&out, 4 * sizeof(unsigned long long)));
  const struct {
    const char* name;
    int sys;
    bool host;
  } cases[] = {{"gpu scope, device memory", 0, false},
               {"sys scope, device memory", 1, false},
               {"sys scope, mapped host memory", 1, true}};
  for (const auto& c : cases) {
    unsigned long long ns = 0;
    CK(cudaMemset(dflag, 0, 64));
    memset(hflag, 0, 64);
    CK(cudaMemset(out, 0, 4 * sizeof(unsigned long long)));
    unsigned* f = c.host ? hflag : dflag;
    if (c.sys) ping_pong_kernel<1><<<2, 32>>>(f, iters, out);
    else ping_pong_kernel<0><<<2, 32>>>(f, iters, out);
    CK(cudaGetLastError());
    CK(cudaDeviceSynchronize());
    CK(cudaMemcpy(&ns, out, sizeof ns, cudaMemcpyDeviceToHost));
    json("{\"probe\": \"round_trip\", \"case\": \"%s\", \"iters\": %d, \"round_trip_ns\": %.1f%s}",
         c.name, iters, ns ? (double)ns / iters : -1.0, ns ? "" : ", \"note\": \"did not finish\"");
  }
  unsigned long long h[3] = {0, 0, 0};
  fence_kernel<<<1, 32>>>(iters, out, dflag);
  CK(cudaGetLastError());
  CK(cudaDeviceSynchronize());
  CK(cudaMemcpy(h, out, sizeof h, cudaMemcpyDeviceToHost));
  json("{\"probe\": \"round_trip\", \"case\": \"fence\", \"threadfence_ns\": %.1f, "
       "\"threadfence_system_ns\": %.1f}",
       (double)h[1] / iters, (double)h[2] / iters);
  CK(cudaFree(dflag));
  CK(cudaFreeHost(hflag));
  CK(cudaFree(out));
}

/* ---- code_fetch ------------------------------------------------------------------------- */
/* The same instructions executed once from S KB of straight-line code ("straight") or as
   a 1 KB body looped S times ("loop"): the same dynamic count and dependences, S KB vs
   1 KB of code to fetch, so the difference is the fetch. Four independent chains of
   multiply-adds (one 16-byte SASS instruction each), unfoldable.
   (Until 2026-11-26 this probe timed ONE dependent chain, straight only: its 0.13-0.18
   us per KB on the H200 was the multiply-add's latency, ~4.3 cycles an instruction, not
   the fetch.) */
#define P_J1                                                                                 \
  asm volatile("mad.lo.u32 %0, %0, %0, %4;\n\tmad.lo.u32 %1, %1, %1, %4;\n\t"                \
               "mad.lo.u32 %2, %2, %2, %4;\n\tmad.lo.u32 %3, %3, %3, %4;"                    \
               : "+r"(v0), "+r"(v1), "+r"(v2), "+r"(v3)                                      \
               : "r"(k));
#define P_J4 P_J1 P_J1 P_J1 P_J1
#define P_J16 P_J4 P_J4 P_J4 P_J4 /* 64 instructions: 1 KB */
#define P_J64 P_J16 P_J16 P_J16 P_J16
#define P_J256 P_J64 P_J64 P_J64 P_J64 /* 16 KB */
template <int KB16, bool LOOP> /* KB16 x 16 KB of instructions executed */
__global__ void code_kernel(unsigned k, unsigned* out, unsigned long long* t) {
  unsigned v0 = threadIdx.x, v1 = v0 + 1, v2 = v0 + 2, v3 = v0 + 3;
  const unsigned long long t0 = probe_now();
  if (LOOP) {
#pragma unroll 1
    for (int i = 0; i < 16 * KB16; i++) { P_J16 }
  } else {
    if (KB16 >= 1) { P_J256 }
    if (KB16 >= 4) { P_J256 P_J256 P_J256 }
    if (KB16 >= 16) { P_J256 P_J256 P_J256 P_J256 P_J256 P_J256 P_J256 P_J256 P_J256 P_J256 P_J256 P_J256 }
  }
  if ((v0 ^ v1 ^ v2 ^ v3) == 0x12345678u) out[0] = v0; /* keeps the chains */
  if (threadIdx.x == 0) {
    t[2 * blockIdx.x] = t0;
    t[2 * blockIdx.x + 1] = probe_now();
  }
}

static void probe_code_fetch(int sms, bool quick) {
  unsigned* out = nullptr;
  unsigned long long* t = nullptr;
  CK(cudaMalloc((void**)&out, 64));
  CK(cudaMalloc((void**)&t, (size_t)sms * 2 * sizeof(unsigned long long)));
  std::vector<unsigned long long> h((size_t)sms * 2);
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  const int sizes_kb[3] = {16, 64, 256};
  for (int si = 0; si < 3; si++) {
    double warm_blk[2] = {0, 0};
    for (int loop = 0; loop < 2; loop++) {
      std::vector<double> ev_us, blk_us;
      for (int rep = 0; rep < (quick ? 4 : 11); rep++) {
        CK(cudaEventRecord(e0));
        if (si == 0) loop ? code_kernel<1, true><<<sms, 256>>>(3u, out, t) : code_kernel<1, false><<<sms, 256>>>(3u, out, t);
        if (si == 1) loop ? code_kernel<4, true><<<sms, 256>>>(3u, out, t) : code_kernel<4, false><<<sms, 256>>>(3u, out, t);
        if (si == 2) loop ? code_kernel<16, true><<<sms, 256>>>(3u, out, t) : code_kernel<16, false><<<sms, 256>>>(3u, out, t);
        CK(cudaEventRecord(e1));
        CK(cudaGetLastError());
        CK(cudaEventSynchronize(e1));
        float ms = 0;
        CK(cudaEventElapsedTime(&ms, e0, e1));
        CK(cudaMemcpy(h.data(), t, h.size() * sizeof h[0], cudaMemcpyDeviceToHost));
        std::vector<double> b;
        for (int i = 0; i < sms; i++) b.push_back((double)(h[2 * i + 1] - h[2 * i]) / 1000.0);
        const double blk = median(b);
        if (rep == 0) {
          json("{\"probe\": \"code_fetch\", \"kb\": %d, \"code\": \"%s\", \"launch\": \"first\", "
               "\"event_us\": %.2f, \"block_median_us\": %.2f}",
               sizes_kb[si], loop ? "loop" : "straight", ms * 1000.0, blk);
          continue;
        }
        ev_us.push_back(ms * 1000.0);
        blk_us.push_back(blk);
      }
      warm_blk[loop] = median(blk_us);
      json("{\"probe\": \"code_fetch\", \"kb\": %d, \"code\": \"%s\", \"launch\": \"warm\", "
           "\"event_us\": %.2f, \"block_median_us\": %.2f}",
           sizes_kb[si], loop ? "loop" : "straight", median(ev_us), median(blk_us));
    }
    json("{\"probe\": \"code_fetch\", \"kb\": %d, \"fetch_us_per_kb\": %.4f, "
         "\"note\": \"(straight - loop) / KB, warm\"}",
         sizes_kb[si], (warm_blk[0] - warm_blk[1]) / sizes_kb[si]);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(out));
  CK(cudaFree(t));
}

/* ---- bandwidth: what DRAM gives a streaming kernel shaped like the stream kernel ---------- */
/* The stream kernel moves 1.9-2.0 TB/s of DRAM traffic whatever it keeps in flight (the
   H100 run at ad98116, 2026-11-26: the L2 prefetch, a cp.async pipeline with 64 KB per SM
   in flight), cuDNN's one-pass kernel 1.83, a device-to-device copy 3.0 (B, the floors'
   yardstick: read + write at once). Is ~2 TB/s what reads give at the stream kernel's
   shape? Kernels that only move bytes, over 1 GiB (beyond L2), with nothing else between
   the loads than an XOR:
     read  U 16-byte loads per thread in flight (ld.global.v4, as the stream kernel's
           batches), then the next U;
     write U 16-byte stores per thread;
     copy  U loads, then their U stores elsewhere;
   at 2 blocks of 256 threads per SM (the stream kernel's occupancy) and at 8 (all 2048
   threads of an SM), U = 4 and 8; the bytes laid out "grid" (each round of the grid
   reads one contiguous stretch: vector (r * G + b) * 256 + t) or "block" (block b reads
   its own contiguous 1/G of the buffer, as the stream kernel's units lie); reads with
   no L2 hint or with evict_last (the stream kernel's stage 1). The rounds are not
   unrolled (a thread's next U loads issue after it used the last U, as the stream
   kernel's batches); the blocks per SM are what the launch gets: 8 needs <= 32
   registers (__launch_bounds__), 2 is forced with 100 KB of dynamic shared memory per
   block; the JSON reports the occupancy the runtime computes. GB/s = bytes moved /
   median event time (copy: read + written, as B). */
template <int U, int MODE, bool BLOCK, bool KEEP, int BPSM> /* MODE 0 read, 1 write, 2 copy */
__global__ void __launch_bounds__(256, BPSM) bw_kernel(const uint4* __restrict__ src,
                                                       uint4* __restrict__ dst, int64_t nvec,
                                                       unsigned* sink) {
  const int64_t G = gridDim.x, t = threadIdx.x, b = blockIdx.x;
  const int64_t per_block = nvec / G;             /* BLOCK: vectors of each block */
  const int64_t rounds = nvec / (G * 256 * U);     /* U vectors per thread per round */
  unsigned acc = 0;
  uint64_t pol = 0;
  if (KEEP) asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(pol));
  /* vector k of round r of this thread */
  auto at = [&](int64_t r, int k) -> int64_t {
    return BLOCK ? b * per_block + (r * U + k) * 256 + t : ((r * U + k) * G + b) * 256 + t;
  };
#pragma unroll 1
  for (int64_t r = 0; r < rounds; r++) {
    uint4 v[U];
#pragma unroll
    for (int k = 0; k < U; k++) {
      const int64_t j = at(r, k);
      if (MODE == 1) {
        v[k] = make_uint4((unsigned)j, 1u, 2u, 3u);
      } else if (KEEP) {
        asm volatile("ld.global.L2::cache_hint.v4.u32 {%0, %1, %2, %3}, [%4], %5;"
                     : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w)
                     : "l"(src + j), "l"(pol));
      } else {
        asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v[k].x), "=r"(v[k].y), "=r"(v[k].z), "=r"(v[k].w)
                     : "l"(src + j));
      }
    }
#pragma unroll
    for (int k = 0; k < U; k++) {
      const int64_t j = at(r, k);
      if (MODE == 0)
        acc ^= v[k].x ^ v[k].y ^ v[k].z ^ v[k].w;
      else
        dst[j] = v[k];
    }
  }
  if (acc == 0x9e3779b9u) sink[0] = acc; /* keeps the loads */
}

static void probe_bandwidth(int sms, bool quick) {
  const int64_t bytes = (int64_t)1 << 30, nvec = bytes / 16;
  uint4 *a = nullptr, *c = nullptr;
  unsigned* sink = nullptr;
  CK(cudaMalloc((void**)&a, (size_t)bytes));
  CK(cudaMalloc((void**)&c, (size_t)bytes));
  CK(cudaMalloc((void**)&sink, 64));
  CK(cudaMemset(a, 1, (size_t)bytes));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  struct Cfg {
    const char* mode;
    int u, bpsm;
    bool block, keep;
    void (*fn)(const uint4*, uint4*, int64_t, unsigned*);
  };
  const Cfg cfgs[] = {
      {"read", 4, 2, true, false, bw_kernel<4, 0, true, false, 2>},
      {"read", 4, 2, true, true, bw_kernel<4, 0, true, true, 2>},
      {"read", 4, 2, false, false, bw_kernel<4, 0, false, false, 2>},
      {"read", 8, 2, true, false, bw_kernel<8, 0, true, false, 2>},
      {"read", 4, 8, true, false, bw_kernel<4, 0, true, false, 8>},
      {"read", 4, 8, false, false, bw_kernel<4, 0, false, false, 8>},
      {"write", 4, 2, true, false, bw_kernel<4, 1, true, false, 2>},
      {"write", 4, 8, false, false, bw_kernel<4, 1, false, false, 8>},
      {"copy", 4, 2, true, false, bw_kernel<4, 2, true, false, 2>},
      {"copy", 4, 8, false, false, bw_kernel<4, 2, false, false, 8>},
  };
  for (const Cfg& cf : cfgs) {
    const unsigned grid = (unsigned)(sms * cf.bpsm);
    /* 2 per SM: 100 KB of (unused) dynamic shared memory per block, so that no third fits */
    const size_t dyn = cf.bpsm == 2 ? (size_t)100 * 1024 : 0;
    if (dyn) CK(cudaFuncSetAttribute((const void*)cf.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn));
    int occ = 0;
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&occ, (const void*)cf.fn, 256, dyn));
    /* whole rounds only: the bytes actually moved */
    const int64_t rounds = nvec / ((int64_t)grid * 256 * cf.u);
    const int64_t moved_vec = rounds * grid * 256 * cf.u;
    std::vector<double> us;
    for (int rep = 0; rep < (quick ? 5 : 11); rep++) {
      CK(cudaEventRecord(e0));
      cf.fn<<<grid, 256, dyn>>>(a, c, nvec, sink);
      CK(cudaEventRecord(e1));
      CK(cudaGetLastError());
      CK(cudaEventSynchronize(e1));
      float ms = 0;
      CK(cudaEventElapsedTime(&ms, e0, e1));
      if (rep > 0) us.push_back(ms * 1000.0); /* the first: warm-up */
    }
    const double t = median(us);
    const double moved = (double)moved_vec * 16.0 * (strcmp(cf.mode, "copy") == 0 ? 2.0 : 1.0);
    json("{\"probe\": \"bandwidth\", \"mode\": \"%s\", \"loads_per_thread\": %d, \"blocks_per_sm\": %d, "
         "\"occupancy\": %d, \"layout\": \"%s\", \"hint\": \"%s\", \"bytes\": %.0f, \"us\": %.2f, "
         "\"gbps\": %.1f}",
         cf.mode, cf.u, cf.bpsm, occ, cf.block ? "block" : "grid", cf.keep ? "evict_last" : "none", moved,
         t, moved / t / 1000.0);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaFree(a));
  CK(cudaFree(c));
  CK(cudaFree(sink));
}

/* ---- launch: what an op pays outside its kernel ------------------------------------------ */
/* The first runs measured an event-timed op of ~12.8 us (bench: after the L2 flush's
   memset, so the host's work is hidden) around a 7.0 us kernel (the stamps), and 16.3 us
   when the GPU waits for the host's launch call (the op rows below). What the ~6 us are
   made of: an empty kernel of 256 threads, 16 blocks (an empty op's G) or one per SM,
   launched
     - ordinary or cooperative (cudaLaunchAttributeCooperative),
     - with 8 bytes of parameters or as many as the library's (sizeof(sbn_coop_args_t),
       __grid_constant__),
     - with no dynamic shared memory or the most a block may have (the onchip kernel's
       carveout: the SM's shared/L1 split changes from the memset's),
   timed by events "busy" (a 64 MB memset first: the launch is queued before the GPU gets
   to it, so the event time is the GPU's alone, as in sbn-bench), "idle" (the GPU waits
   for the launch call), "chain" (20 launches between the events, busy: the cost per
   launch when they queue), and "graph" (the launch captured in a CUDA graph, replayed
   busy). Host: the median time of the launch call itself, and of the calls the library
   makes per op (cudaPointerGetAttributes: 8-9 per op; cudaGetDevice/cudaSetDevice). */
struct ProbeBigParams {
  unsigned char b[sizeof(sbn_coop_args_t)];
};
__global__ void __launch_bounds__(256) launch_small_kernel(int v, unsigned* sink) {
  if (v == 12345 && threadIdx.x == 0) sink[blockIdx.x] = (unsigned)v;
}
__global__ void __launch_bounds__(256) launch_big_kernel(const __grid_constant__ ProbeBigParams p,
                                                         unsigned* sink) {
  if (p.b[0] == 123 && threadIdx.x == 0) sink[blockIdx.x] = p.b[sizeof p.b - 1];
}
/* A launch of `grid` blocks of 256 threads (SBN_GPU_THREADS) with `dyn` bytes of dynamic
   shared memory on `s`, cooperative or not (*attr holds the attribute). */
static cudaLaunchConfig_t launch_config(unsigned grid, size_t dyn, cudaStream_t s, bool coop,
                                        cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg;
  memset(&cfg, 0, sizeof cfg);
  memset(attr, 0, sizeof *attr);
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(SBN_GPU_THREADS);
  cfg.dynamicSmemBytes = dyn;
  cfg.stream = s;
  attr->id = cudaLaunchAttributeCooperative;
  attr->val.cooperative = 1;
  cfg.attrs = attr;
  cfg.numAttrs = coop ? 1 : 0;
  return cfg;
}
static double host_us_since(const struct timespec& t0) {
  struct timespec t1;
  clock_gettime(CLOCK_MONOTONIC, &t1);
  return (double)(t1.tv_sec - t0.tv_sec) * 1e6 + (double)(t1.tv_nsec - t0.tv_nsec) / 1e3;
}
static void probe_launch(int sms, bool quick) {
  unsigned* sink = nullptr;
  void* flush = nullptr;
  const size_t flush_bytes = (size_t)64 << 20;
  CK(cudaMalloc((void**)&sink, (size_t)4 * sms * sizeof(unsigned)));
  CK(cudaMalloc(&flush, flush_bytes));
  cudaStream_t s;
  CK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  int optin = 0;
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  CK(cudaFuncSetAttribute((const void*)launch_small_kernel,
                          cudaFuncAttributeMaxDynamicSharedMemorySize, optin));
  CK(cudaFuncSetAttribute((const void*)launch_big_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                          optin));
  static ProbeBigParams big; /* zero: the kernel does nothing */
  int small_v = 0;
  const int reps = quick ? 21 : 101;
  for (int grid_i = 0; grid_i < 2; grid_i++)
    for (int coop = 0; coop < 2; coop++)
      for (int bigp = 0; bigp < 2; bigp++)
        for (int dyn_i = 0; dyn_i < 2; dyn_i++) {
          const unsigned grid = grid_i ? (unsigned)sms : 16u;
          const size_t dyn = dyn_i ? (size_t)optin : 0;
          const void* fn = bigp ? (const void*)launch_big_kernel : (const void*)launch_small_kernel;
          void* args_small[2] = {&small_v, &sink};
          void* args_big[2] = {&big, &sink};
          cudaLaunchAttribute attr;
          const cudaLaunchConfig_t cfg = launch_config(grid, dyn, s, coop != 0, &attr);
          void** args = bigp ? args_big : args_small;
          const char* modes[4] = {"busy", "idle", "chain", "graph"};
          cudaGraphExec_t gx = nullptr;
          {
            cudaGraph_t g;
            CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
            CK(cudaLaunchKernelExC(&cfg, fn, args));
            CK(cudaStreamEndCapture(s, &g));
            CK(cudaGraphInstantiate(&gx, g, 0));
            CK(cudaGraphDestroy(g));
          }
          for (int mode = 0; mode < 4; mode++) {
            if (mode >= 2 && (grid_i || dyn_i)) continue; /* chain, graph: the small grid, no dyn */
            std::vector<double> ev, host;
            for (int rep = 0; rep < reps; rep++) {
              if (mode != 1) CK(cudaMemsetAsync(flush, rep & 0xff, flush_bytes, s));
              CK(cudaEventRecord(e0, s));
              struct timespec t0;
              clock_gettime(CLOCK_MONOTONIC, &t0);
              if (mode == 3) {
                CK(cudaGraphLaunch(gx, s));
              } else {
                for (int i = 0; i < (mode == 2 ? 20 : 1); i++) CK(cudaLaunchKernelExC(&cfg, fn, args));
              }
              const double h = host_us_since(t0);
              CK(cudaEventRecord(e1, s));
              CK(cudaEventSynchronize(e1));
              if (rep == 0) continue; /* the first launch loads the kernel */
              float ms = 0;
              CK(cudaEventElapsedTime(&ms, e0, e1));
              ev.push_back(ms * 1000.0 / (mode == 2 ? 20 : 1));
              host.push_back(h / (mode == 2 ? 20 : 1));
            }
            json("{\"probe\": \"launch\", \"mode\": \"%s\", \"grid\": %u, \"cooperative\": %s, "
                 "\"param_bytes\": %zu, \"dyn_smem\": %zu, \"event_us\": %.2f, \"host_call_us\": %.2f}",
                 modes[mode], grid, coop ? "true" : "false", bigp ? sizeof(ProbeBigParams) : (size_t)16,
                 dyn, median(ev), median(host));
          }
          CK(cudaGraphExecDestroy(gx));
        }
  /* the host calls the library makes per op besides the launch */
  {
    const int n = quick ? 2000 : 20000;
    std::vector<double> per(3);
    struct timespec t0;
    struct cudaPointerAttributes at;
    int dev = 0;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) CK(cudaPointerGetAttributes(&at, sink + (i & 7)));
    per[0] = host_us_since(t0) / n;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) CK(cudaGetDevice(&dev));
    per[1] = host_us_since(t0) / n;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (int i = 0; i < n; i++) CK(cudaSetDevice(dev));
    per[2] = host_us_since(t0) / n;
    json("{\"probe\": \"host_calls\", \"cudaPointerGetAttributes_us\": %.3f, \"cudaGetDevice_us\": %.3f, "
         "\"cudaSetDevice_us\": %.3f}",
         per[0], per[1], per[2]);
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
  CK(cudaStreamDestroy(s));
  CK(cudaFree(flush));
  CK(cudaFree(sink));
}

/* ---- a timed cooperative launch with stage stamps --------------------------------------- */
/* reps launches of fn (cooperative, grid x SBN_GPU_THREADS, dyn bytes of dynamic shared
   memory) with *a; the first is not counted (it loads the kernel). Per launch: the event
   time, and per stage stamp (SBN_STAMP 0..6) the median and the last block's time from
   the launch's first block start. A kernel that fails (an error word set) ends the probe. */
struct StageTimes {
  std::vector<double> us;
  std::vector<double> us_busy; /* queued behind a memset (sbn-bench's timing) */
  std::vector<std::vector<double>> med = std::vector<std::vector<double>>(7);
  std::vector<std::vector<double>> last = std::vector<std::vector<double>>(7);
};
static void run_timed(const void* fn, unsigned grid, size_t dyn, sbn_coop_args_t* a, const int* err,
                      int reps, const char* what, StageTimes* out) {
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  std::vector<unsigned long long> st((size_t)SBN_PROBE_MAX_BLOCKS * 8);
  for (int rep = 0; rep < reps; rep++) {
    cudaLaunchAttribute attr;
    void* args[1] = {a};
    const cudaLaunchConfig_t cfg = launch_config(grid, dyn, 0, true, &attr);
    CK(cudaEventRecord(e0));
    CK(cudaLaunchKernelExC(&cfg, fn, args));
    CK(cudaEventRecord(e1));
    CK(cudaEventSynchronize(e1));
    for (int q = 0; q <= a->nranks; q++)
      if (err[q] != 0) {
        fprintf(stderr, "sbn-probe: %s: error word %d = %d\n", what, q, err[q]);
        exit(1);
      }
    if (rep == 0) continue;
    float ms = 0;
    CK(cudaEventElapsedTime(&ms, e0, e1));
    out->us.push_back(ms * 1000.0);
    { /* the same launch queued behind a 64 MB memset, as sbn-bench times it (the L2
         flush): the launch call's host time is hidden, the event time is the GPU's */
      static void* flush = nullptr;
      const size_t flush_bytes = (size_t)64 << 20;
      if (flush == nullptr) CK(cudaMalloc(&flush, flush_bytes));
      CK(cudaMemsetAsync(flush, rep & 0xff, flush_bytes));
      CK(cudaEventRecord(e0));
      CK(cudaLaunchKernelExC(&cfg, fn, args));
      CK(cudaEventRecord(e1));
      CK(cudaEventSynchronize(e1));
      float msb = 0;
      CK(cudaEventElapsedTime(&msb, e0, e1));
      out->us_busy.push_back(msb * 1000.0);
    }
    if (grid > SBN_PROBE_MAX_BLOCKS) continue;
    CK(cudaMemcpyFromSymbol(st.data(), sbn_probe_stamps, (size_t)grid * 8 * sizeof(st[0])));
    unsigned long long t0 = ~0ull;
    for (unsigned b = 0; b < grid; b++) t0 = std::min(t0, st[b * 8]);
    for (int sg = 0; sg < 7; sg++) {
      std::vector<double> v;
      for (unsigned b = 0; b < grid; b++)
        if (st[b * 8 + sg] >= t0) v.push_back((double)(st[b * 8 + sg] - t0) / 1000.0);
      out->med[sg].push_back(median(v));
      out->last[sg].push_back(v.empty() ? 0.0 : *std::max_element(v.begin(), v.end()));
    }
  }
  CK(cudaEventDestroy(e0));
  CK(cudaEventDestroy(e1));
}

/* ---- ops: real shapes, the library's plan, the stages ------------------------------------ */
/* The forward of a benchmark shape (fp32 NCHW, x = 0: the time does not depend on the
   values) on a virtual team of W ranks, planned as gpu_launch.c plans it (sbn_plan_launch
   with this device's occupancy and onchip capacity, computed as src/gpu/gpu_team.c's
   sbn_gpu_query_device does: the probe links its own, stamped copy of the kernels, not
   the library, so it cannot call that) for SBN_KERNEL=auto or stream: the
   op's median time and, per stage, when the median and the LAST block got there (the
   last block's stamps are the critical path). */
static void probe_op(const char* name, int64_t N, int64_t C, int64_t sp, int W, int kernel, int sms,
                     bool quick, int mutants = 0) {
  const int kind = SBN_OP_FORWARD, dt = sbnFloat32;
  CK(cudaMemcpyToSymbol(sbn_probe_mutants, &mutants, sizeof mutants));
  sbn_plan_op_t op = {kind, dt, 0, C, 0, kernel, W == 1, 0, W > 1};
  sbn_plan_rank_t rk[8];
  for (int r = 0; r < W; r++) rk[r] = sbn_plan_rank_t{N, sp, 1};
  sbn_plan_dev_t dev;
  memset(&dev, 0, sizeof dev);
  dev.sms = sms;
  dev.ranks_here = W;
  int optin = 0;
  CK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0));
  for (int t = 0; t < 2; t++)
    for (int v = 0; v < 2; v++)
      for (int var = 0; var < SBN_VAR_COUNT; var++) {
        const void* fn = sbn_coop_kernel_ptr(kind, dt, t, v, var, 0);
        if (fn == nullptr) continue;
        size_t dyn = 0;
        if (var == SBN_VAR_ONCHIP) {
          cudaFuncAttributes fa;
          CK(cudaFuncGetAttributes(&fa, fn));
          const int64_t per = sbn_hold_bytes(kind, 1);
          const int64_t slots = std::max<int64_t>(0, ((int64_t)optin - (int64_t)fa.sharedSizeBytes) / per);
          dev.hold_slots[t] = (int)slots;
          dyn = (size_t)(slots * per);
          CK(cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)dyn));
        }
        CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&dev.occ[t][v][var], fn, SBN_GPU_THREADS, dyn));
        if (var == SBN_VAR_STREAM && (dev.occ_min == 0 || dev.occ[t][v][var] < dev.occ_min))
          dev.occ_min = dev.occ[t][v][var];
      }
  sbn_plan_t pl;
  int64_t detail = 0;
  if (sbn_plan_launch(&op, rk, W, &dev, &pl, &detail) != SBN_PLAN_OK) {
    json("{\"probe\": \"op\", \"shape\": \"%s\", \"W\": %d, \"note\": \"no plan (%lld)\"}",
         name, W, (long long)detail);
    return;
  }
  const int64_t numel = N * C * sp, nch = (C + 31) / 32;
  const size_t entries = (size_t)std::max<int64_t>((int64_t)pl.G * 32, C + 32);
  float *x, *y, *prm;
  int64_t* nbt;
  int* err;
  CK(cudaMalloc((void**)&x, (size_t)(numel * W) * 4 + 16));
  CK(cudaMalloc((void**)&y, (size_t)(numel * W) * 4 + 16));
  CK(cudaMemset(x, 0, (size_t)(numel * W) * 4));
  CK(cudaMalloc((void**)&prm, (size_t)(C * (2 + 4 * W)) * 4));
  CK(cudaMemset(prm, 0, (size_t)(C * (2 + 4 * W)) * 4));
  CK(cudaMalloc((void**)&nbt, (size_t)W * 8));
  CK(cudaMemset(nbt, 0, (size_t)W * 8));
  CK(cudaHostAlloc((void**)&err, (size_t)(W + 1) * sizeof(int), cudaHostAllocMapped | cudaHostAllocPortable));
  memset(err, 0, (size_t)(W + 1) * sizeof(int));
  std::vector<sbn_rank_state_t*> state(W);
  std::vector<float*> part(W);
  std::vector<sbn_mail_rec_t*> mail(W);
  static sbn_coop_args_t a;
  memset(&a, 0, sizeof a);
  for (int r = 0; r < W; r++) {
    CK(cudaMalloc((void**)&state[r], sizeof(sbn_rank_state_t)));
    CK(cudaMemset(state[r], 0, sizeof(sbn_rank_state_t)));
    CK(cudaMalloc((void**)&part[r], entries * SBN_GPU_PART_FLOATS * sizeof(float)));
    const size_t mb = (size_t)W * 2 * nch * sizeof(sbn_mail_rec_t);
    CK(cudaMalloc((void**)&mail[r], mb));
    CK(cudaMemset(mail[r], 0, mb));
    sbn_coop_rank_t* R = &a.r[r];
    R->x = x + r * numel;
    R->out = y + r * numel;
    R->weight = prm;
    R->bias = prm + C;
    R->running_mean = prm + C * (2 + 4 * r);
    R->running_var = prm + C * (3 + 4 * r);
    R->save_mean = prm + C * (4 + 4 * r);
    R->save_invstd = prm + C * (5 + 4 * r);
    R->nbt = nbt + r;
    R->n = N;
    R->spatial = sp;
    R->state = state[r];
    R->part = part[r];
    R->mail = mail[r];
    R->rank = r;
    R->eps = 1e-5f;
    R->momentum = 0.1f;
    a.mail[r] = mail[r];
    a.stop[r] = &state[r]->stop;
  }
  a.nstop = W;
  a.err = err;
  a.host_poll_ns = SBN_HOST_POLL_NS;
  a.c = C;
  a.timeout_ns = 2000000000ll;
  a.sig = sbn_op_sig(kind, dt, sbnLayoutNCHW, C);
  a.nranks = W;
  a.nlaunch = W;
  a.G = pl.G;
  a.nchunks_max = (int)nch;
  a.hold_slots = pl.hold_slots;
  CK(cudaDeviceSynchronize());
  const void* fn = sbn_coop_kernel_ptr(kind, dt, pl.tile, pl.vec, pl.variant, 0);
  const unsigned grid = (unsigned)(W * pl.G);
  const size_t dyn = pl.variant == SBN_VAR_ONCHIP ? (size_t)sbn_hold_bytes(kind, pl.hold_slots) : 0;
  char what[64];
  snprintf(what, sizeof what, "%s W=%d", name, W);
  StageTimes tm;
  run_timed(fn, grid, dyn, &a, err, quick ? 6 : 21, what, &tm);
  static const char* const vname[] = {"stream", "onchip", "unit", "small", "small-team"}; /* SBN_VAR_* */
  static_assert(SBN_VAR_COUNT == 5, "a name for every variant");
  /* the unit and small kernels have no rank barrier and publish nothing: their stamps 2
     and 5 are their first unit's (chunk's), 3 the solo thread's arrival (after the first
     unit's partials), 4 block 0's end of the op (its epoch advanced: block 0 alone, so
     the median is block 0's too) */
  const bool one = pl.variant == SBN_VAR_UNIT || SBN_VAR_IS_SMALL(pl.variant);
  json("{\"probe\": \"op\", \"shape\": \"%s\", \"N\": %lld, \"C\": %lld, \"HW\": %lld, "
       "\"W\": %d, \"kernel\": \"%s%s\", \"host_read_at_start\": %s, \"G\": %d, \"op_us\": %.2f, \"op_busy_us\": %.2f, "
       "\"median_block_us\": [%.2f, %.2f, %.2f, %.2f, %.2f, %.2f], "
       "\"last_block_us\": [%.2f, %.2f, %.2f, %.2f, %.2f, %.2f], "
       "\"stages\": \"%s\"}",
       name, (long long)N, (long long)C, (long long)sp, W, vname[pl.variant], pl.vec || one ? "" : "-scalar",
       mutants ? "true" : "false", pl.G, median(tm.us), median(tm.us_busy), median(tm.med[1]), median(tm.med[2]), median(tm.med[3]),
       median(tm.med[4]), median(tm.med[5]), median(tm.med[6]), median(tm.last[1]),
       median(tm.last[2]), median(tm.last[3]), median(tm.last[4]), median(tm.last[5]),
       median(tm.last[6]),
       one ? "start_loads, first statistics, arrived, op ended (block 0), first outputs, done"
           : "start_loads, stage1, rank_barrier, published, first_gather, done");
  for (int r = 0; r < W; r++) {
    CK(cudaFree(state[r]));
    CK(cudaFree(part[r]));
    CK(cudaFree(mail[r]));
  }
  CK(cudaFree(x));
  CK(cudaFree(y));
  CK(cudaFree(prm));
  CK(cudaFree(nbt));
  CK(cudaFreeHost(err));
}

/* The empty op (n = 0 on every rank, C = 512, as the first run's latency table): stream
   (auto's at W > 1; at W = 1 auto runs small, which probe_ops times apart) and onchip,
   W = 1, 2, 4, 8 (quick: to 4), as built and with every publishing block's old read of the
   error words (host memory) at its start. (Until 2026-11-26 the second was the legacy kernel, removed since.) */
static void probe_empty_op(int sms, bool quick) {
  for (int mut = 0; mut < 2; mut++)
    for (int k = 0; k < 2; k++)
      for (int W = 1; W <= (quick ? 4 : 8); W *= 2)
        probe_op("empty", 0, 512, 1, W, k ? SBN_KERNEL_ONCHIP : SBN_KERNEL_STREAM, sms, quick,
                 mut ? SBN_MUT_HOST_WORDS_AT_START : 0);
  const int zero = 0;
  CK(cudaMemcpyToSymbol(sbn_probe_mutants, &zero, sizeof zero));
}

static void probe_ops(int sms, bool quick) {
  /* S10 (pure latency) and S2 (a layer3 conv) both ways: auto ran onchip on them until
     1be20b9 (the H100 run of 2026-11-26), when stream was measured faster on each (S10
     busy 12.7 vs 15.5 us, S2 28.3 vs 35.1; sbn-bench's rows too) and became auto's choice
     everywhere; S3 (33.5 MB: onchip does not hold it) by stream; S2 at W = 8 (934 us on the
     first run: where does it go?) */
  probe_op("S10", 4, 512, 1, 1, SBN_KERNEL_ONCHIP, sms, quick);
  probe_op("S10", 4, 512, 1, 1, SBN_KERNEL_STREAM, sms, quick); /* auto runs small there (E33) */
  /* the small kernel (coop_small.cuh) on S10 and the empty op; the unit kernel on S2 */
  probe_op("S10", 4, 512, 1, 1, SBN_KERNEL_SMALL, sms, quick);
  probe_op("empty", 0, 512, 1, 1, SBN_KERNEL_SMALL, sms, quick);
  /* the team's small kernel (SBN_VAR_SMALL_TEAM, SBN_KERNEL=small only) at W = 2 and 8
     beside stream's S10 at W = 8 (auto's there; the empty op's are probe_empty_op's):
     whether auto should take it (bench/notes/exchange.md, "The small kernel for teams") */
  for (int W = 2; W <= 8; W *= 4) {
    probe_op("S10", 4, 512, 1, W, SBN_KERNEL_SMALL, sms, quick);
    probe_op("empty", 0, 512, 1, W, SBN_KERNEL_SMALL, sms, quick);
  }
  probe_op("S10", 4, 512, 1, 8, SBN_KERNEL_STREAM, sms, quick);
  probe_op("S2", 4, 256, 4096, 1, SBN_KERNEL_UNIT, sms, quick);
  probe_op("S2", 4, 256, 4096, 1, SBN_KERNEL_ONCHIP, sms, quick);
  probe_op("S2", 4, 256, 4096, 1, SBN_KERNEL_STREAM, sms, quick); /* auto runs unit there (E32) */
  probe_op("S3", 4, 512, 4096, 1, SBN_KERNEL_STREAM, sms, quick);
  probe_op("S2", 4, 256, 4096, 8, SBN_KERNEL_AUTO, sms, quick);
  if (!quick) probe_op("S5", 4, 2048, 4096, 1, SBN_KERNEL_STREAM, sms, quick);
}

int main(int argc, char** argv) {
  bool quick = false;
  for (int i = 1; i < argc; i++) {
    if (strcmp(argv[i], "--quick") == 0) {
      quick = true;
    } else if (strcmp(argv[i], "--json") == 0 && i + 1 < argc) {
      g_json = fopen(argv[++i], "w");
      if (!g_json) {
        perror(argv[i]);
        return 1;
      }
    } else {
      fprintf(stderr, "usage: sbn-probe [--quick] [--json FILE]\n");
      return 2;
    }
  }
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    printf("sbn-probe: skipped: no CUDA device\n");
    return 77;
  }
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  int drv = 0;
  CK(cudaDriverGetVersion(&drv));
  json("{\"probe\": \"device\", \"name\": \"%s\", \"sms\": %d, \"driver\": %d, \"quick\": %s}", p.name,
       p.multiProcessorCount, drv, quick ? "true" : "false");
  probe_host_word(p.multiProcessorCount, quick);
  probe_round_trip(quick);
  probe_code_fetch(p.multiProcessorCount, quick);
  probe_launch(p.multiProcessorCount, quick);
  probe_bandwidth(p.multiProcessorCount, quick);
  probe_empty_op(p.multiProcessorCount, quick);
  probe_ops(p.multiProcessorCount, quick);
  if (g_json) fclose(g_json);
  return 0;
}
