# shellcheck shell=bash
# cuda-tools.sh — sourced (not run) by scripts/check-sass.sh and scripts/sass-diff.sh:
# where nvcc, cuobjdump and nvdisasm are, and kernels/coop.cu compiled to a cubin the way
# the library builds it. Defined once so the two scripts look at the same machine code.
# Every function returns 0 (the scripts run under set -e); results are in variables.

# NVCC := nvcc on PATH, else /usr/local/cuda/bin/nvcc, else empty; CUDA_BIN := its folder.
sbn_find_nvcc() {
  NVCC=$(command -v nvcc || true)
  if [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
  CUDA_BIN=${NVCC:+$(dirname "$NVCC")}
  return 0
}

# sbn_find_tool NAME: echoes a path to an executable NAME (PATH, the toolkit of $NVCC,
# then ${SBN_TOOLS_DIR:-~/.cache/syncbn-tools}, where check-sass.sh installs the wheels),
# or nothing.
sbn_find_tool() {
  local t
  t=$(command -v "$1" || true)
  [ -n "$t" ] && { echo "$t"; return 0; }
  [ -n "${CUDA_BIN:-}" ] && [ -x "$CUDA_BIN/$1" ] && { echo "$CUDA_BIN/$1"; return 0; }
  t=$(find "${SBN_TOOLS_DIR:-$HOME/.cache/syncbn-tools}" -name "$1" -type f -perm -u+x 2>/dev/null | head -n 1)
  [ -n "$t" ] && echo "$t"
  return 0
}

# CUOBJDUMP, NVDISASM := sbn_find_tool of each (empty where not found). Where both are
# found, nvdisasm's folder goes first on PATH: cuobjdump -sass runs nvdisasm from PATH.
sbn_find_disasm() {
  CUOBJDUMP=$(sbn_find_tool cuobjdump)
  NVDISASM=$(sbn_find_tool nvdisasm)
  if [ -n "$CUOBJDUMP" ] && [ -n "$NVDISASM" ]; then
    PATH="$(dirname "$NVDISASM"):$PATH"
    export PATH
  fi
  return 0
}

# DEFS := the defines the library compiles the kernels with: CUDA, and NCCL's window
# transport where nccl.h is found (the toolkit, or $SYNCBN_NCCL_ROOT as CMake takes it).
sbn_kernel_defs() {
  local h
  DEFS=(-DSYNCBN_HAVE_CUDA=1)
  h=$(find "$CUDA_BIN/../include" ${SYNCBN_NCCL_ROOT:+"$SYNCBN_NCCL_ROOT/include"} -maxdepth 1 \
    -name nccl.h 2>/dev/null | head -n 1)
  if [ -n "$h" ]; then DEFS+=(-DSYNCBN_HAVE_NCCL=1 -I"$(dirname "$h")"); fi
  return 0
}

# sbn_coop_cubin SM OUT [NVCC FLAGS...]: kernels/coop.cu of the current folder (a source
# tree: include/ and kernels/) -> the sm_SM cubin OUT. Needs sbn_find_nvcc, sbn_kernel_defs.
sbn_coop_cubin() {
  local sm=$1 out=$2
  shift 2
  "$NVCC" -arch=sm_"$sm" -cubin -std=c++17 "$@" -Iinclude -Ikernels "${DEFS[@]}" \
    -o "$out" kernels/coop.cu
}
