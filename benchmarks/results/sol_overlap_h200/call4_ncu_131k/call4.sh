#!/usr/bin/env bash
# Session 16 call 4: Nsight's warp-state sampling on one Sol loop launch of main at 131K,
# rho 0.10, gaussian (one head: the call launches per head there), for the pooled chunks'
# share of the consumers' samples (NOTES #47 measured 9.0 % at 75.6K, rho 0.15).
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
timeout 150 ncu --profile-from-start off --clock-control none --section SourceCounters --section WarpStateStats --section SpeedOfLight --import-source no -k regex:_ws_block_sparse_kernel -c 1 -o $R/ncu_main131 python3 benchmarks/profile_kernels.py --seq 131072 --density 0.10 --methods sol > $R/ncu_main131.log 2>&1; echo "ncu rc=$?"
ncu -i $R/ncu_main131.ncu-rep --page source --csv --print-source sass 2>>$R/ncu_main131.log | gzip > $R/ncu_main131_sass.csv.gz
ncu -i $R/ncu_main131.ncu-rep --page raw --csv 2>>$R/ncu_main131.log | gzip > $R/ncu_main131_raw.csv.gz
rm -f $R/ncu_main131.ncu-rep; tail -2 $R/ncu_main131.log
tar czf $OUT/call4.tgz -C /tmp r
