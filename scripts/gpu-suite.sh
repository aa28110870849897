#!/usr/bin/env bash
# scripts/gpu-suite.sh — everything that needs a GPU, in one command. Three ways to use it:
#
#   scripts/gpu-suite.sh prebuild [DIR]        on a CPU machine with the CUDA toolkit (CI has
#       one): build everything for sm_90 (CUDA_ARCH to change) in Release with -Werror, NCCL
#       from the nvidia-nccl-cu13 wheel (installed into build/wheels when PYTHON has none),
#       and put what a GPU run needs into DIR (default build/prebuilt) and DIR.tar.xz (what
#       the device tool carries: scripts/gpu_pack.py, within 64 MiB with the source tree): the
#       GPU tests, the examples and sbn-bench linked with the static libsyncbn, a CTest file
#       naming them relative to DIR (scripts/prebuilt_ctest.py), the bench's Python scripts,
#       the compute-sanitizer suppressions, this script, BUILD-INFO. DIR runs from any path.
#   DIR/gpu-suite.sh [OUTDIR] [steps...]       on the GPU machine, in a prebuilt folder: no
#       build; steps env probe test sanitize bench native torch pytorch plot targets, each under a time
#       limit so that the whole ends within 9 minutes (LIMITS below), the sanitizers on the quick case lists,
#       sbn-bench --quick. OUTDIR (default ./gpu-out) then holds summary.txt and
#       gpu-suite.tar.gz (every step's log, the JSON, the charts, results.md).
#   scripts/gpu-suite.sh [OUTDIR] [steps...]   on a GPU machine, from a source tree: steps
#       env build probe test sanitize bench native torch pytorch plot targets; the build into build/gpu; the sanitizers
#       on the full case lists; the bench's default run and its kernel variants. No limits.
# (Two helpers for other scripts, below the functions: nccl-root, with-libs CMD.)
#
# Steps:
#   env       nvidia-smi, nvcc, cmake, and where NCCL / cuDNN are (toolkit or Python wheels)
#   probe     sbn-probe (bench/probe.cu): reads of mapped host vs device memory by N blocks,
#             flag round trips at .gpu/.sys scope, instruction fetch per KB, read/write/copy
#             rates at the stream kernel's shape, the empty op's stages with and without
#             the old start-of-kernel host read; probe.json
#   build     configure + build into build/gpu (source tree only)
#   test      the GPU tests (CTest); they must PASS here, not skip
#   sanitize  compute-sanitizer memcheck (with the suppressions of NCCL's own probes),
#             racecheck, synccheck over the GPU tests
#   bench     sbn-bench (GPU mode: coop, nccl-path, cuDNN), table + JSON written row by row
#   fused     batch norm + activation (+ residual) in one op (issue 51): sbn-bench --epilogue
#             add-relu (fp32 NCHW; fp16 and bf16 NHWC) and relu (fp16 and bf16 NHWC; fp32 NCHW) on
#             S1-S9 at W = 1, the fused ops (coop, nccl) against the split pair (the plain
#             op + an activation kernel: the split rows' t/coop) and cuDNN's own fused ops
#             (cudnn rows: BN_ACTIVATION / BN_ADD_ACTIVATION; refused, and said so, on fp32
#             NCHW); the plain coop op on the same cells (fused-plain-*.json); the
#             in-place backward's rows, --epilogue add-leaky-inplace and leaky-inplace
#             (fp32 NCHW, bf16 NHWC; S2, S4, S5, S8, S9; coop and nccl); then
#             bench/torch_fused_memory.py --device cuda, the activation memory of a
#             converted DeepLab-like stack and the autograd node at its peak; JSON each
#   native    syncbn.torch's C++ operators built against the machine's PyTorch (python/syncbn/
#             _native.py), and which operators the torch steps run on; fails if not the C++ ones
#   torch     bench/torch_baseline.py (PyTorch BN, the SyncBatchNorm op sequence, and
#             syncbn.torch's layer: --paths ...,syncbn_torch), JSON;
#             its bytes and floors read from the bench step's JSON; then the same with
#             --epilogue add-relu (fp32 NCHW) and relu (bf16 NHWC) on S1-S9: the fused
#             layer against PyTorch's batch norm (+= z) + ReLU, floors from the fused step;
#             then bench/torch_host.py --device cuda (fp32 NCHW, bf16 NHWC): the layer's host
#             time per call against nn.BatchNorm2d, the paths interleaved round by round
#   pytorch   tests/python/test_torch_gpu.py: syncbn.torch on the GPU (a team from a process
#             group, a training step vs PyTorch's SyncBatchNorm, CUDA graph replay)
#   pip       (asked for by name, not a default step) what a PyTorch user runs: `pip install .`
#             of the source tree (SBN_SOURCE; a prebuilt folder's is ../..) into a venv that
#             sees PYTHON's packages, its PyTorch among them (a .pth file), the CUDA library built by
#             pip with this machine's nvcc and NCCL from PyTorch's nvidia-nccl wheel (no index
#             needed: scikit-build-core from the prebuilt folder's wheels/); then
#             test_torch_gpu.py against that install (no SYNCBN_LIBRARY, no PYTHONPATH);
#             pip-install.log
#   plot      bench/plot.py: PNG charts + results.md from the JSON files (needs matplotlib)
#   targets   bench/targets.py: issue 13's and 51's targets row by row from the steps' JSON
#             (targets.txt; the summary, per target met by N of M, in the log); a report that
#             fails only on a file it cannot read, or on no file at all
# SBN_SUITE_DEADLINE (prebuilt runs): seconds from the start by which every step has ended:
# each step's limit is cut to what is left (less 5 s for timeout's KILL), and a step with
# nothing left is "not run". Give it below the call's own outer `timeout`: that one stops
# only this script, not the step it is running (a step is its own process group), which
# would go on using the GPU while the next command is timed, and leave no summary.
# PYTHON selects the interpreter with torch (default python3). NCCL and cuDNN are found at run
# time in the nvidia-nccl-cu13 / nvidia-cudnn-cu13 wheels of PYTHON (their lib folders go
# first on LD_LIBRARY_PATH), else where the loader finds them.
# Each step logs to OUTDIR/<step>.log; the summary says which failed; exit 1 if any did.
set -uo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
PYTHON=${PYTHON:-python3}
# Machine code for sm_90 (H100, H200) and no PTX: the kernels' PTX doubled every statically
# linked program once the fused ops' kernels came (76 MiB with it). Each statically linked
# program carries the kernels (~7 MB): the folder holds the GPU tests, examples and bench
# (labels gpu and prebuilt), not the CPU examples (48 MiB in all on 2026-11-30), and travels
# as one xz archive, where the equal copies count once (scripts/gpu_pack.py: ~8 MiB).
ARCH=${CUDA_ARCH:-90-real}
NCCL_WHEEL=${SBN_NCCL_WHEEL:-nvidia-nccl-cu13==2.28.9} # the NCCL of the first GPU machine's torch

