#!/usr/bin/env bash
# session 44, call 1 (HEAD 0083b00): the whole suite (9da7f5f's test changes and 0083b00's
# merges have not run on a GPU), then ncu's per-SASS-instruction source counters on the
# S5 fp32 NCHW stream forward and backward (where the issue slots go)
set -u
O=${1:?OUT}
mkdir -p $O; cp "$0" $O/call1.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $O/gpu.txt 2>&1
date -u > $O/date.txt
t0=$(date +%s)
W="scripts/gpu-suite.sh with-libs"
echo "== suite $(($(date +%s)-t0)) s"
timeout 450 build/prebuilt/gpu-suite.sh $O/suite env test bench sanitize probe torch pytorch plot > $O/suite.log 2>&1; echo "suite rc $?"
echo "== ncu sass $(($(date +%s)-t0)) s"
timeout 70 $W ncu --section SourceCounters --page source --print-source sass -k regex:sbn_coop_kernel --launch-count 2 \
  build/prebuilt/bin/sbn-bench --gpu on --only S5 --dtype fp32 --layout NCHW -w 1 --paths coop -i 1 --warmup 0 --check-channels 1 \
  > $O/ncu-sass-s5.log 2>&1; echo "ncu sass rc $?"
echo "== done $(($(date +%s)-t0)) s"
cd $O && tar czf call1.tar.gz --exclude=call1.tar.gz . 2>/dev/null; ls
