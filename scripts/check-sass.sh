#!/usr/bin/env bash
# check-sass.sh — what the compiled kernels of kernels/coop.cu look like on the GPU the
# project targets first (sm_90, H100/H200), read from the machine code without a GPU.
#
# For every cooperative kernel instantiation (and the host path's and inference
# kernels) it prints registers, stack and local memory (spills), static shared memory,
# the blocks per SM those allow, and how many global loads of each width the SASS has
# (LDGSTS: cp.async into shared memory). It FAILS when
#   - a kernel spills (stack frame or local memory),
#   - a hot kernel (the 16-byte stream/onchip/unit kernels, the host path's 16-byte stats and
#     apply kernels, the 16-byte inference kernels) has no 128-bit global load,
#   - a kernel's registers or shared memory allow fewer blocks per SM than the plan
#     counts on: SBN_STREAM_BLOCKS_PER_SM (stream, unit, small, host path), SBN_ONCHIP_BLOCKS_PER_SM
#     (onchip; its held batches then take the rest of the SM's shared memory),
#   - a cooperative kernel lacks the exchange's memory ordering (ordering() below: the
#     flag's release store, the polls' acquire, the rank barrier's fences and acquire;
#     the team's small kernels, which have no rank barrier, the first two),
#   - a kernel with solo ops (stream, onchip, unit, small) lacks their ordering
#     (solo_ordering() below: the arrival's fence before its red; in the unit and small
#     kernels the end's acquire load). The check must fail on kernels built without them
#     (-DSBN_KERNEL_MUTANTS=4194304, SBN_MUT_ARRIVE_NO_FENCE; 8388608,
#     SBN_MUT_END_RELAXED): built and checked with the mutants below,
#   - a cooperative kernel (unit's and small's too) or a host-path kernel makes a system-scope load (LD/LDG
#     .STRONG.SYS) before its first block barrier: the load that the first GPU run
#     found on every op's critical path (each publishing block read the error words in
#     mapped host memory at its start, ~1.15 us each, served one at a time). The
#     kernels' start reads device memory only, at GPU scope (coop_exchange.cuh,
#     "failures"). The check must fail on kernels built with the old read
#     (-DSBN_KERNEL_MUTANTS=16, SBN_MUT_HOST_WORDS_AT_START): it is built and checked
#     below, and check-sass fails if the check passes on it,
#   - a kernel's machine code is larger than 8192 instructions (128 KB, an SM's
#     instruction cache: CODE_BOUND below). The check must fail on kernels built with a
#     copy of a batch's arithmetic per batch held in registers, as the onchip kernels
#     were until 2026-11-26 (-DSBN_KERNEL_MUTANTS=128, SBN_MUT_HELD_COPIES): built and
#     checked with the mutant below,
#   - kernels/coop.cu does not compile for sm_80 or sm_100 (or, with --ptx-from, the
#     build's compute_80 PTX does not assemble for them).
# Where no nvcc is found it says so and exits 0. cuobjdump and nvdisasm come from the
# toolkit, or from the nvidia-cuda-cuobjdump and nvidia-cuda-nvdisasm wheels (installed
# into ${SBN_TOOLS_DIR:-~/.cache/syncbn-tools} when missing).
#
# The ordering check was shown to fail on source mutants (2026-11-23): a copy of kernels/
# with st.release.sys -> st.relaxed.sys in coop_mem.cuh fails all 48 cooperative kernels
# ("no release store of a flag"), and one with ld.acquire.sys -> ld.relaxed.sys ("no
# acquire after the flag polls"). To repeat: copy kernels/ and include/, apply the sed,
# run sbn_coop_cubin (scripts/cuda-tools.sh) there and report on the copy.
#
# Usage: scripts/check-sass.sh [--sm90-from LIB] [--ptx-from LIB] [OUTDIR]
#   OUTDIR keeps the cubin, SASS and report (a relative one is taken from the source
#   tree's root; a relative LIB from the current folder).
#   --sm90-from LIB  check the sm_90 machine code in LIB (a library or object that a build
#                    made for 90-real: scripts/gpu-suite.sh prebuild's libsyncbn.so, what
#                    the GPU machine runs) instead of compiling kernels/coop.cu for sm_90
#   --ptx-from LIB   assemble the compute_80 PTX in LIB (the default build's libsyncbn.so
#                    on a machine without a GPU: cmake/cuda_arch.cmake) for sm_80 and
#                    sm_100, as the driver does on an A100 or a B200, instead of compiling
#                    kernels/coop.cu for each (ptxas only: cicc ran in that build)
#   .ci/run passes both where its steps built them in the same run (~35 s of a core saved
#   per compile). A LIB without that code is said and compiled instead.
set -euo pipefail