# <site-packages>/nvidia/<name> of a wheel importable by PYTHON (or under $2), or nothing
wheel_root() {
  PYTHONPATH="${2:-}${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -c 'import importlib.util, sys
spec = importlib.util.find_spec("nvidia." + sys.argv[1])
print(list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else "")' "$1" 2>/dev/null
}

# The NCCL a build uses: SYNCBN_NCCL_ROOT, else PYTHON's wheel, else build/wheels' (the
# wheel installed there when neither has one); its root on stdout, empty on failure
nccl_build_root() {
  local nccl=${SYNCBN_NCCL_ROOT:-$(wheel_root nccl)}
  if [ -z "$nccl" ]; then
    nccl=$(wheel_root nccl "$PWD/build/wheels")
    if [ -z "$nccl" ]; then
      echo "+ $PYTHON -m pip install --target build/wheels $NCCL_WHEEL" >&2
      "$PYTHON" -m pip install -q --no-deps --target build/wheels "$NCCL_WHEEL" >&2 || return 1
      nccl=$(wheel_root nccl "$PWD/build/wheels")
    fi
  fi
  echo "$nccl"
}

# The wheels' NCCL and cuDNN first on LD_LIBRARY_PATH, where PYTHON has them
wheel_libs() {
  local w root
  for w in nccl cudnn; do
    root=$(wheel_root "$w")
    [ -n "$root" ] && [ -d "$root/lib" ] &&
      export LD_LIBRARY_PATH="$root/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  done
  return 0
}

# ---- for other scripts (scripts/gpu-variants.sh): the same NCCL, the same libraries -------
#   scripts/gpu-suite.sh nccl-root          the NCCL root a build here uses (as prebuild)
#   scripts/gpu-suite.sh with-libs CMD...   CMD with the steps' LD_LIBRARY_PATH
case "${1:-}" in
  nccl-root)
    cd "$HERE/.." || exit 2
    nccl_build_root
    exit $?
    ;;
  with-libs)
    shift
    wheel_libs
    exec "$@"
    ;;
esac

