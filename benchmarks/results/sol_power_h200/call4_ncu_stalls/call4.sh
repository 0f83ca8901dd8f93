#!/usr/bin/env bash
# Session 15b call 4: Nsight Compute's full set (warp states, stall reasons per SASS instruction)
# on one launch each of Sol's Hopper loop (75.6K, rho 0.15, gaussian), PSA's (Wan 720p tile
# 3x8x16, rho 0.15) and cuDNN's dense attention on the same inputs.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
pack() { tar czf $OUT/call4.tgz -C /tmp r; }
prof() {  # tag kernel-regex count methods
  timeout 200 ncu --profile-from-start off --clock-control none --set full --import-source no -k "regex:$2" -c $3 \
    -o $R/$1 python3 benchmarks/profile_kernels.py --seq 75600 --density 0.15 --methods $4 > $R/$1.log 2>&1
  echo "$1 rc=$?"
  for page in details raw; do ncu -i $R/$1.ncu-rep --page $page --csv > $R/${1}_$page.csv 2>> $R/$1.log; done
  ncu -i $R/$1.ncu-rep --page source --csv --print-source sass > $R/${1}_sass.csv 2>> $R/$1.log
  rm -f $R/$1.ncu-rep; ls -la $R | tail -4; pack
}
prof sol _ws_block_sparse_kernel 1 sol
prof psa _ws_block_sparse_kernel 1 psa
prof cudnn . 3 cudnn
