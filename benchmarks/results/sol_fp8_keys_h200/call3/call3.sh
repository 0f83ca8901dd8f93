#!/usr/bin/env bash
# Session 19 call 3, on call 2's machine (still held): the bench against cuDNN on main, both
# sizes, then 75.6K once more.
mkdir -p /tmp/r3
timeout 200 python3 benchmarks/bench_kernels.py --loops ws --sol-seqs 75600,131072 --sol-inputs gaussian,video --densities 0.10,0.15 --tilings auto --psa-shapes "" --no-flex --rep-ms 200 --out /tmp/r3/sol_bench.json > /tmp/r3/bench.txt 2>&1
grep -E " sol |cuDNN" /tmp/r3/bench.txt | cut -c1-190
timeout 110 python3 benchmarks/bench_kernels.py --loops ws --sol-seqs 75600 --sol-inputs gaussian,video --densities 0.10,0.15 --tilings auto --psa-shapes "" --no-flex --rep-ms 200 --out /tmp/r3/sol_bench_75k_round2.json > /tmp/r3/bench_75k_round2.txt 2>&1
grep -E " sol |cuDNN" /tmp/r3/bench_75k_round2.txt | cut -c1-190
cp /tmp/r3/* $OUT/