# ---- prebuild: on a CPU machine ----------------------------------------------------------
if [ "${1:-}" = prebuild ]; then
  cd "$HERE/.." || exit 2
  DIR=${2:-build/prebuilt}
  DIR=${DIR%/}
  BUILD=build/prebuilt-build
  # DIR is removed and made again: only an older prebuilt folder (its BUILD-INFO, or the
  # mark of one whose prebuild stopped) or a new path, never a folder of anything else (a
  # mistyped DIR is not a reason to lose it)
  case "$DIR" in
    "" | -* | . | .. | */. | */..)
      echo "prebuild: DIR '${2:-}' is not a folder to build into (give a new path, e.g. build/prebuilt)" >&2
      exit 2
      ;;
  esac
  if [ -e "$DIR" ] && ! [ -f "$DIR/BUILD-INFO" ] && ! [ -f "$DIR/.prebuild-unfinished" ]; then
    echo "prebuild: '$DIR' exists and is no prebuilt folder (no BUILD-INFO): not removed; give a new path" >&2
    exit 2
  fi
  rm -rf "$DIR" "$DIR.tar.xz" # first: no folder or archive of an older build is left if this one fails
  mkdir -p "$DIR" && : >"$DIR/.prebuild-unfinished" || exit 1 # until BUILD-INFO is written
  nccl=$(nccl_build_root) || exit 1
  [ -f "$nccl/include/nccl.h" ] || { echo "prebuild: no nccl.h under '$nccl'" >&2; exit 1; }
  echo "prebuild: NCCL from $nccl; CUDA architecture $ARCH; Release, -Werror"
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSYNCBN_CUDA=ON -DSYNCBN_NCCL=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DSYNCBN_WERROR=ON -DSYNCBN_NCCL_ROOT="$nccl" \
    -DSYNCBN_BUILD_PROBE=ON || exit 1
  cmake --build "$BUILD" -j "$(nproc)" || exit 1
  mkdir -p "$DIR/bench"
  echo "prebuild: tests of $DIR/CTestTestfile.cmake:"
  "$PYTHON" scripts/prebuilt_ctest.py "$BUILD" "$DIR" | sed 's/^/  /' || exit 1
  cp "$BUILD/bench/sbn-bench" "$BUILD/bench/sbn-probe" "$DIR/bin/" &&
    cp bench/*.py bench/shapes.tsv bench/requirements-plot.txt "$DIR/bench/" &&
    rm -f "$DIR"/bench/test_*.py &&
    cp scripts/compute-sanitizer-supp.xml "$DIR/sanitizer-supp.xml" &&
    cp scripts/gpu-suite.sh "$DIR/gpu-suite.sh" &&
    mkdir -p "$DIR/python" && cp -r python/syncbn "$DIR/python/" &&
    rm -rf "$DIR/python/syncbn/__pycache__" &&
    mkdir -p "$DIR/python/syncbn/include" && cp include/syncbn.h "$DIR/python/syncbn/include/" &&
    cp tests/python/test_torch_gpu.py "$DIR/python/" &&
    cp -L "$BUILD/src/libsyncbn.so" "$DIR/python/libsyncbn.so" || exit 1
  # the pip step's build backend, for a machine that reaches no index: scikit-build-core and
  # what it needs (pure-Python wheels; Python 3.9's markers, the widest set of them)
  "$PYTHON" -m pip download -q --dest "$DIR/wheels" --only-binary=:all: --python-version 3.9 \
    scikit-build-core || echo "prebuild: no scikit-build-core wheels (no index here?): the pip step will fail"
  {
    echo "syncbn prebuilt folder: run ./gpu-suite.sh OUTDIR here on a machine with a GPU"
    echo "commit: $(git describe --always --dirty --tags 2>/dev/null || echo unknown)"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -n)"
    echo "cuda_arch: $ARCH"
    echo "nvcc: $(nvcc --version | tail -n 1)"
    echo "nccl_headers: $(grep -E '^#define NCCL_(MAJOR|MINOR|PATCH) ' "$nccl/include/nccl.h" | awk '{print $3}' | paste -sd.)"
    echo "cmake: -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=$ARCH -DSYNCBN_WERROR=ON"
  } >"$DIR/BUILD-INFO" && rm -f "$DIR/.prebuild-unfinished" || exit 1
  # the host symbol tables off the programs and the library (~0.5 MB each; the kernels'
  # .nv_fatbin and the dynamic symbols stay): the folder travels with the source tree
  if command -v strip >/dev/null; then
    for f in "$DIR"/bin/* "$DIR/python/libsyncbn.so"; do
      [ "$(head -c 4 "$f" | tail -c 3)" = ELF ] && { strip --strip-unneeded "$f" || exit 1; }
    done
  else
    echo "prebuild: no strip here: the programs keep their symbol tables"
  fi
  # what travels is DIR.tar.xz (the programs' equal kernels kept once: 48 -> 8 MiB), with
  # the source tree, within the device tool's 64 MiB (gpu_pack.py checks; it exits 1 if not)
  "$PYTHON" scripts/gpu_pack.py "$DIR" | sed 's/^/prebuild: /'
  exit "${PIPESTATUS[0]}"
fi

# ---- a GPU run: from a prebuilt folder, or from a source tree -----------------------------
if [ -f "$HERE/BUILD-INFO" ]; then
  PREBUILT=1
  TESTS=$HERE            # CTest folder
  BIN=$HERE/bin
  BENCH=$HERE/bin/sbn-bench
  PROBE=$HERE/bin/sbn-probe
  PYDIR=$HERE/bench
  PYPKG=$HERE/python
  SBNLIB=$HERE/python/libsyncbn.so
  TORCHGPU=$HERE/python/test_torch_gpu.py
  SUPP=$HERE/sanitizer-supp.xml
  DEFAULT_STEPS=(env probe test sanitize bench fused native torch pytorch plot targets)
  QUICK=1
else
  PREBUILT=0
  cd "$HERE/.." || exit 2
  BUILD=build/gpu
  TESTS=$BUILD
  BIN=$BUILD/tests
  BENCH=$BUILD/bench/sbn-bench
  PROBE=$BUILD/bench/sbn-probe
  PYDIR=bench
  PYPKG=python
  SBNLIB=$BUILD/src/libsyncbn.so
  TORCHGPU=tests/python/test_torch_gpu.py
  SUPP=scripts/compute-sanitizer-supp.xml
  DEFAULT_STEPS=(env build probe test sanitize bench fused native torch pytorch plot targets)
  QUICK=${SBN_SUITE_QUICK:-0}
fi
# Seconds per step in a prebuilt run (9 minutes in all, and the archive is written after
# the last): a step past its limit is stopped and counted as failed, the others still run.
# sanitize: the quick lists took ~280 s on an H200 (2026-11-26, commit 1599faa: 120 s were
# not enough), 245-273 s on the runs since; with it the steps need two calls of the device
# tool (bench/notes/gpu-run.md). 330 s: SBN_KERNEL=small's run under each tool added
# (2026-12-05; ~5-10 s each, predicted from the onchip run's 1.5 s of tests under memcheck)
# pytorch: test_torch_gpu.py compiles a small model four times (inductor on CUDA: ~20-40 s
# each, predicted; not yet measured), so its step has 240 s
# native: syncbn.torch's C++ operators compiled against the machine's PyTorch (~15 s on 2
# cores here; once per machine, into ~/.cache/syncbn)
# torch: the layer's rows, then the fused layer's (the step took 45 s on the H200 of
# 2026-11-30 with 64 + 2 x 27 rows; ~60 predicted with 80 + 2 x 45), then torch_host.py
# twice (~10 s each, predicted): 150 s
# fused: 216 rows of S1-S9 (the 180 rows before the relu fp32 NCHW run: 67 s on an H200,
# 2026-11-28; the H200 run of 2026-11-27 took 0.3 s a plain row with its
# check: ~60 s), the in-place backward's 40 rows (~12 s) and the memory bench
# pip: the CUDA library built by pip (88 s on 2 cores here with the venv made and installed,
# fewer on the GPU machine's 16),
# then test_torch_gpu.py as in the pytorch step
declare -A LIMITS=([env]=15 [probe]=30 [test]=200 [sanitize]=330 [bench]=80 [fused]=150 [native]=60 [torch]=150
  [pytorch]=240 [plot]=20 [targets]=20 [pip]=360)

OUTDIR=${1:-gpu-out}
shift || true
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=("${DEFAULT_STEPS[@]}")

wheel_libs

step_env() {
  nvidia-smi || return 1
  command -v nvcc >/dev/null && nvcc --version
  cmake --version | head -n 1
  command -v compute-sanitizer ncu || true
  [ $PREBUILT = 1 ] && cat "$HERE/BUILD-INFO"
  echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
  echo "NCCL/cuDNN as Python wheels:"
  "$PYTHON" - <<'EOF' || true
import importlib.util
for name in ("nvidia.nccl", "nvidia.cudnn"):
    spec = importlib.util.find_spec(name)
    print(" ", name, list(spec.submodule_search_locations) if spec else "not installed")
EOF
}

step_build() {
  [ $PREBUILT = 0 ] || { echo "a prebuilt folder has no build step"; return 1; }
  local nccl cudnn
  nccl=$(wheel_root nccl)
  cudnn=$(wheel_root cudnn)
  echo "NCCL wheel: ${nccl:-none}; cuDNN wheel: ${cudnn:-none} (searched before the toolkit)"
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSYNCBN_CUDA=ON -DSYNCBN_NCCL=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DSYNCBN_WERROR=ON -DSYNCBN_BUILD_PROBE=ON \
    ${nccl:+-DSYNCBN_NCCL_ROOT="$nccl"} ${cudnn:+-DSYNCBN_CUDNN_ROOT="$cudnn"} &&
    cmake --build "$BUILD" -j "$(nproc)" &&
    grep -E '^SYNCBN_(NCCL|CUDNN)' "$BUILD/CMakeCache.txt"
}

step_probe() {
  # host-memory reads, round trips, instruction fetch, the empty op's stages (issue 27):
  # numbers only, nothing judged; JSON lines into probe.json
  local q=()
  [ "$QUICK" = 1 ] && q=(--quick)
  "$PROBE" "${q[@]}" --json "$OUTDIR/probe.json"
}

step_test() {
  # every GPU test must pass; one that skips (77) on a GPU machine is a failure here.
  # ctest's output goes to the log as it comes (a step or a call cut short keeps what ran)
  # and to a copy that is read for skips; every test's own output, passed ones included
  # (test_gpu_margin's counts and times), is ctest's LastTest.log, kept as test-output.log
  # by the loop below, also when the step is stopped at its limit
  local copy rc
  copy=$(mktemp "${TMPDIR:-/tmp}/gpu-suite-test.XXXXXX") || return 1
  ctest --test-dir "$TESTS" -L 'gpu|prebuilt' --output-on-failure 2>&1 | tee "$copy"
  rc=${PIPESTATUS[0]}
  # grep: 0 a skip, 1 none, 2 the copy unreadable (a failure too)
  local g=0
  grep -Eq '(test_gpu|test_nccl_team|example_ddp_step).*Skipped' "$copy" || g=$?
  rm -f "$copy"
  [ $g -eq 0 ] && echo "!! a GPU test skipped on a GPU machine"
  [ $g -eq 2 ] && echo "!! ctest's output could not be read back for skips"
  [ $rc -eq 0 ] && [ $g -eq 1 ]
}

# compute-sanitizer TOOL [env...] -- PROGRAM: one run, its errors fail the step. memcheck
# takes the suppressions of NCCL's own API errors (scripts/compute-sanitizer-supp.xml:
# error 209 of cudaFuncGetAttributes / cudaGetLastError under ncclInitKernelsForDevice, and
# the memcheck-only cuMemCreate 800 under ncclMemAlloc with cuMemUnmap / cuMemAddressFree 1
# under ncclDevrFinalize, in libnccl.so.2; nothing else: tests/sanitizer/check_supp.py).
sanitize_one() {
  local tool=$1 rc=0
  shift
  local -a envs=() supp=()
  while [ "$1" != -- ]; do envs+=("$1"); shift; done
  shift
  [ "$tool" = memcheck ] && supp=(--suppressions "$SUPP")
  echo "+ ${envs[*]} compute-sanitizer --tool $tool ${supp[*]} $*"
  env "${envs[@]}" compute-sanitizer --tool "$tool" "${supp[@]}" --error-exitcode 99 \
    --print-limit 20 "$@" || rc=$?
  [ $rc -eq 0 ] || echo "!! $tool $* failed ($rc)"
  return $rc
}

step_sanitize() {
  # quick (prebuilt runs): the tests' shorter case lists, which keep the shapes that caught
  # bugs on the first GPU run; otherwise every case
  local rc=0 tool q=()
  [ "$QUICK" = 1 ] && q=(SBN_TEST_QUICK=1)
  # the suppressions hide NCCL's probes only: an API error of anyone else's (here the CUDA
  # runtime's cudaSetDevice(9999) from Python) must still fail memcheck with them
  echo "+ control: compute-sanitizer --tool memcheck --suppressions $SUPP python3 (cudaSetDevice(9999))"
  compute-sanitizer --tool memcheck --suppressions "$SUPP" --error-exitcode 99 "$PYTHON" -c '
import ctypes, glob
lib = (glob.glob("/usr/local/cuda*/lib64/libcudart.so.13") + ["libcudart.so.13"])[0]
print("cudaSetDevice(9999) =", ctypes.CDLL(lib).cudaSetDevice(9999))'
  local crc=$?
  if [ $crc -ne 99 ]; then
    echo "!! control: memcheck with the suppressions exited $crc, not 99: they hide more than NCCL's probes"
    rc=1
  fi
  # The unit and small kernels first, under every tool: no sanitizer has run them yet, and
  # a step stopped at its limit (SBN_SUITE_DEADLINE) keeps what ran. The unit kernel on
  # every op where it applies (auto leaves the fp16/bf16 forwards of planes that are not
  # whole vectors to stream); the team's small kernels (SBN_VAR_SMALL_TEAM) run only when
  # asked: SBN_KERNEL=small's teams of two or more. A team of one's small kernel is auto's
  # wherever it applies (the plain test_gpu_team runs below have it), and SBN_ALGO=nccl's
  # below the host path's small statistics kernel.
  for tool in memcheck racecheck synccheck; do
    sanitize_one $tool "${q[@]}" SBN_KERNEL=unit SBN_TEST_ONLY=virtual_vs_cpu -- "$BIN/test_gpu_team" || rc=1
    sanitize_one $tool "${q[@]}" SBN_KERNEL=small SBN_TEST_ONLY=virtual_vs_cpu -- "$BIN/test_gpu_team" || rc=1
  done
  for tool in memcheck racecheck synccheck; do
    sanitize_one $tool "${q[@]}" -- "$BIN/test_gpu_math" || rc=1
    sanitize_one $tool "${q[@]}" -- "$BIN/test_gpu_team" || rc=1
    # the onchip kernels run only when asked (auto: stream)
    sanitize_one $tool "${q[@]}" SBN_KERNEL=onchip SBN_TEST_ONLY=virtual_vs_cpu -- "$BIN/test_gpu_team" || rc=1
    sanitize_one $tool "${q[@]}" SBN_ALGO=nccl \
      SBN_TEST_ONLY=virtual_vs_cpu,fwd_bwd_one_group,initall_vs_cpu -- "$BIN/test_gpu_team" || rc=1
  done
  # NCCL teams (W = 1): the test forks its ranks, so the sanitizer follows every process
  if [ -x "$BIN/test_nccl_team" ]; then
    for tool in memcheck synccheck; do
      sanitize_one $tool "${q[@]}" SBN_TEST_NCCL_W=1 -- --target-processes all "$BIN/test_nccl_team" || rc=1
    done
  fi
  return $rc
}

