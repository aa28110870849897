#!/usr/bin/env bash
# session 41, call 2: issue 13's A/B of the stream copy pipeline (pipe1, pipe2: SBN_STREAM_PIPE)
# and of the L2 prefetch (ahead1: AHEAD 1; nopf: none, the mutant SBN_MUT_NO_PREFETCH) against
# base, on the shapes the stream kernels run at W = 1; ncu of pipe2's S5 fp32 NCHW kernels
set -u
O=${1:?OUT}; D=build/variants
mkdir -p $O; cp "$0" $O/call2.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $O/gpu.txt 2>&1
date -u > $O/date.txt
t0=$(date +%s)
W="scripts/gpu-suite.sh with-libs"
echo "== ab $(($(date +%s)-t0)) s"
timeout 330 bash $D/run.sh $O 2 -- --only S1,S4,S5,S6,S7,S8,S9 -w 1 --paths coop > $O/ab.log 2>&1; echo "ab rc $?"
echo "== ncu pipe2 $(($(date +%s)-t0)) s"
timeout 60 $W ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section MemoryWorkloadAnalysis --section LaunchStats -k regex:sbn_coop_kernel --launch-count 2 \
  $D/sbn-bench.pipe2 --gpu on --only S5 --dtype fp32 --layout NCHW -w 1 --paths coop -i 1 --warmup 0 --check-channels 1 \
  > $O/ncu-pipe2-s5.log 2>&1; echo "ncu pipe2 rc $?"
echo "== done $(($(date +%s)-t0)) s"
cd $O && tar czf call2.tar.gz *.log *.txt *.sh 2>/dev/null; ls
