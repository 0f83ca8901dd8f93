#!/usr/bin/env bash
# Session 16 call 1: FlashAttention-3's intra-warpgroup overlap in Sol's consumers (the PV of
# the last computed step runs during this step's softmax). fa3 = one empty barrier a slot;
# split = the tree's kernels/hopper_loop.py, with a slot's K and V released apart (K after its
# QK^T, V after its PV), for PSA's ping-pong too. The GPU suite on the tree, two alternating
# profile rounds of main / fa3 / split, then PSA's Wan and HunyuanVideo grids on main and split.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R; export R
pack() { tar czf $OUT/call1.tgz -C /tmp r; }
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,power.limit --format=csv > $R/smi.txt
timeout 200 python3 -m pytest tests/gpu -q -ra > $R/gpu_split.txt 2>&1; echo "gpu rc=$?"; tail -1 $R/gpu_split.txt; pack
PROF='timeout 55 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep "groups=" $R/$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/fa3 variants/split variants/mainb variants/fa3b variants/splitb; pack
PSA='timeout 80 python3 benchmarks/bench_kernels.py --loops ws --sol-seqs "" --psa-shapes wan720p,hunyuan768p --psa-densities 0.15,0.40 --no-flex --skip-checks --rep-ms 200 --out $R/psa_$VARIANT.json > $R/psa_$VARIANT.txt 2>&1; grep "PSA\|ρ=" $R/psa_$VARIANT.txt'
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PSA" variants/main variants/split; pack
nvidia-smi --query-gpu=name,clocks.sm,power.draw --format=csv >> $R/smi.txt; pack
