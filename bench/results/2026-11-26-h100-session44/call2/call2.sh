#!/usr/bin/env bash
# session 44, call 2: the per-unit barriers change (0700d82, built here
# into build/prebuilt; split and the mutant built from the same source) against 0083b00's kernels (build/v44/sbn-bench.base) and the
# split-sums experiment (build/v44/sbn-bench.split, -DSBN_FWD_SPLIT_SUMS=1), W = 1, 2
# rounds; then the GPU tests on the change; then racecheck on test_gpu_team (stream, the
# host path, the mutant SBN_MUT_COEF_NO_BARRIER that must show hazards, onchip)
set -u
O=${1:?OUT}
mkdir -p $O; cp "$0" $O/call2.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $O/gpu.txt 2>&1
date -u > $O/date.txt
t0=$(date +%s)
W="scripts/gpu-suite.sh with-libs"
B=build/prebuilt/bin
echo "== ab $(($(date +%s)-t0)) s"
timeout 110 $W scripts/gpu-ab.sh $O/ab 2 base=build/v44/sbn-bench.base units=$B/sbn-bench \
  split=build/v44/sbn-bench.split -- --only S1,S2,S4,S5,S6,S7,S8,S9 -w 1 --paths coop > $O/ab.log 2>&1
echo "ab rc $?"
echo "== test $(($(date +%s)-t0)) s"
timeout 150 build/prebuilt/gpu-suite.sh $O/suite test > $O/suite.log 2>&1; echo "suite test rc $?"
rc1() { local name=$1 lim=$2; shift 2; echo "== racecheck $name $(($(date +%s)-t0)) s"
  timeout $lim env SBN_TEST_QUICK=1 "$@" > $O/racecheck-$name.log 2>&1; echo "racecheck $name rc $?"; }
RC="compute-sanitizer --tool racecheck --print-limit 20"
rc1 stream 50 $W $RC $B/test_gpu_team
rc1 host 40 SBN_ALGO=nccl SBN_TEST_ONLY=virtual_vs_cpu,fwd_bwd_one_group,initall_vs_cpu $W $RC $B/test_gpu_team
rc1 mutant 40 SBN_TEST_ONLY=virtual_vs_cpu $W $RC build/v44/test_gpu_team.mutant
rc1 onchip 40 SBN_KERNEL=onchip SBN_TEST_ONLY=virtual_vs_cpu $W $RC $B/test_gpu_team
echo "== done $(($(date +%s)-t0)) s"
grep -h "RACECHECK SUMMARY" $O/racecheck-*.log