SM90_FROM="" PTX_FROM="" OUT=""
while [ $# -gt 0 ]; do
  case "$1" in
    --sm90-from | --ptx-from)
      if [ $# -lt 2 ] || ! [ -f "$2" ]; then
        echo "check-sass: $1 needs a file (a library or object with kernels), got '${2:-}'" >&2
        exit 2
      fi
      f=$(cd "$(dirname "$2")" && pwd)/$(basename "$2")
      if [ "$1" = --sm90-from ]; then SM90_FROM=$f; else PTX_FROM=$f; fi
      shift 2
      ;;
    -*)
      echo "check-sass: unknown option '$1' (usage: check-sass.sh [--sm90-from LIB] [--ptx-from LIB] [OUTDIR])" >&2
      exit 2
      ;;
    *)
      if [ -n "$OUT" ] || [ $# -gt 1 ]; then
        echo "check-sass: one OUTDIR, after the options (usage: check-sass.sh [--sm90-from LIB] [--ptx-from LIB] [OUTDIR])" >&2
        exit 2
      fi
      OUT=$1
      shift
      ;;
  esac
done

cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/check-sass.XXXXXX")}
mkdir -p "$OUT"

. scripts/cuda-tools.sh
sbn_find_nvcc
if [ -z "$NVCC" ]; then
  echo "check-sass: skipped: no nvcc on PATH or in /usr/local/cuda/bin (a CPU-only machine)"
  exit 0
fi

sbn_find_disasm
if [ -z "$CUOBJDUMP" ] || [ -z "$NVDISASM" ]; then
  TOOLS=${SBN_TOOLS_DIR:-$HOME/.cache/syncbn-tools}
  echo "check-sass: installing cuobjdump and nvdisasm (PyPI wheels) into $TOOLS"
  python3 -m pip install --quiet --disable-pip-version-check --target "$TOOLS" \
    nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm
  sbn_find_disasm
fi
if [ -z "$CUOBJDUMP" ] || [ -z "$NVDISASM" ]; then
  echo "check-sass: FAILED: no cuobjdump/nvdisasm (toolkit or wheels)" >&2
  exit 1
fi

# The kernels as the library builds them (NCCL's window transport where NCCL is found).
sbn_kernel_defs
echo "check-sass: $("$NVCC" --version | tail -n 1); $("$CUOBJDUMP" --version | tail -n 1)"

# The other builds start first, beside the sm_90 one below (one nvcc or ptxas is one
# core: CI has two). The other architectures: sm_80 (A100, the oldest syncbn supports)
# and sm_100 (Blackwell) must compile too (not run, not checked further); a build without
# a GPU visible compiles PTX only (cmake/cuda_arch.cmake), so ptxas runs for them here:
# on that build's PTX with --ptx-from. The mutant build: the plain ops' kernels only (the
# mutants are checked on them, kernels/coop.cu).
for sm in 80 100; do
  if ! "$NVCC" --list-gpu-arch | grep -qx "compute_$sm"; then
    echo "check-sass: FAILED: this nvcc cannot target sm_$sm" >&2
    exit 1
  fi
done
# sbn_extract KIND LIB DIR: cuobjdump -x$KIND (ptx, elf) of LIB into DIR; echoes the
# extracted file for compute_80 (ptx) or sm_90 (elf), or nothing where LIB has none
sbn_extract() {
  local pat
  if [ "$1" = ptx ]; then pat='*.sm_80.ptx'; else pat='*.sm_90.cubin'; fi
  rm -rf "$3" && mkdir -p "$3" # (an OUTDIR used before: none of its files is taken)
  (cd "$3" && "$CUOBJDUMP" -x"$1" all "$2" >/dev/null 2>&1) || true
  find "$3" -maxdepth 1 -name "$pat" | head -n 1
}
PTX=""
if [ -n "$PTX_FROM" ]; then
  PTX=$(sbn_extract ptx "$PTX_FROM" "$OUT/from-ptx")
  PTXAS=$(sbn_find_tool ptxas)
  if [ -z "$PTX" ] || [ -z "$PTXAS" ]; then
    echo "check-sass: no compute_80 PTX in $PTX_FROM (or no ptxas): compiling kernels/coop.cu for sm_80 and sm_100"
    PTX=""
  fi
fi
pids=()
for sm in 80 100; do
  if [ -n "$PTX" ]; then
    echo "+ ptxas -arch=sm_$sm (the compute_80 PTX of $PTX_FROM) &"
    "$PTXAS" -arch=sm_"$sm" -o "$OUT/coop_sm$sm.cubin" "$PTX" &
  else
    echo "+ nvcc -arch=sm_$sm -cubin kernels/coop.cu &"
    sbn_coop_cubin "$sm" "$OUT/coop_sm$sm.cubin" &
  fi
  pids+=($!)
done
echo "+ nvcc -arch=sm_90 -cubin -DSBN_KERNEL_MUTANTS=12583056 -DSBN_PLAIN_KERNELS_ONLY kernels/coop.cu &"
sbn_coop_cubin 90 "$OUT/coop_sm90_mutant.cubin" -DSBN_KERNEL_MUTANTS=12583056 -DSBN_PLAIN_KERNELS_ONLY &
mpid=$!
# a failure below leaves no compile behind
trap 'kill "${pids[@]}" "$mpid" 2>/dev/null || true' EXIT
SM90=""
if [ -n "$SM90_FROM" ]; then
  SM90=$(sbn_extract elf "$SM90_FROM" "$OUT/from-sm90")
  if [ -n "$SM90" ]; then
    echo "+ the sm_90 machine code of $SM90_FROM (cuobjdump -xelf)"
    cp "$SM90" "$OUT/coop_sm90.cubin"
  else
    echo "check-sass: no sm_90 machine code in $SM90_FROM: compiling kernels/coop.cu for sm_90"
  fi
fi
if [ -z "$SM90" ]; then
  echo "+ nvcc -arch=sm_90 -cubin kernels/coop.cu ${DEFS[*]}"
  sbn_coop_cubin 90 "$OUT/coop_sm90.cubin" -lineinfo
fi
"$CUOBJDUMP" -res-usage "$OUT/coop_sm90.cubin" > "$OUT/coop_sm90.res"
"$CUOBJDUMP" -sass "$OUT/coop_sm90.cubin" > "$OUT/coop_sm90.sass"

STREAM_OCC=$(sed -n 's/^#define SBN_STREAM_BLOCKS_PER_SM \([0-9]*\).*/\1/p' kernels/coop_plan.h)
ONCHIP_OCC=$(sed -n 's/^#define SBN_ONCHIP_BLOCKS_PER_SM \([0-9]*\).*/\1/p' kernels/coop_plan.h)

# The report (python below): argv res, sass, stream occupancy, onchip occupancy, mode
# ("full", or "mutant": only the system-scope, code-size and solo-ordering checks, which
# must FAIL).
cat > "$OUT/report.py" <<'PY'
import re, subprocess, sys

res_path, sass_path, stream_occ, onchip_occ = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
mode = sys.argv[5] if len(sys.argv) > 5 else "full"
KIND = {"0": "fwd", "1": "bwd"}
DT = {"0": "fp32", "1": "fp16", "2": "bf16"}
VAR = {"0": "stream", "1": "onchip"}  # SBN_VAR_* (coop_plan.h; unit: sbn_unit_kernel)
EPI = {"0": "", "1": " +epi", "2": " +recover",  # SBN_EPI_* (coop_args.h): the epilogue's kernels
       "false": "", "true": " +epi"}  # the inference kernels' (sbn_infer_epilogue)

def demangle(m):
    return subprocess.run(["c++filt", m], capture_output=True, text=True).stdout.strip()

# resources per kernel
res = {}
cur = None
for line in open(res_path):
    m = re.match(r"\s*Function (\S+):", line)
    if m:
        cur = m.group(1)
        continue
    m = re.search(r"REG:(\d+) STACK:(\d+) SHARED:(\d+) LOCAL:(\d+)", line)
    if m and cur:
        res[cur] = tuple(int(v) for v in m.groups())
        cur = None
# global loads per kernel, by width; each kernel's instructions in order
loads, insns = {}, {}
cur = None
for line in open(sass_path):
    m = re.search(r"Function : (\S+)", line)
    if m:
        cur = m.group(1)
        loads[cur] = {"128": 0, "64": 0, "32": 0, "16": 0, "8": 0}
        insns[cur] = []
        continue
    if cur is None:
        continue
    m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
    if m:
        insns[cur].append(m.group(1))
    m = re.search(r"\b(LDG|LDGSTS)(\.[A-Z0-9_.]+)?\s", line)
    if not m:
        continue
    mods = (m.group(2) or "").split(".")
    w = "128" if "128" in mods else "64" if "64" in mods else \
        "16" if ("U16" in mods or "S16" in mods) else "8" if ("U8" in mods or "S8" in mods) else "32"
    loads[cur][w] += 1

def near(ins, i, pat, before):
    """Whether an instruction within `before` before ins[i] (a negative `before`: within
    -before after it) matches pat."""
    lo, hi = (max(0, i - before), i) if before > 0 else (i + 1, i + 1 - before)
    return any(re.match(pat, x) for x in ins[lo:hi])

def ordering(ins, barrier=True):
    """The exchange's memory ordering in a cooperative kernel's SASS (DESIGN.md's recipe):
    the flag's st.release.sys is a MEMBAR.ALL.SYS then a strong system-scope store; the
    poll's ld.acquire.sys an L1 invalidation (CCTL.IVALL) after the relaxed polls
    (LD.E.STRONG.SYS); the rank barrier: MEMBAR.SC.GPU (__threadfence) around a GPU-scope
    atomic add, polled with ld.acquire.gpu (LD.E.STRONG.GPU, CCTL.IVALL). No fence.sc at
    system scope. barrier False (the team's small kernels: solo ops only): the rank
    barrier's not asked for. Returns what is missing."""
    why = []
    rel = sum(1 for i, x in enumerate(ins)
              if re.match(r"STG?\.E(\.\d+)?\.STRONG\.SYS", x) and near(ins, i, r"MEMBAR\.ALL\.SYS", 4))
    if rel == 0:
        why.append("no release store of a flag (MEMBAR.ALL.SYS before a strong .SYS store)")
    if any(x.startswith("MEMBAR.SC.SYS") for x in ins):
        why.append("a fence.sc at system scope (MEMBAR.SC.SYS)")
    gpu_side = r"(LD\.E\.STRONG\.GPU|MEMBAR\.SC\.GPU|ATOMG)"
    acq = sum(1 for i, x in enumerate(ins) if x == "CCTL.IVALL" and not near(ins, i, gpu_side, 4))
    if acq == 0:
        why.append("no acquire after the flag polls (CCTL.IVALL outside the rank barrier)")
    if not any(re.match(r"LDG?\.E\.STRONG\.SYS", x) for x in ins):
        why.append("no system-scope polls (LD.E.STRONG.SYS)")
    if not barrier:
        return why, rel, acq
    if sum(1 for x in ins if x == "MEMBAR.SC.GPU") < 2:
        why.append("the rank barrier's two __threadfence (MEMBAR.SC.GPU) missing")
    if not any(x.startswith("ATOMG.E.ADD") or x.startswith("RED.E.ADD") for x in ins):
        why.append("the rank barrier's atomic add missing")
    if not any(x == "CCTL.IVALL" and near(ins, i, r"LD\.E\.STRONG\.GPU", 3) for i, x in enumerate(ins)):
        why.append("the rank barrier's acquire poll (LD.E.STRONG.GPU + CCTL.IVALL) missing")
    return why, rel, acq

SOLO_KERNELS = ("sbn_coop_kernel", "sbn_unit_kernel", "sbn_small_kernel")

def solo_ordering(ins, end_too):
    """A solo op's ordering (coop_exchange.cuh: rank_arrive, rank_arrivals_done): the
    arrival a release, fence.acq_rel.gpu (MEMBAR.ALL.GPU) shortly before the red
    (REDG.E.ADD.STRONG.GPU, which only the arrival uses: the rank barrier's add returns,
    ATOMG); and, end_too (the unit and small kernels, which have no rank barrier whose
    acquire would look the same), the end's acquire load (LD.E.STRONG.GPU + CCTL.IVALL).
    Returns what is missing."""
    why = []
    reds = [i for i, x in enumerate(ins) if re.match(r"(@!?U?P\d+ )?REDG\.E\.ADD\.STRONG\.GPU", x)]
    if not reds:
        why.append("no solo arrival (REDG.E.ADD.STRONG.GPU)")
    elif not all(near(ins, i, r"MEMBAR\.ALL\.GPU", 16) for i in reds):
        why.append("a solo arrival without its release (MEMBAR.ALL.GPU before the REDG add)")
    if end_too and not any(x == "CCTL.IVALL" and near(ins, i, r"LDG?\.E\.STRONG\.GPU", 3)
                           for i, x in enumerate(ins)):
        why.append("no acquire at a solo op's end (LD.E.STRONG.GPU + CCTL.IVALL)")
    return why

def sys_load_before_barrier(ins):
    """The first system-scope load before the kernel's first block barrier (BAR.SYNC,
    BAR.RED: __syncthreads, __syncthreads_or), or None. A load of the mapped error words
    is LD/LDG .STRONG.SYS (volatile or ld.relaxed.sys); the kernels' start reads only
    device memory, with GPU-scope (LD.E.STRONG.GPU) or weak loads."""
    for x in ins:
        if re.match(r"BAR\.(SYNC|RED|ARV)", x):
            return None
        if re.match(r"LDG?\.E(\.\d+)?\.STRONG\.SYS", x):
            return x
    return None

# Code size. The first GPU run (H200, S2 shapes) measured a small op's time growing with
# the size of the kernel's machine code: about 4.7 us + 0.23 us per KB (the onchip
# kernels, then 2-4x the stream kernels' code, were the slowest). An instruction a block
# executes once is fetched from L2 into the SM's instruction caches; what fits in the
# SM's L1 instruction cache (128 KB measured on Volta and Turing, Jia et al. 2018/2019;
# assumed on Hopper until sbn-probe's code_fetch row measures it) is fetched once per SM
# and launch, what does not is fetched again by every block of the SM. Bound: 8192
# instructions (128 KB) for every kernel. The onchip kernels reached it on 2026-11-26
# (whole-vector planes only, one copy of a batch's arithmetic, the tile butterfly: the
# fp32 plane forward went from 22.1k to 7.1k instructions).
CODE_BOUND = 8192

def occupancy(regs, smem):
    r8 = (max(regs, 1) + 7) // 8 * 8
    per_warp = (r8 * 32 + 255) // 256 * 256
    by_regs = 65536 // (per_warp * 8)  # 8 warps per block
    by_smem = 233472 // (smem + 1024)
    return min(by_regs, by_smem, 8, 32)

rows, failures, order_rows, code_failures = [], [], [], []
# the mutant build's solo kernels and those whose arrival's release is missing; its unit
# and small kernels (the end's acquire checked) and those whose acquire is missing
solo_total = solo_rel = solo_end_total = solo_acq = 0
for mangled, (regs, stack, smem, local) in sorted(res.items(), key=lambda kv: demangle(kv[0])):
    name = demangle(mangled).replace("(anonymous namespace)::", "")
    m = re.match(r"(?:void )?(sbn_\w+)<([^>]*)>", name)
    base = m.group(1) if m else re.match(r"(?:void )?(sbn_\w+)", name).group(1)
    args = [a.strip() for a in m.group(2).split(",")] if m else []
    hot, want, label = False, 1, base
    if base == "sbn_coop_kernel":
        kind, dt, tile, vec, var, epi = args  # epi: the kernels with the epilogue (sbnForwardTrainEx ...)
        label = f"coop {KIND[kind]} {DT[dt]} {'tile' if tile == 'true' else 'plane'} x{vec} {VAR[var]}{EPI[epi]}"
        hot = vec != "1"
        want = {"0": stream_occ, "1": onchip_occ}[var]
    elif base == "sbn_unit_kernel":
        # the unit variant (coop_unit.cuh): stream's stages with stream's occupancy (the
        # plan gives it stream's G), no exchange (so no ordering check)
        kind, dt, vec, epi = args
        label = f"unit {KIND[kind]} {DT[dt]} plane x{vec}{EPI[epi]}"
        hot, want = True, stream_occ
    elif base == "sbn_small_kernel":
        # the small variant (coop_small.cuh): element loads of a few rows (not hot: no
        # 16-byte load expected), stream's occupancy; a team of one's no exchange, a
        # team's (small-team, SBN_VAR_SMALL_TEAM) the publish and the gathers
        kind, dt, epi, team = args
        label = f"small{'-team' if team == 'true' else ''} {KIND[kind]} {DT[dt]} tile{EPI[epi]}"
        hot, want = False, stream_occ
    elif base == "sbn_host_small_stats_kernel":
        # the host path's statistics where the plan is small (coop_small.cuh): small's loads
        # and sums, element loads (not hot), stream's occupancy as the other host kernels
        kind, dt, epi = args
        label = f"host-small-stats {KIND[kind]} {DT[dt]} tile{EPI[epi]}"
        hot, want = False, stream_occ
    elif base in ("sbn_host_stats_kernel", "sbn_host_apply_kernel"):
        kind, dt, tile, vec, epi = args
        label = f"host-{base.split('_')[2]} {KIND[kind]} {DT[dt]} {'tile' if tile == 'true' else 'plane'} x{vec}{EPI[epi]}"
        hot, want = vec != "1", stream_occ
    elif base in ("sbn_infer_tile_kernel", "sbn_infer_plane_kernel", "sbn_infer_flat_kernel"):
        dt, vec, epi = args
        label = f"infer-{base.split('_')[2]} {DT[dt]} x{vec}{EPI[epi]}"
        hot = vec != "1"
    elif base == "sbn_host_publish_kernel":
        label = f"host-publish {KIND[args[0]]} {'tile' if args[1] == 'true' else 'plane'}"
    elif base in ("sbn_host_gather_kernel", "sbn_notify_kernel"):
        label = base.replace("sbn_", "").replace("_kernel", "")
    occ = occupancy(regs, smem)
    ld = loads.get(mangled, {})
    why = []
    ins = insns.get(mangled, [])
    if base in ("sbn_coop_kernel", "sbn_unit_kernel", "sbn_small_kernel", "sbn_host_stats_kernel", "sbn_host_apply_kernel",
                "sbn_host_small_stats_kernel", "sbn_host_publish_kernel", "sbn_host_gather_kernel"):
        x = sys_load_before_barrier(ins)
        if x:
            why.append(f"a system-scope load ({x}) before the first block barrier")
    ninsn = len(ins)
    solo_miss = solo_ordering(ins, base != "sbn_coop_kernel") if base in SOLO_KERNELS else []
    if mode == "mutant":
        if why:
            failures.append(f"{label}: {'; '.join(why)}")
        if ninsn > CODE_BOUND:
            code_failures.append(label)
        if base in SOLO_KERNELS:
            solo_total += 1
            solo_rel += any("release" in m for m in solo_miss)
            if base != "sbn_coop_kernel":  # the end's acquire is checked in unit and small only
                solo_end_total += 1
                solo_acq += any("acquire" in m for m in solo_miss)
        continue
    why += solo_miss
    if ninsn > CODE_BOUND:
        why.append(f"{ninsn} instructions > {CODE_BOUND}")
    if stack or local:
        why.append(f"spills (stack {stack} B, local {local} B)")
    if hot and ld.get("128", 0) == 0:
        why.append("no 128-bit global load")
    if occ < want:
        why.append(f"{occ} blocks/SM < {want} planned")
    if base == "sbn_coop_kernel" or label.startswith("small-team"):
        miss, nrel, nacq = ordering(insns.get(mangled, []), base == "sbn_coop_kernel")
        why += miss
        order_rows.append((label, nrel, nacq))
    rows.append((label, regs, stack, local, smem, occ, want, ld, ninsn,
                 "FAIL: " + "; ".join(why) if why else ("hot" if hot else "")))
    if why:
        failures.append(f"{label}: {'; '.join(why)}")

if mode == "mutant":
    # the kernels built with the old start-of-kernel read of host memory and the old copy
    # of a batch's arithmetic per held batch: each check must see its mutant (exit 3 =
    # both caught, what the caller wants: a crash of this script exits 1 and must not
    # pass for "caught")
    print(f"mutant SBN_MUT_HOST_WORDS_AT_START: {len(failures)} kernels with a system-scope "
          f"load before the first barrier; mutant SBN_MUT_HELD_COPIES: {len(code_failures)} "
          f"kernels above {CODE_BOUND} instructions ({', '.join(code_failures)}); mutants "
          f"SBN_MUT_ARRIVE_NO_FENCE: {solo_rel} of the {solo_total} solo kernels (stream, "
          f"onchip, unit, small) without the arrival's release; SBN_MUT_END_RELAXED: "
          f"{solo_acq} of the {solo_end_total} unit and small kernels without the end's "
          f"acquire (the stream and onchip kernels' end not checked)")
    sys.exit(3 if failures and code_failures and solo_total and solo_rel == solo_total
             and solo_end_total and solo_acq == solo_end_total else 0)

print(f"{'kernel (sm_90)':<38} {'regs':>4} {'stack':>5} {'local':>5} {'smem':>6} {'blk/SM':>6} {'plan':>4}  "
      f"{'LDG128':>6} {'LDG64':>5} {'LDG32':>5} {'LDG16':>5} {'insns':>6} {'KB':>4} {'fit us':>6}  note")
for label, regs, stack, local, smem, occ, want, ld, ninsn, note in rows:
    print(f"{label:<38} {regs:>4} {stack:>5} {local:>5} {smem:>6} {occ:>6} {want:>4}  "
          f"{ld.get('128', 0):>6} {ld.get('64', 0):>5} {ld.get('32', 0):>5} {ld.get('16', 0):>5} "
          f"{ninsn:>6} {ninsn * 16 // 1024:>4} {4.7 + 0.23 * ninsn * 16 / 1024:>6.1f}  {note}")
print(f"# {len(rows)} kernels; blk/SM from registers and static shared memory (the onchip "
      f"kernels add their held batches at launch, filling the SM for {onchip_occ} block); "
      f"LDG128 includes cp.async (LDGSTS.128)")
print(f"# ordering: {len(order_rows)} cooperative kernels each publish with MEMBAR.ALL.SYS + a strong "
      f"system-scope store (release; {min(r[1] for r in order_rows)}-{max(r[1] for r in order_rows)} "
      f"per kernel), poll with LD.E.STRONG.SYS and acquire with CCTL.IVALL "
      f"({min(r[2] for r in order_rows)}-{max(r[2] for r in order_rows)}), no MEMBAR.SC.SYS; "
      f"the rank barrier: MEMBAR.SC.GPU x2, atomic add, LD.E.STRONG.GPU + CCTL.IVALL")
print(f"# no system-scope load before the first block barrier in any cooperative or host-path "
      f"kernel; insns: SASS instructions (16 B each), bound {CODE_BOUND} (128 KB, "
      f"an SM's instruction cache); fit us: 4.7 + 0.23 us/KB, the first run's small-op "
      f"time by code size (a model, not a measurement of this build)")
if failures:
    print(f"check-sass: FAILED ({len(failures)}):")
    for f in failures:
        print("  " + f)
    sys.exit(1)
print("check-sass: OK")
PY
python3 "$OUT/report.py" "$OUT/coop_sm90.res" "$OUT/coop_sm90.sass" "$STREAM_OCC" "$ONCHIP_OCC" \
  > "$OUT/report.txt" || { cat "$OUT/report.txt"; exit 1; }
cat "$OUT/report.txt"

# (sm_80, sm_100 and the mutant build were started above, beside the sm_90 one)
rc=0
for i in 0 1; do wait "${pids[$i]}" || rc=1; done
# The system-scope, code-size and solo-ordering checks on the mutants (12583056 = 16 + 128
# + 4194304 + 8388608: every publishing block reads the error words at its start, the
# onchip kernels compile a batch's arithmetic per held batch, both as before 2026-11-26; a
# solo block's arrival without its fence, a solo op's end without its acquire): each
# must fail there.
if ! wait $mpid; then
  echo "check-sass: FAILED: the mutant build (-DSBN_KERNEL_MUTANTS=12583056) did not compile" >&2
  exit 1
fi
"$CUOBJDUMP" -res-usage "$OUT/coop_sm90_mutant.cubin" > "$OUT/coop_sm90_mutant.res"
"$CUOBJDUMP" -sass "$OUT/coop_sm90_mutant.cubin" > "$OUT/coop_sm90_mutant.sass"
mrc=0
python3 "$OUT/report.py" "$OUT/coop_sm90_mutant.res" "$OUT/coop_sm90_mutant.sass" \
  "$STREAM_OCC" "$ONCHIP_OCC" mutant > "$OUT/report_mutant.txt" || mrc=$?
if [ "$mrc" -ne 3 ]; then
  cat "$OUT/report_mutant.txt"
  echo "check-sass: FAILED: the system-scope, code-size or solo-ordering check passes on" \
    "its mutant (SBN_MUT_HOST_WORDS_AT_START, SBN_MUT_HELD_COPIES, SBN_MUT_ARRIVE_NO_FENCE," \
    "SBN_MUT_END_RELAXED)" >&2
  exit 1
fi
echo "check-sass: $(cat "$OUT/report_mutant.txt") (each check catches its mutant)"
what="kernels/coop.cu"
[ -n "$PTX" ] && what="the compute_80 PTX of $PTX_FROM"
for sm in 80 100; do
  if [ -s "$OUT/coop_sm$sm.cubin" ] && [ $rc -eq 0 ]; then
    echo "check-sass: sm_$sm build OK ($what; $(stat -c %s "$OUT/coop_sm$sm.cubin") bytes)"
  fi
done
[ $rc -eq 0 ] || { echo "check-sass: FAILED: $what does not build for sm_80 or sm_100" >&2; exit 1; }
