#!/usr/bin/env bash
# Session 17 call 6: call 5 counted main's loop at 131K in 135 M cycles under Nsight (launches
# apart), 76 ms, where back to back (calls 1-4) it takes 87-89 ms; math (no copies) took the
# same there and here. nvidia-smi (SM clock, power, every 20 ms) through the whole-call profile
# of main, math and loads at 131K, gaussian inputs, 30 calls each.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call6.tgz -C /tmp r; }
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv -lms 20 > $R/smi.csv &
SMI=$!
PROF='echo "start $VARIANT $(date +%s.%N)" >> $R/marks.txt; timeout 100 python3 benchmarks/sol_call_profile.py --seqs 131072 --densities 0.10 --inputs gaussian --corrections on --calls 30 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; echo "end $VARIANT $(date +%s.%N)" >> $R/marks.txt; grep -A1 "groups=" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/math variants/loads; kill $SMI; pack
