#!/usr/bin/env bash
# Session 15 call 1: clocks (nvidia-smi) during main vs per-head routing, then Nsight Compute
# L2 hit rate / DRAM bytes / clock of Sol's loop per group vs per head.
export PYTHONUNBUFFERED=1
stamp() { echo "$1 $(date '+%Y/%m/%d %H:%M:%S.%3N')" >> $OUT/marks.txt; }
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 50 > $OUT/smi.csv &
SMI=$!
ncu_run() {  # tag seq density launch
  stamp "ncu_$1_start"
  timeout 80 ncu --profile-from-start off --clock-control none --cache-control none -k regex:_ws_block_sparse_kernel \
    --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,sm__cycles_elapsed.avg.per_second \
    --csv python3 benchmarks/profile_kernels.py --seq $2 --density $3 --methods sol --sol-launch $4 > $OUT/ncu_$1.csv 2> $OUT/ncu_$1.err
  echo "ncu $1 rc=$?"; stamp "ncu_$1_end"
}
ncu_run 131k_group 131072 0.10 per_group
ncu_run 131k_head 131072 0.10 per_head
ncu_run 75k_group 75600 0.15 per_group
ncu_run 75k_head 75600 0.15 per_head
cp kernels/sol.py /tmp/sol_main.py; cp variants/g1/sol.py kernels/sol.py
ncu_run 75k_routed_head 75600 0.15 per_head
ncu_run 131k_routed_head 131072 0.10 per_head
cp /tmp/sol_main.py kernels/sol.py
for v in main g1; do
  cp variants/$v/sol.py kernels/sol.py; stamp "prof_${v}_start"
  timeout 60 python3 benchmarks/sol_call_profile.py --seqs 75600 --densities 0.15 --corrections on --calls 6 --out $OUT/prof_$v.json > $OUT/prof_$v.txt 2>&1
  stamp "prof_${v}_end"; tail -4 $OUT/prof_$v.txt
done
cp /tmp/sol_main.py kernels/sol.py
kill $SMI
cd $OUT && tar czf call1.tgz --remove-files marks.txt smi.csv ncu_* prof_*