step_bench() {
  local quick=()
  [ "$QUICK" = 1 ] && quick=(--quick)
  "$BENCH" --gpu on "${quick[@]}" --json "$OUTDIR/bench.json" || return 1
  # the cooperative kernel's other variant, side by side with the default (auto: stream,
  # or unit for a team of one's NCHW planes, or small for its ops of few rows), on the
  # W = 1 shapes it holds on chip (S2, S10) and the latency rows
  echo "+ SBN_KERNEL=onchip sbn-bench --gpu on ${quick[*]} --only S2,S10 -w 1 --paths coop"
  SBN_KERNEL=onchip "$BENCH" --gpu on "${quick[@]}" --only S2,S10 -w 1 --paths coop \
    --json "$OUTDIR/bench-onchip.json" || return 1
  # and stream where auto runs unit (a team of one's planes: NCHW S2, S5 here, W = 1;
  # bench/notes/experiments.md, E32): the kernel auto ran there before; its inference rows
  # run the plane kernel (SBN_INFER=plane) where bench.json's run the flat one (E36)
  echo "+ SBN_KERNEL=stream SBN_INFER=plane sbn-bench --gpu on ${quick[*]} --only S2,S5 -w 1 --paths coop --layout NCHW"
  SBN_KERNEL=stream SBN_INFER=plane "$BENCH" --gpu on "${quick[@]}" --only S2,S5 -w 1 --paths coop --layout NCHW \
    --json "$OUTDIR/bench-stream.json" || return 1
  # and stream where auto runs small (a team of one's ops of at most 64 rows: S10 and the
  # latency rows at W = 1; E33): the kernel auto ran there before; at W = 1 and 8, so that
  # its latency rows (W = 1..8, stream at each) give the exchange's cost per rank, which
  # bench.json's cannot (small at W = 1, stream above: bench/targets.py, exchange)
  echo "+ SBN_KERNEL=stream sbn-bench --gpu on ${quick[*]} --only S10 -w 1,8 --paths coop"
  SBN_KERNEL=stream "$BENCH" --gpu on "${quick[@]}" --only S10 -w 1,8 --paths coop \
    --json "$OUTDIR/bench-stream-s10.json"
}

