#!/usr/bin/env bash
# Session 17 call 7: call 6 at 75.6K (density 0.15). nvidia-smi (SM clock, power, every
# 20 ms) through the whole-call profile of main, math and loads, gaussian inputs, 30 calls each.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call7.tgz -C /tmp r; }
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 20 > $R/smi.csv &
SMI=$!
PROF='echo "start $VARIANT $(date +%s.%N)" >> $R/marks.txt; timeout 100 python3 benchmarks/sol_call_profile.py --seqs 75600 --densities 0.15 --inputs gaussian --corrections on --calls 30 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; echo "end $VARIANT $(date +%s.%N)" >> $R/marks.txt; grep -A1 "groups=" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/math variants/loads; kill $SMI; pack
