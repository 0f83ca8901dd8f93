#!/usr/bin/env bash
# Session 16 call 5: Sol's pooled chunks in FP8 (e4m3) in the Hopper loop (fp8 = the tree's
# kernels/hopper_loop.py: kernel_v2.patch). GPU tests on it, then two alternating profile
# rounds against main.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call5.tgz -C /tmp r; }
timeout 110 python3 -m pytest tests/gpu -q -ra -k "sol or warp" > $R/gpu_fp8.txt 2>&1; echo "gpu rc=$?"; grep -E "passed|failed|Error|assert" $R/gpu_fp8.txt | tail -8; pack
PROF='timeout 45 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep "groups=" $R/$VARIANT.txt; grep -m3 "Error\|error" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/fp8 variants/mainb variants/fp8b; pack
