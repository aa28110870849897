#!/usr/bin/env bash
# session 42, call 1 (HEAD 91f125f): the suite's env probe test bench (probe: the new
# bandwidth section, S10/S3 both ways); every --quick coop row with SBN_KERNEL=stream (auto's
# choice); the l2normal A/B; ncu stall sampling on S5 fp32 NCHW stream forward; ncu time and
# instructions of S10's kernels onchip and stream
set -u
O=${1:?OUT}; D=build/variants
mkdir -p $O; cp "$0" $O/call1.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $O/gpu.txt 2>&1
date -u > $O/date.txt
t0=$(date +%s)
W="scripts/gpu-suite.sh with-libs"
echo "== suite $(($(date +%s)-t0)) s"
timeout 330 build/prebuilt/gpu-suite.sh $O/suite env probe test bench > $O/suite.log 2>&1; echo "suite rc $?"
echo "== bench stream $(($(date +%s)-t0)) s"
SBN_KERNEL=stream timeout 60 $W build/prebuilt/bin/sbn-bench --gpu on --quick --paths coop --json $O/bench-stream.json > $O/bench-stream.log 2>&1; echo "bench-stream rc $?"
echo "== ab $(($(date +%s)-t0)) s"
timeout 110 bash $D/run.sh $O 2 -- --only S1,S4,S5,S6,S8,S9 -w 1 --paths coop > $O/ab.log 2>&1; echo "ab rc $?"
echo "== ncu stalls $(($(date +%s)-t0)) s"
timeout 50 $W ncu --section WarpStateStats --section SourceCounters -k regex:sbn_coop_kernel --launch-count 1 \
  $D/sbn-bench.base --gpu on --only S5 --dtype fp32 --layout NCHW -w 1 --paths coop -i 1 --warmup 0 --check-channels 1 \
  > $O/ncu-stalls-s5.log 2>&1; echo "ncu stalls rc $?"
for k in onchip stream; do
  echo "== ncu s10 $k $(($(date +%s)-t0)) s"
  SBN_KERNEL=$k timeout 30 $W ncu --metrics gpu__time_duration.sum,sm__inst_executed.sum,smsp__inst_executed.max,launch__grid_size,launch__block_size,launch__registers_per_thread \
    -k regex:sbn_coop_kernel --launch-count 4 \
    $D/sbn-bench.base --gpu on --only S10 --dtype fp32 --layout NCHW -w 1 --paths coop -i 1 --warmup 0 --check-channels 1 \
    > $O/ncu-s10-$k.log 2>&1; echo "ncu s10 $k rc $?"
done
echo "== done $(($(date +%s)-t0)) s"
cd $O && tar czf call1.tar.gz --exclude=call1.tar.gz . 2>/dev/null; ls
