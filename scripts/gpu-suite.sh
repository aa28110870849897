#!/usr/bin/env bash
# scripts/gpu-suite.sh — everything that needs a GPU, in one command, for a machine with
# one (the CI machines have none). Steps:
#   env       nvidia-smi, nvcc, cmake, and where NCCL / cuDNN are (toolkit or Python wheels)
#   build     configure + build into build/gpu (Release with line info, CUDA arch 90
#             unless CUDA_ARCH is set)
#   test      the whole CTest suite; GPU tests must PASS here, not skip
#   sanitize  compute-sanitizer memcheck, racecheck, synccheck over the GPU tests
#             (SBN_TEST_QUICK=1: the tests' smaller case lists)
#   bench     sbn-bench (GPU mode: coop, nccl-path, cuDNN), table + JSON; then the coop
#             path again with SBN_KERNEL=stream and SBN_KERNEL=legacy
#   torch     bench/torch_baseline.py (PyTorch BN and the SyncBatchNorm op sequence), JSON;
#             its bytes and floors read from the bench step's JSON
#   plot      bench/plot.py: PNG charts + results.md from the JSON files (needs matplotlib)
# PYTHON selects the interpreter with torch (default python3). NCCL and cuDNN are taken
# from the nvidia-nccl-cu13 / nvidia-cudnn-cu13 wheels of PYTHON when installed, else the toolkit.
# Usage: scripts/gpu-suite.sh [OUTDIR] [steps...]   (OUTDIR default: ./gpu-out; all steps)
# Each step logs to OUTDIR/<step>.log; the summary says which failed; exit 1 if any did.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

OUTDIR=${1:-gpu-out}
shift || true
mkdir -p "$OUTDIR"
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(env build test sanitize bench torch plot)
PYTHON=${PYTHON:-python3}
BUILD=build/gpu
ARCH=${CUDA_ARCH:-90}
GPU_TESTS=(test_gpu_math test_gpu_team)

step_env() {
  nvidia-smi || return 1
  nvcc --version
  cmake --version | head -n 1
  command -v compute-sanitizer ncu || true
  echo "NCCL/cuDNN in the toolkit:"
  ls "$(dirname "$(command -v nvcc)")/../lib64" 2>/dev/null | grep -E 'libnccl|libcudnn' || echo "  none"
  echo "NCCL/cuDNN as Python wheels:"
  python3 - <<'EOF' || true
import importlib.util, os
for name in ("nvidia.nccl", "nvidia.cudnn"):
    spec = importlib.util.find_spec(name)
    print(" ", name, list(spec.submodule_search_locations) if spec else "not installed")
EOF
}

# <site-packages>/nvidia/<name> of a wheel, or nothing
wheel_root() {
  "$PYTHON" -c 'import importlib.util, sys
spec = importlib.util.find_spec("nvidia." + sys.argv[1])
print(list(spec.submodule_search_locations)[0] if spec and spec.submodule_search_locations else "")' "$1" 2>/dev/null
}

step_build() {
  local nccl cudnn
  nccl=$(wheel_root nccl)
  cudnn=$(wheel_root cudnn)
  echo "NCCL wheel: ${nccl:-none}; cuDNN wheel: ${cudnn:-none} (searched before the toolkit)"
  cmake -S . -B "$BUILD" -DCMAKE_BUILD_TYPE=Release -DSYNCBN_CUDA=ON -DSYNCBN_NCCL=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$ARCH" -DSYNCBN_WERROR=ON \
    ${nccl:+-DSYNCBN_NCCL_ROOT="$nccl"} ${cudnn:+-DSYNCBN_CUDNN_ROOT="$cudnn"} &&
    cmake --build "$BUILD" -j "$(nproc)" &&
    grep -E '^SYNCBN_(NCCL|CUDNN)' "$BUILD/CMakeCache.txt"
}