step_fused() {
  local rc=0 only=S1,S2,S3,S4,S5,S6,S7,S8,S9
  "$BENCH" --gpu on --epilogue add-relu --only $only -w 1 --dtype fp32 --layout NCHW \
    --json "$OUTDIR/fused-add-relu-fp32.json" || rc=1
  "$BENCH" --gpu on --epilogue add-relu --only $only -w 1 --dtype fp16,bf16 --layout NHWC \
    --json "$OUTDIR/fused-add-relu-half.json" || rc=1
  "$BENCH" --gpu on --epilogue relu --only $only -w 1 --dtype fp16,bf16 --layout NHWC \
    --json "$OUTDIR/fused-relu-half.json" || rc=1
  "$BENCH" --gpu on --epilogue relu --only $only -w 1 --dtype fp32 --layout NCHW \
    --json "$OUTDIR/fused-relu-fp32.json" || rc=1
  # the plain op on the same cells, in the same call: what the fused op adds to it, and
  # what the split pair's activation kernel adds (bench/notes/fused-epilogue.md)
  "$BENCH" --gpu on --only $only -w 1 --paths coop --dtype fp32 --layout NCHW \
    --json "$OUTDIR/fused-plain-fp32.json" || rc=1
  "$BENCH" --gpu on --only $only -w 1 --paths coop --dtype fp16,bf16 --layout NHWC \
    --json "$OUTDIR/fused-plain-half.json" || rc=1
  # the in-place backward (x recovered from y, and z): the bytes of add-relu's and relu's
  # fused ops, whose rows above it is compared with (bench/notes/fused-epilogue.md, "The
  # in-place backward's time"); coop and nccl, on five of the shapes
  local e
  for e in add-leaky-inplace leaky-inplace; do
    "$BENCH" --gpu on --epilogue $e --only S2,S4,S5,S8,S9 -w 1 --dtype fp32 --layout NCHW \
      --json "$OUTDIR/fused-$e-fp32.json" || rc=1
    "$BENCH" --gpu on --epilogue $e --only S2,S4,S5,S8,S9 -w 1 --dtype bf16 --layout NHWC \
      --json "$OUTDIR/fused-$e-bf16.json" || rc=1
  done
  PYTHONPATH="$PYPKG${PYTHONPATH:+:$PYTHONPATH}" SYNCBN_LIBRARY="$SBNLIB" \
    "$PYTHON" "$PYDIR/torch_fused_memory.py" --device cuda --batch 8 --size 256 \
    --json "$OUTDIR/fused-memory.json" || rc=1
  return $rc
}

