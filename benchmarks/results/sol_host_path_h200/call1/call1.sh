#!/usr/bin/env bash
# Session 18 call 1: the GPU suite's Sol tests on the new routing (τ inside the router kernel,
# one ranking kernel for the work order, one rounding launch for the pooled means), then the
# whole-call profile of: old (session 15's sol.py and sol_router.py), new (this tree), nopool
# (this tree with the Hopper loop's pooled chunks removed: the same loop fed the same lists),
# tuneA (pool grid with the heads fastest, 8 pair streams per program) and tuneB (the same
# grid, 8 warps for pooling, 4 pair streams per program).
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call1.tgz -C /tmp r; }
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu -k "sol or warp or architectures or head_offsets" > $R/gpu_tests.txt 2>&1
tail -3 $R/gpu_tests.txt
PROF='timeout 100 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --inputs gaussian --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep -A6 "groups=" $R/$VARIANT.txt | cut -c1-110'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/old variants/new variants/tuneA variants/tuneB variants/nopool; pack
