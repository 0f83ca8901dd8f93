#!/usr/bin/env bash
# Session 16 call 2: K and V loaded by a producer warp each, so K runs ahead of a V slot still
# held for a PV. two = the tree's kernels/hopper_loop.py (call 1's split overlap + two
# producers, PSA included); plain2 = main's one-MMA-at-a-time Sol step with the split release
# and two producers. The GPU suite on the tree, two alternating profile rounds of main / split /
# two / plain2, PSA's grids on main and two, then Nsight's warp states on one Sol launch of
# main and of two.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call2.tgz -C /tmp r; }
timeout 180 python3 -m pytest tests/gpu -q -ra > $R/gpu_two.txt 2>&1; echo "gpu rc=$?"; tail -1 $R/gpu_two.txt; pack
PROF='timeout 50 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep "groups=" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/split variants/two variants/plain2 variants/mainb variants/splitb variants/twob variants/plain2b; pack
PSA='timeout 60 python3 benchmarks/bench_kernels.py --loops ws --sol-seqs "" --psa-shapes wan720p,hunyuan768p --psa-densities 0.15,0.40 --no-flex --skip-checks --rep-ms 200 --out $R/psa_$VARIANT.json > $R/psa_$VARIANT.txt 2>&1; grep "PSA\|ρ=" $R/psa_$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PSA" variants/main variants/two; pack
NCU='timeout 80 ncu --profile-from-start off --clock-control none --section SourceCounters --section WarpStateStats --section ComputeWorkloadAnalysis --section SpeedOfLight --import-source no -k regex:_ws_block_sparse_kernel -c 1 -o $R/ncu_$VARIANT python3 benchmarks/profile_kernels.py --seq 75600 --density 0.15 --methods sol > $R/ncu_$VARIANT.log 2>&1; ncu -i $R/ncu_$VARIANT.ncu-rep --page source --csv --print-source sass 2>>$R/ncu_$VARIANT.log | gzip > $R/ncu_${VARIANT}_sass.csv.gz; ncu -i $R/ncu_$VARIANT.ncu-rep --page raw --csv 2>>$R/ncu_$VARIANT.log | gzip > $R/ncu_${VARIANT}_raw.csv.gz; rm -f $R/ncu_$VARIANT.ncu-rep; tail -1 $R/ncu_$VARIANT.log'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$NCU" variants/main variants/two; pack
