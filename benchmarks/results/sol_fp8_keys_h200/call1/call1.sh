#!/usr/bin/env bash
# Session 19 call 1: the pooled term's QK̄ᵀ in float8 (hopper_loop._attend_pooled; keys coded
# per head by fp8_heads, queries per 64-row tile). GPU suite's Sol tests and the new fp8 test;
# whole-call profile, gaussian and video-like inputs, of fp8 (the tree), s18 (session 18's
# hopper_loop.py: the pooled term in bf16), nopool (s18 without the pooled chunks: the same
# loop fed the same lists) and route16 (the tree with 16 query blocks per routing program);
# then the bench against cuDNN on the tree.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call1.tgz -C /tmp r; }
timeout 170 python3 -m pytest -q -p no:cacheprovider tests/gpu -k "sol or warp or architectures or head_offsets or fp8" > $R/gpu_tests.txt 2>&1
tail -3 $R/gpu_tests.txt; pack
PROF='timeout 100 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --inputs gaussian,video --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep "groups=" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/fp8 variants/s18 variants/nopool variants/route16; pack
timeout 170 python3 benchmarks/bench_kernels.py --loops ws --sol-seqs 75600,131072 --sol-inputs gaussian,video --densities 0.10,0.15 --tilings auto --psa-shapes "" --no-flex --rep-ms 200 --out $R/sol_bench.json > $R/bench.txt 2>&1
grep -E "sol |cuDNN" $R/bench.txt | cut -c1-160; pack