step_native() {
  # syncbn.torch's C++ operators, built here before the steps that time and test the layer
  # (a build inside them would count against their limits); says what they will run on.
  # A failed build: the Python operators (auto), and test_torch_gpu.py fails, naming why.
  PYTHONPATH="$PYPKG${PYTHONPATH:+:$PYTHONPATH}" SYNCBN_LIBRARY="$SBNLIB" "$PYTHON" -c '
import time; t = time.monotonic()
import torch, syncbn.torch
from syncbn import _ops
print("torch", torch.__version__, "- syncbn.torch runs on the",
      f"C++ operators ({_ops.NATIVE.path})" if _ops.NATIVE else f"Python operators ({_ops.NATIVE_WHY})",
      f"- import and build {time.monotonic() - t:.1f} s")
raise SystemExit(_ops.NATIVE is None)'
}

step_torch() {
  # the bytes and floors of its rows are sbn-bench's (bench/floors.c), read from its JSON
  local floors=() quick=() rc=0
  [ -f "$OUTDIR/bench.json" ] && floors=(--floors-from "$OUTDIR/bench.json")
  [ "$QUICK" = 1 ] && quick=(--only S1,S2,S5,S10)
  # syncbn_torch: this project's PyTorch layer on the same process group (issue 28);
  # syncbn_torch_op: its operators called directly, as torch_syncbn calls PyTorch's
  PYTHONPATH="$PYPKG${PYTHONPATH:+:$PYTHONPATH}" SYNCBN_LIBRARY="$SBNLIB" \
    "$PYTHON" "$PYDIR/torch_baseline.py" --paths torch_bn,torch_bn_module,torch_syncbn,syncbn_torch,syncbn_torch_op \
    "${floors[@]}" "${quick[@]}" --json "$OUTDIR/torch.json" || rc=1
  # the fused layer (issue 51) against what a torchvision block runs in PyTorch (batch norm,
  # += identity, ReLU), on the fused step's shapes; floors from its JSON when it ran
  local e dt lo f
  for e in "add-relu fp32 NCHW fused-add-relu-fp32" "relu bf16 NHWC fused-relu-half"; do
    read -r e dt lo f <<<"$e"
    floors=()
    [ -f "$OUTDIR/$f.json" ] && floors=(--floors-from "$OUTDIR/$f.json")
    PYTHONPATH="$PYPKG${PYTHONPATH:+:$PYTHONPATH}" SYNCBN_LIBRARY="$SBNLIB" \
      "$PYTHON" "$PYDIR/torch_baseline.py" --paths torch_bn,torch_bn_module,torch_syncbn,syncbn_torch,syncbn_torch_op --epilogue "$e" \
      --only S1,S2,S3,S4,S5,S6,S7,S8,S9 --dtype "$dt" --layout "$lo" "${floors[@]}" \
      --json "$OUTDIR/torch-$f.json" || rc=1
  done
  # issue 49's targets row by row (a report: it fails nothing), from the JSON just written
  # against sbn-bench's of the same run
  for f in "torch bench" "torch-fused-add-relu-fp32 fused-add-relu-fp32" "torch-fused-relu-half fused-relu-half"; do
    read -r e dt <<<"$f"
    [ -f "$OUTDIR/$e.json" ] && [ -f "$OUTDIR/$dt.json" ] &&
      "$PYTHON" "$PYDIR/torch_targets.py" "$OUTDIR/$e.json" "$OUTDIR/$dt.json"
  done
  # the host target of issue 49 where drift cannot decide it: the layer and nn.BatchNorm2d
  # (and the fused layer and BatchNorm2d + ReLU) timed round by round in one process
  for f in "fp32 NCHW" "bf16 NHWC"; do
    read -r dt lo <<<"$f"
    PYTHONPATH="$PYPKG${PYTHONPATH:+:$PYTHONPATH}" SYNCBN_LIBRARY="$SBNLIB" \
      "$PYTHON" "$PYDIR/torch_host.py" --device cuda --dtype "$dt" --layout "$lo" \
      --json "$OUTDIR/torch-host-$dt.json" || rc=1
  done
  return $rc
}

