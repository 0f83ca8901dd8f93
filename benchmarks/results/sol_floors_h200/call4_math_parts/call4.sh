#!/usr/bin/env bash
# Session 17 call 4: what the consumers' math floor (call 1's math: no copies) is made of, and
# the loop on the same lists without the pooled term. Study copies (timing only): mathnobias =
# math with the pair steps' per-column key bias replaced by zeros; mathnopool = math with the
# pooled chunks walked but not computed; nopool = main without the pooled chunks (neither
# loaded nor computed: issue 14's "the same loop fed the same lists"); main and math again.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call4.tgz -C /tmp r; }
PROF='timeout 110 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep -A3 "groups=" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/nopool variants/math variants/mathnobias variants/mathnopool variants/mainb; pack
