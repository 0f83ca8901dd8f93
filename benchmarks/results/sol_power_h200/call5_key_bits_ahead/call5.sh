#!/usr/bin/env bash
# Session 15b call 5: Sol's pair-stream loop with the blocks' key bits loaded a step ahead
# (prefetch = the tree's kernels/hopper_loop.py) against main. GPU tests on the tree, two
# alternating profile rounds, the bench on the tree, then Nsight's stall sampling of one launch.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call5.tgz -C /tmp r; }
timeout 170 python3 -m pytest tests/gpu -q -x -k "sol or graph or warp" > $R/gpu.txt 2>&1; echo "gpu rc=$?"; tail -1 $R/gpu.txt; pack
PROF='timeout 55 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep "groups=" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/prefetch variants/mainb variants/prefetchb; pack
timeout 200 python3 benchmarks/bench_kernels.py --loops ws --sol-seqs 75600,131072 --sol-inputs gaussian,video --densities 0.10,0.15 --tilings auto --psa-shapes "" --no-flex --rep-ms 200 --out $R/sol_key_bits_ahead_h200.json > $R/bench.txt 2>&1; echo "bench rc=$?"; grep -i "sol\|cudnn" $R/bench.txt | tail -12; pack
timeout 100 ncu --profile-from-start off --clock-control none --section SourceCounters --section WarpStateStats --section ComputeWorkloadAnalysis --import-source no -k regex:_ws_block_sparse_kernel -c 1 -o $R/sol python3 benchmarks/profile_kernels.py --seq 75600 --density 0.15 --methods sol > $R/ncu.log 2>&1
ncu -i $R/sol.ncu-rep --page source --csv --print-source sass > $R/sol_sass.csv 2>> $R/ncu.log; ncu -i $R/sol.ncu-rep --page raw --csv > $R/sol_raw.csv 2>> $R/ncu.log; rm -f $R/sol.ncu-rep; pack
