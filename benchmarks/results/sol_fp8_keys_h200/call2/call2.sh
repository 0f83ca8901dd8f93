#!/usr/bin/env bash
# Session 19 call 2, on main as committed (session 18's kernels; call 1's float8 keys are not
# kept): Wan2.1-14B end to end in ComfyUI 0.3.75 (the issue 14 target rows, last measured in
# session 11), then the whole-call profile in two alternating rounds of main and nopool
# (main's loop without the pooled chunks: the same loop fed the same lists), for issue 14's
# "routing plus correction over the same loop" with the spread between rounds.
# Carry [".whl", "variants"]; .whl from the download step in benchmarks/e2e_run.sh's header.
export PYTHONUNBUFFERED=1
R=/tmp/r2; rm -rf $R; mkdir -p $R; export R
pack() { tar czf $OUT/call2.tgz -C /tmp r2; }
timeout 330 bash benchmarks/e2e_run.sh --models wan --methods dense,stub,sol85,sol90 --sol-tile auto
tail -6 $OUT/e2e_comfyui_h200_wan.log
PROF='timeout 60 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --inputs gaussian,video --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep "groups=" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/nopool variants/mainb variants/nopoolb; pack