step_pytorch() {
  # syncbn.torch on the GPU (issue 28): a team from a process group, a training step
  # against PyTorch's own SyncBatchNorm, CUDA graph capture and replay bitwise equal to
  # eager; the binding's cost per op (printed). It must pass here, not skip (77).
  local rc=0
  PYTHONPATH="$PYPKG${PYTHONPATH:+:$PYTHONPATH}" SYNCBN_LIBRARY="$SBNLIB" "$PYTHON" "$TORCHGPU" || rc=$?
  [ $rc -eq 77 ] && echo "!! test_torch_gpu.py skipped on a GPU machine"
  return $rc
}

step_pip() {
  local tmp rc=0
  tmp=$(mktemp -d "${TMPDIR:-/tmp}/syncbn-pip.XXXXXX") || return 1
  pip_install_and_test "$tmp/venv" || rc=$?
  rm -rf "$tmp"
  return $rc
}

pip_install_and_test() {
  local src venv=$1 log=$OUTDIR/pip-install.log index=()
  if [ $PREBUILT = 1 ]; then src=${SBN_SOURCE:-$HERE/../..}; else src=${SBN_SOURCE:-.}; fi
  src=$(cd "$src" 2>/dev/null && pwd) && [ -f "$src/pyproject.toml" ] ||
    { echo "pip: no source tree at '$src' (SBN_SOURCE names one)"; return 1; }
  [ -d "$HERE/wheels" ] && index=(--no-index --find-links "$HERE/wheels")
  # a venv that sees PYTHON's packages (its PyTorch, wherever PYTHON has it: a venv of its
  # own too) through a .pth file, and installs into its own site-packages
  "$PYTHON" -m venv "$venv" &&
    "$PYTHON" -c 'import site; print("\n".join(site.getsitepackages() + [site.getusersitepackages()]))' \
      >"$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/syncbn-parent.pth" &&
    "$venv/bin/python" -m pip install -q "${index[@]}" scikit-build-core || return 1
  echo "+ (cd $src && pip install -v --no-build-isolation --no-deps .) > pip-install.log"
  (cd "$src" && "$venv/bin/python" -m pip install -v --no-build-isolation --no-deps "${index[@]}" .) \
    >"$log" 2>&1 || { tail -n 40 "$log"; return 1; }
  grep -E "syncbn: (CUDA|NCCL)" "$log"
  # from a folder of its own: the script's folder (a prebuilt one holds a copy of the
  # package) must not come first on sys.path
  mkdir -p "$venv/run" && cp "$TORCHGPU" "$venv/run/" || return 1
  local rc=0
  (cd "$venv/run" && env -u SYNCBN_LIBRARY -u PYTHONPATH "$venv/bin/python" -c '
import sys, syncbn
print("syncbn from", syncbn.__file__, "library", syncbn.library_path)
sys.exit(not syncbn.library_path.startswith(sys.prefix))' &&
    env -u SYNCBN_LIBRARY -u PYTHONPATH "$venv/bin/python" test_torch_gpu.py) || rc=$?
  [ $rc -eq 77 ] && echo "!! test_torch_gpu.py skipped on a GPU machine"
  return $rc
}

step_plot() {
  local files=()
  for f in "$OUTDIR/bench.json" "$OUTDIR/torch.json"; do [ -f "$f" ] && files+=("$f"); done
  "$PYTHON" "$PYDIR/plot.py" --out "$OUTDIR/plots" "${files[@]}"
}

