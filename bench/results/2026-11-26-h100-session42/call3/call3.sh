#!/usr/bin/env bash
# session 42, call 3: test_gpu_team_onchip again after its fix (call 2's failure: a
# backward refused after a forward that ran was checked for untouched forward outputs;
# call 2's logs were lost: its script deleted the suite's tarball), and the --quick
# bench at the new auto (call 2's bench.json was lost with it)
set -u
O=${1:?OUT}; mkdir -p $O; cp "$0" $O/
W="scripts/gpu-suite.sh with-libs"
t0=$(date +%s)
SBN_KERNEL=onchip SBN_TEST_ONLY=virtual_vs_cpu timeout 70 $W build/prebuilt/bin/test_gpu_team > $O/test-onchip.log 2>&1
echo "test_gpu_team onchip rc $? in $(($(date +%s)-t0)) s" | tee -a $O/test-onchip.log
timeout 75 $W build/prebuilt/bin/sbn-bench --gpu on --quick --json $O/bench.json > $O/bench.log 2>&1
echo "bench rc $? in $(($(date +%s)-t0)) s" | tee -a $O/bench.log
nvidia-smi --query-gpu=name,driver_version --format=csv > $O/gpu.txt 2>&1
cd $O && tar czf call3.tar.gz call3.sh test-onchip.log bench.json bench.log gpu.txt; ls
