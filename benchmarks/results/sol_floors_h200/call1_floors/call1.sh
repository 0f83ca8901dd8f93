#!/usr/bin/env bash
# Session 17 call 1: floors of Sol's Hopper loop on the routed lists it really gets. Study
# copies of kernels/hopper_loop.py (patches beside this script), each timed by the whole-call
# profile: loads (the producer's copies and the ring, consumers wait and release, no MMA),
# math (the consumers' steps and the ring's barriers, the producer copies nothing), compute
# (the consumers' steps alone: no copies, no barriers), main twice.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call1.tgz -C /tmp r; }
PROF='timeout 110 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep -A3 "groups=" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/loads variants/math variants/compute variants/mainb; pack
