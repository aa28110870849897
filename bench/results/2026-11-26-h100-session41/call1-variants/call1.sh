#!/usr/bin/env bash
# session 41, call 1: issue 13's variant A/B (ahead1, ahead4, u8 against base), cuDNN's rows,
# ncu sections of the base's S5 fp32 NCHW stream forward, and what cuDNN's kernels do there
set -u
O=${1:?OUT}; D=build/variants
mkdir -p $O; cp "$0" $O/call1.sh
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $O/gpu.txt 2>&1
date -u > $O/date.txt
t0=$(date +%s)
W="scripts/gpu-suite.sh with-libs"
echo "== ab $(($(date +%s)-t0)) s"
timeout 170 bash $D/run.sh $O 2 -- --only S1,S2,S5 -w 1 --paths coop > $O/ab.log 2>&1; echo "ab rc $?"
echo "== cudnn $(($(date +%s)-t0)) s"
timeout 40 $W $D/sbn-bench.base --gpu on --only S1,S2,S5 -w 1 --paths cudnn --json $O/cudnn.json > $O/cudnn.log 2>&1; echo "cudnn rc $?"
echo "== ncu base sections $(($(date +%s)-t0)) s"
timeout 70 $W ncu --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy \
  --section MemoryWorkloadAnalysis --section LaunchStats -k regex:sbn_coop_kernel --launch-count 2 \
  $D/sbn-bench.base --gpu on --only S5 --dtype fp32 --layout NCHW -w 1 --paths coop -i 1 --warmup 0 --check-channels 1 \
  > $O/ncu-base-s5.log 2>&1; echo "ncu base rc $?"
echo "== ncu cudnn $(($(date +%s)-t0)) s"
timeout 60 $W ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread,launch__grid_size,launch__block_size,launch__shared_mem_per_block_dynamic,launch__occupancy_limit_registers,lts__t_sector_hit_rate.pct,dram__throughput.avg.pct_of_peak_sustained_elapsed \
  --launch-count 12 $D/sbn-bench.base --gpu on --only S5 --dtype fp32 --layout NCHW -w 1 --paths cudnn -i 1 --warmup 0 --check-channels 1 \
  > $O/ncu-cudnn-s5.log 2>&1; echo "ncu cudnn rc $?"
echo "== done $(($(date +%s)-t0)) s"
cd $O && tar czf call1.tar.gz *.log *.json *.txt 2>/dev/null; ls
