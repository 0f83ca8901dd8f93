#!/usr/bin/env bash
# Session 18 call 4: the bench against cuDNN at 75.6K in alternating rounds, old (session 15's
# sol.py and sol_router.py), main (the tree), oldb, mainb (second copies): call 3's single bench
# run read 3.94x at density 0.15 where its profile read 50.2 ms (4.2x against the same cuDNN).
# Then the whole-call profile (gaussian) of main against route16 (16 query blocks per routing
# program instead of 32: twice the programs, each half the work).
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call4.tgz -C /tmp r; }
BENCH='timeout 110 python3 benchmarks/bench_kernels.py --loops ws --sol-seqs 75600 --sol-inputs gaussian,video --densities 0.10,0.15 --tilings auto --psa-shapes "" --no-flex --rep-ms 200 --out $R/bench_$VARIANT.json > $R/bench_$VARIANT.txt 2>&1; grep -E "sol |cuDNN" $R/bench_$VARIANT.txt | cut -c1-150'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$BENCH" variants/old variants/main variants/oldb variants/mainb; pack
PROF='timeout 100 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --inputs gaussian --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep -A4 "groups=" $R/$VARIANT.txt | cut -c1-110'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/route16; pack
