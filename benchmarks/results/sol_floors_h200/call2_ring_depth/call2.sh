#!/usr/bin/env bash
# Session 17 call 2: does the ring's depth set Sol's loop? Study copies (timing only): deep =
# main with 6 ring stages over the 3 slot buffers (stage s uses buffer s mod 3: the copies race
# the reads, so the numbers are wrong, the traffic and the barrier protocol are a 6-deep
# ring's); loadsdeep = call 1's loads with the same; splitmath / splitdeep = session 16's split
# (FlashAttention-3's intra-warpgroup overlap, K and V released apart) without copies / with 6
# stages; main and math again as this call's anchors.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call2.tgz -C /tmp r; }
PROF='timeout 110 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep -A1 "groups=" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/deep variants/loadsdeep variants/math variants/splitmath variants/splitdeep; pack
