#!/usr/bin/env bash
# Session 18 call 2: the pooling kernel. main (this tree: 8 pair streams per program of
# _pair_steps_kernel, from call 1's tuneA), poolA (the three loads of q, k and v issued before
# the first store, which the compiler may not move them across), poolA2 and poolA8 (poolA with
# 2 and 8 warps instead of 4). Whole-call profile, gaussian inputs.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call2.tgz -C /tmp r; }
PROF='timeout 100 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --inputs gaussian --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep -A5 "groups=" $R/$VARIANT.txt | cut -c1-110'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/poolA variants/poolA2 variants/poolA8; pack
