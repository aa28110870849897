#!/usr/bin/env bash
# session 42, call 2: the whole suite on the change that makes auto run stream (and adds
# test_gpu_team_onchip, the sanitizers' onchip runs, bench-onchip.json, the probe's
# onchip/auto rows); a tarball at the end whatever happened
set -u
O=${1:?OUT}
mkdir -p $O; cp "$0" $O/call2.sh
t0=$(date +%s)
timeout 545 build/prebuilt/gpu-suite.sh $O/suite env test bench sanitize probe torch pytorch plot > $O/suite.log 2>&1
echo "suite rc $? in $(($(date +%s)-t0)) s" | tee -a $O/suite.log
cd $O && rm -f suite/gpu-suite.tar.gz && tar czf call2.tar.gz --exclude=call2.tar.gz . ; ls