step_targets() {
  # the main bench file first (a cell several files hold is judged from the first), then
  # the others that targets.py reads: the bench's variants, the fused step's, torch.json
  local files=() f
  for f in "$OUTDIR/bench.json" "$OUTDIR"/bench-*.json "$OUTDIR"/fused-*.json "$OUTDIR/torch.json"; do
    [ -f "$f" ] && files+=("$f")
  done
  [ ${#files[@]} -gt 0 ] || { echo "targets: no JSON in $OUTDIR (the bench, fused and torch steps write it)"; return 1; }
  echo "+ targets.py ${files[*]##*/} > targets.txt"
  "$PYTHON" "$PYDIR/targets.py" "${files[@]}" >"$OUTDIR/targets.txt" || return 1
  sed -n '/^## summary/,$p' "$OUTDIR/targets.txt" # the log's: what --summary prints
}

declare -A RESULT
FAILED=0
T0=$SECONDS
# Every word checked before anything runs or is written: a mistyped OUTDIR or step stops
# the run here (exit 2), not after the steps before it, and never leaves logs elsewhere.
case "$OUTDIR" in
  "" | -*)
    echo "OUTDIR '$OUTDIR': give a folder first (e.g. gpu-out), then the steps (${DEFAULT_STEPS[*]})" >&2
    exit 2
    ;;
esac
for step in "${STEPS[@]}"; do
  if ! declare -F "step_$step" >/dev/null; then
    echo "unknown step '$step' (steps: ${DEFAULT_STEPS[*]})" >&2
    exit 2
  fi
done
DEADLINE=${SBN_SUITE_DEADLINE:-}
case "$DEADLINE" in
  "" | *[!0-9]*) [ -z "$DEADLINE" ] || { echo "SBN_SUITE_DEADLINE '$DEADLINE': give whole seconds" >&2; exit 2; } ;;
  *) DEADLINE=$((10#$DEADLINE)) ;; # decimal: 0460 is not octal here
esac
# A prebuilt run archives OUTDIR's files and removes them (the device tool returns few
# files): OUTDIR must then be new or empty, so that nothing else in it is taken.
if [ $PREBUILT = 1 ] && [ -d "$OUTDIR" ] && [ -n "$(ls -A -- "$OUTDIR")" ]; then
  echo "OUTDIR '$OUTDIR' is not empty: give a new folder (a prebuilt run packs everything in it into gpu-suite.tar.gz and removes the rest)" >&2
  exit 2
fi
mkdir -p -- "$OUTDIR" && OUTDIR=$(cd -- "$OUTDIR" && pwd -P) && [ -n "$OUTDIR" ] ||
  { echo "OUTDIR: cannot make or enter the folder" >&2; exit 2; }
for step in "${STEPS[@]}"; do
  echo "==> $step"
  t0=$SECONDS
  lim=${LIMITS[$step]:-}
  if [ $PREBUILT = 1 ] && [ -n "$lim" ] && [ -n "$DEADLINE" ]; then
    left=$((DEADLINE - SECONDS - 5)) # from the script's start; timeout's KILL comes 5 s after its TERM
    [ $left -lt "$lim" ] && lim=$left
    if [ $lim -le 0 ]; then
      RESULT[$step]="not run (SBN_SUITE_DEADLINE=$DEADLINE s reached)"
      FAILED=1
      echo "==> $step: ${RESULT[$step]}"
      continue
    fi
  fi
  if [ $PREBUILT = 1 ] && [ -n "$lim" ]; then
    # the step in a subshell under a limit (timeout sends TERM, then KILL 5 s later)
    export -f "step_$step" sanitize_one wheel_root pip_install_and_test 2>/dev/null
    export HERE PYTHON ARCH PREBUILT TESTS BIN BENCH PROBE PYDIR PYPKG SBNLIB TORCHGPU SUPP QUICK OUTDIR LD_LIBRARY_PATH
    timeout -k 5 "$lim" bash -c "step_$step" >"$OUTDIR/$step.log" 2>&1
  else
    "step_$step" >"$OUTDIR/$step.log" 2>&1
  fi
  rc=$?
  # every test's own output, a test step cut short included
  [ "$step" = test ] && cp "$TESTS/Testing/Temporary/LastTest.log" "$OUTDIR/test-output.log" 2>/dev/null
  if [ $rc -eq 0 ]; then
    RESULT[$step]="ok"
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    RESULT[$step]="FAILED (stopped at its limit of $lim s)"
    FAILED=1
  else
    RESULT[$step]="FAILED ($rc)"
    FAILED=1
  fi
  echo "==> $step: ${RESULT[$step]} in $((SECONDS - t0)) s"
  tail -n 25 "$OUTDIR/$step.log"
done
{
  echo "==== gpu-suite summary ($((SECONDS - T0)) s) ===="
  [ $PREBUILT = 1 ] && cat "$HERE/BUILD-INFO"
  for step in "${STEPS[@]}"; do printf '  %-9s %s\n' "$step" "${RESULT[$step]}"; done
} | tee "$OUTDIR/summary.txt"
if [ $PREBUILT = 1 ]; then
  # everything else into one archive: OUTDIR keeps summary.txt and gpu-suite.tar.gz
  (cd "$OUTDIR" && find . -mindepth 1 -maxdepth 1 ! -name summary.txt ! -name gpu-suite.tar.gz \
    -printf '%P\n' | tar -czf gpu-suite.tar.gz -T - && find . -mindepth 1 -maxdepth 1 \
    ! -name summary.txt ! -name gpu-suite.tar.gz -exec rm -rf {} +)
  echo "OUTDIR: $(cd "$OUTDIR" && ls)"
fi
exit $FAILED
