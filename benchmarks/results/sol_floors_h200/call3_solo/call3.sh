#!/usr/bin/env bash
# Session 17 call 3: solo = one query block per program, its two consumers taking the ring's
# steps in turn (consumer c the steps i with i % 2 == c) with PSA's ping-pong (in its turn a
# consumer issues its last step's PV and this step's QKᵀ), K and V released apart and loaded
# by a producer warp each (session 16's "two"), consumer 1's partial handed to consumer 0
# through shared memory at the end. GPU tests on solo, then the whole-call profile of main,
# solo and solomath (solo without copies).
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call3.tgz -C /tmp r; }
OUT=/tmp/cv bash benchmarks/compare_variants.sh 'timeout 200 python3 -m pytest tests/gpu -q -k "sol or warp" > $R/gpu_$VARIANT.txt 2>&1; echo "gpu rc=$?"; tail -3 $R/gpu_$VARIANT.txt' variants/solo; pack
PROF='timeout 110 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep -A1 "groups=" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/solo variants/solomath; pack
