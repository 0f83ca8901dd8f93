#!/usr/bin/env bash
# Session 18 call 3: the tree as committed (τ in the router, the ranking kernel, one rounding
# launch, 8 pair streams per program, pooling in 2 warps with its loads first). GPU suite's
# Sol tests; the whole-call profile, gaussian and video-like inputs, of old (session 15's
# sol.py and sol_router.py), main (the tree) and nopool (the tree without the Hopper loop's
# pooled chunks: the same loop fed the same lists); then the bench against cuDNN on the tree.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call3.tgz -C /tmp r; }
timeout 240 python3 -m pytest -q -p no:cacheprovider tests/gpu -k "sol or warp or architectures or head_offsets" > $R/gpu_tests.txt 2>&1
tail -1 $R/gpu_tests.txt; pack
PROF='timeout 100 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --inputs gaussian,video --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep "groups=" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/old variants/main variants/nopool; pack
timeout 240 python3 benchmarks/bench_kernels.py --loops ws --sol-seqs 75600,131072 --sol-inputs gaussian,video --densities 0.10,0.15 --tilings auto --psa-shapes "" --no-flex --rep-ms 200 --out $R/sol_bench.json > $R/bench.txt 2>&1
grep "sol " $R/bench.txt | cut -c1-160; pack
