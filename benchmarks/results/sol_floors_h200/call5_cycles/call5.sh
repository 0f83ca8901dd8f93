#!/usr/bin/env bash
# Session 17 call 5: calls 1-4 timed the variants in milliseconds at the clocks each one ran
# at. Nsight Compute (clocks not locked) counts the loop launches' cycles and their clock:
# main, math (no copies), nopool (no pooled term), mathnopool, on gaussian inputs.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call5.tgz -C /tmp r; }
NCU='for spec in "131072 0.10" "75600 0.15"; do set -- $spec; timeout 55 ncu --profile-from-start off --clock-control none --cache-control none -k regex:_ws_block_sparse_kernel --metrics gpu__time_duration.sum,sm__cycles_elapsed.max,sm__cycles_elapsed.avg.per_second --csv python3 benchmarks/profile_kernels.py --seq $1 --density $2 --methods sol > $R/ncu_${VARIANT}_$1.csv 2> $R/ncu_${VARIANT}_$1.err; echo "$VARIANT $1 rc=$?"; done'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$NCU" variants/main variants/math variants/nopool variants/mathnopool; pack