step_test() {
  # every test must pass; a GPU test that skips (77) on a GPU machine is a failure here
  local log rc
  log=$(ctest --test-dir "$BUILD" --output-on-failure 2>&1)
  rc=$?
  echo "$log"
  [ $rc -eq 0 ] || return 1
  if grep -Eq '(test_gpu|test_nccl_team|example_ddp_step).*Skipped' <<<"$log"; then
    echo "!! a GPU test skipped on a GPU machine"
    return 1
  fi
}

step_sanitize() {
  local t tool rc=0
  for tool in memcheck racecheck synccheck; do
    for t in "${GPU_TESTS[@]}"; do
      echo "+ compute-sanitizer --tool $tool --error-exitcode 99 $BUILD/tests/$t"
      SBN_TEST_QUICK=1 compute-sanitizer --tool "$tool" --error-exitcode 99 \
        --print-limit 20 "$BUILD/tests/$t" || { echo "!! $tool $t failed"; rc=1; }
    done
    echo "+ SBN_ALGO=nccl compute-sanitizer --tool $tool $BUILD/tests/test_gpu_team (host path)"
    SBN_ALGO=nccl SBN_TEST_ONLY=virtual_vs_cpu,fwd_bwd_one_group,initall_vs_cpu SBN_TEST_QUICK=1 \
      compute-sanitizer --tool "$tool" --error-exitcode 99 --print-limit 20 \
      "$BUILD/tests/test_gpu_team" || { echo "!! $tool test_gpu_team (SBN_ALGO=nccl) failed"; rc=1; }
  done
  # NCCL teams (W = 1): the test forks its ranks, so the sanitizer follows every process
  if [ -x "$BUILD/tests/test_nccl_team" ]; then
    for tool in memcheck synccheck; do
      echo "+ compute-sanitizer --tool $tool --target-processes all $BUILD/tests/test_nccl_team (W = 1)"
      SBN_TEST_QUICK=1 SBN_TEST_NCCL_W=1 compute-sanitizer --tool "$tool" --target-processes all \
        --error-exitcode 99 --print-limit 20 "$BUILD/tests/test_nccl_team" ||
        { echo "!! $tool test_nccl_team failed"; rc=1; }
    done
  fi
  return $rc
}

step_bench() {
  "$BUILD/bench/sbn-bench" --gpu on --json "$OUTDIR/bench.json" || return 1
  # the cooperative kernel's other variants, side by side with the default (auto: onchip
  # where the tensors fit, else stream): the first kernel stays until a GPU has compared it
  local v
  for v in stream legacy; do
    echo "+ SBN_KERNEL=$v sbn-bench --gpu on --paths coop"
    SBN_KERNEL=$v "$BUILD/bench/sbn-bench" --gpu on --paths coop --json "$OUTDIR/bench-$v.json" ||
      return 1
  done
}

step_torch() {
  # the bytes and floors of its rows are sbn-bench's (bench/floors.c), read from its JSON
  local floors=()
  [ -f "$OUTDIR/bench.json" ] && floors=(--floors-from "$OUTDIR/bench.json")
  "$PYTHON" bench/torch_baseline.py "${floors[@]}" --json "$OUTDIR/torch.json"
}

step_plot() {
  local files=()
  for f in "$OUTDIR/bench.json" "$OUTDIR/torch.json"; do [ -f "$f" ] && files+=("$f"); done
  "$PYTHON" bench/plot.py --out "$OUTDIR/plots" "${files[@]}"
}

declare -A RESULT
FAILED=0
for step in "${STEPS[@]}"; do
  echo "==> $step"
  t0=$SECONDS
  "step_$step" >"$OUTDIR/$step.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then RESULT[$step]="ok"; else RESULT[$step]="FAILED ($rc)"; FAILED=1; fi
  echo "==> $step: ${RESULT[$step]} in $((SECONDS - t0)) s"
  tail -n 25 "$OUTDIR/$step.log"
done
echo "==== gpu-suite summary ===="
for step in "${STEPS[@]}"; do printf '  %-9s %s\n' "$step" "${RESULT[$step]}"; done
exit $FAILED
