#!/usr/bin/env bash
# session 39's A/B of SBN_STAGE5_REVERSE (bench/notes/issue13-stream.md), on the device
set -u
D=build/dev39
O=${1:?OUT}
P=$(python3 -c 'import sysconfig;print(sysconfig.get_paths()["purelib"])')
export LD_LIBRARY_PATH=$P/nvidia/cudnn/lib:$P/nvidia/nccl/lib:${LD_LIBRARY_PATH:-}
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv > $O/gpu.txt 2>&1
date -u > $O/date.txt
t0=$(date +%s)
echo "== ab $(($(date +%s)-t0)) s"
timeout 130 scripts/gpu-ab.sh $O/ab 2 rev1=$D/sbn-bench.rev1 rev0=$D/sbn-bench.rev0 head=$D/sbn-bench.head \
  -- --only S1,S2,S5 -w 1,8 --paths coop > $O/ab.log 2>&1
echo "ab rc $?"
echo "== cudnn $(($(date +%s)-t0)) s"
timeout 40 $D/sbn-bench.rev1 --gpu on --only S1,S2,S5 -w 1 --paths cudnn --json $O/cudnn.json > $O/cudnn.log 2>&1
echo "cudnn rc $?"
for v in rev1 rev0; do
  echo "== ncu $v $(($(date +%s)-t0)) s"
  timeout 45 ncu --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum,lts__t_sector_hit_rate.pct \
    -k regex:sbn_coop_kernel --launch-count 8 $D/sbn-bench.$v --gpu on --only S1,S5 --dtype fp32 --layout NCHW \
    -w 1 --paths coop -i 1 --warmup 0 --check-channels 1 > $O/ncu-$v.log 2>&1
  echo "ncu $v rc $?"
done
echo "== test_gpu_team (SBN_KERNEL=stream) $(($(date +%s)-t0)) s"
SBN_KERNEL=stream timeout 90 $D/test_gpu_team > $O/test_gpu_team_stream.log 2>&1
echo "test rc $?"
echo "== done $(($(date +%s)-t0)) s"
