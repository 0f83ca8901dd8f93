#!/usr/bin/env bash
# Session 16 call 3: a Sol pair step of two full blocks takes a zero bias from scalar
# arithmetic on its block ids instead of the per-column key-bit selects (full = the tree's
# kernels/hopper_loop.py). GPU tests on the tree, two alternating profile rounds against main,
# then the bench on whichever was faster at 75.6K in both rounds (main if not both).
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call3.tgz -C /tmp r; }
timeout 120 python3 -m pytest tests/gpu -q -x -k "sol or graph or warp" > $R/gpu_full.txt 2>&1; echo "gpu rc=$?"; tail -1 $R/gpu_full.txt; pack
PROF='timeout 50 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep "groups=" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/full variants/mainb variants/fullb; pack
WIN=$(python3 -c "
import json
ms = lambda v: [r['call_ms'] for r in json.load(open('$R/%s.json' % v))['rows'] if r['L'] == 75600]
print('full' if all(a < b for a, b in zip(ms('full') + ms('fullb'), ms('main') + ms('mainb'))) else 'main')")
echo "bench on $WIN"
OUT=/tmp/cv bash benchmarks/compare_variants.sh 'timeout 200 python3 benchmarks/bench_kernels.py --loops ws --sol-seqs 75600,131072 --sol-inputs gaussian,video --densities 0.10,0.15 --tilings auto --psa-shapes "" --no-flex --rep-ms 200 --out $R/sol_bench_$VARIANT.json > $R/bench_$VARIANT.txt 2>&1; grep "sol " $R/bench_$VARIANT.txt' variants/$WIN; pack
