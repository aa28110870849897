#!/usr/bin/env bash
# gpu-variants.sh — build sbn-bench once per kernel variant, here (no GPU needed), into one
# folder the device tool carries; scripts/gpu-ab.sh then times them side by side there.
#
#   scripts/gpu-variants.sh OUTDIR NAME=FLAGS...
#
# NAME=FLAGS: a label and the -D flags of the variant, e.g.
#   base=  u8="-DSBN_BATCH_FWD=8 -DSBN_BATCH_BWD=4"  bps3=-DSBN_STREAM_BLOCKS_PER_SM=3
# (the knobs kernels/coop_plan.h leaves open with #ifndef: SBN_BATCH_FWD, SBN_BATCH_BWD,
# SBN_STREAM_BLOCKS_PER_SM; a mutant, -DSBN_KERNEL_MUTANTS=...). The flags go to the C, C++ and CUDA
# compilers alike: the host's plan uses the same constants as the kernels. Each variant is
# built in build/var-NAME (Release, sm_90, NCCL headers as scripts/gpu-suite.sh prebuild
# finds them) and copied to OUTDIR/sbn-bench.NAME; OUTDIR/VARIANTS.txt lists name, flags,
# commit, and how many cooperative kernels have a stack frame (spills; cuobjdump where
# found: a variant that spills is timed all the same, and says so); OUTDIR/run.sh is the
# device command, and OUTDIR.tar.xz what the device tool carries (scripts/gpu_pack.py; it
# says how to unpack it there):
#
#   python3 scripts/gpu_pack.py --extract OUTDIR.tar.xz PARENT && bash OUTDIR/run.sh $OUT [ROUNDS] [-- SBN-BENCH OPTIONS]
#                                          (default: 2 rounds, --only S1,S2,S5 -w 1,8 --paths coop)
#
# which runs scripts/gpu-ab.sh over every variant (the first is the base of the ratios)
# with the wheels' NCCL and cuDNN on LD_LIBRARY_PATH, and leaves $OUT/ab.tar.gz. Both run
# from the repository root (the device tool's working folder); OUTDIR is taken from there.
# NAME without "=FLAGS" is an error.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${1%/}
shift
[ $# -gt 0 ] || { echo "usage: $0 OUTDIR NAME=FLAGS..." >&2; exit 2; }
. scripts/cuda-tools.sh
sbn_find_nvcc
sbn_find_disasm
[ -n "$NVCC" ] || { echo "gpu-variants: no nvcc" >&2; exit 1; }
nccl=$(scripts/gpu-suite.sh nccl-root) # the prebuild's NCCL
[ -f "$nccl/include/nccl.h" ] || { echo "gpu-variants: no nccl.h under '$nccl'" >&2; exit 1; }
# no variant or archive of an earlier build is left: a folder this script made is replaced
if [ -e "$OUT" ] && [ ! -f "$OUT/VARIANTS.txt" ]; then
  echo "gpu-variants: $OUT exists and is no folder of variants (no VARIANTS.txt): not replaced" >&2
  exit 2
fi
rm -rf "$OUT" "$OUT.tar.xz"
mkdir -p "$OUT"
commit=$(git describe --always --dirty --tags 2>/dev/null || echo unknown)
echo "# variants of commit $commit, built $(date -u +%FT%TZ)" > "$OUT/VARIANTS.txt"
names=()
for v in "$@"; do
  case "$v" in *=*) ;; *) echo "gpu-variants: '$v' is not NAME=FLAGS" >&2; exit 2 ;; esac
  name=${v%%=*}
  flags=${v#*=}
  b=build/var-$name
  echo "==> $name: '${flags}' in $b"
  cmake -S . -B "$b" -DCMAKE_BUILD_TYPE=Release -DSYNCBN_CUDA=ON -DSYNCBN_NCCL=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90 -DSYNCBN_NCCL_ROOT="$nccl" \
    -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" -DCMAKE_CUDA_FLAGS="$flags" \
    > "$b.cfg.log" 2>&1 || { echo "configure failed: $b.cfg.log" >&2; exit 1; }
  cmake --build "$b" -j "$(nproc)" --target sbn-bench > "$b.build.log" 2>&1 ||
    { echo "build failed: $b.build.log" >&2; exit 1; }
  cp "$b/bench/sbn-bench" "$OUT/sbn-bench.$name"
  stack="?"
  if [ -n "$CUOBJDUMP" ]; then
    stack=$("$CUOBJDUMP" -res-usage "$b/bench/sbn-bench" 2>/dev/null | grep -A1 sbn_coop_kernel |
      grep -c "STACK:[1-9]" || true)
  fi
  printf '%s\t%s\t%s\tcooperative kernels with a stack frame (spills): %s\n' \
    "$name" "$flags" "$commit" "$stack" >> "$OUT/VARIANTS.txt"
  names+=("$name")
done
{
  echo '#!/usr/bin/env bash'
  echo '# written by scripts/gpu-variants.sh: bash THIS $OUT [ROUNDS] [-- SBN-BENCH OPTIONS]'
  echo 'set -u'
  echo 'D=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd); O=${1:?OUT}; shift; R=2'
  echo 'case "${1:-}" in ""|--) ;; *[!0-9]*) echo "ROUNDS: a number, not $1" >&2; exit 2 ;;'
  echo '  *) R=$1; shift ;; esac'
  echo '[ "${1:-}" = "--" ] && shift'
  echo '[ $# -gt 0 ] || set -- --only S1,S2,S5 -w 1,8 --paths coop'
  echo 'mkdir -p "$O" || exit 1'
  echo 'cp "$D/VARIANTS.txt" "$O/"'
  printf 'scripts/gpu-suite.sh with-libs scripts/gpu-ab.sh "$O/ab" "$R"'
  for n in "${names[@]}"; do printf ' "%s=$D/sbn-bench.%s"' "$n" "$n"; done
  echo ' -- "$@"'
} > "$OUT/run.sh"
chmod +x "$OUT/run.sh"
cat "$OUT/VARIANTS.txt"
# what the device tool carries: OUTDIR.tar.xz (with the source tree, within 64 MiB)
"${PYTHON:-python3}" scripts/gpu_pack.py "$OUT"
