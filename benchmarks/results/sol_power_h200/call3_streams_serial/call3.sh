#!/usr/bin/env bash
# Session 15b call 3: Sol head groups on two streams. streams = the groups alternate between the
# caller's stream and a second one (their loops may overlap); serial = the same, but each loop
# launch also waits for the previous group's loop (only the routing overlaps a loop); main = one
# stream. GPU tests on the tree (streams) and on serial, then two alternating profile rounds.
export PYTHONUNBUFFERED=1
R=/tmp/r; mkdir -p $R
pack() { tar czf $OUT/call3.tgz -C /tmp r; }
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,utilization.gpu --format=csv -lms 100 > $R/smi.csv &
timeout 140 python3 -m pytest tests/gpu -q -x -k "sol or graph" > $R/gpu_streams.txt 2>&1; echo "gpu streams rc=$?"; tail -1 $R/gpu_streams.txt; pack
PROF='timeout 55 python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --corrections on --calls 6 --out $R/$VARIANT.json > $R/$VARIANT.txt 2>&1; grep "groups=" $R/$VARIANT.txt'
export R
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/main variants/streams variants/serial; pack
OUT=/tmp/cv bash benchmarks/compare_variants.sh 'timeout 45 python3 -m pytest tests/gpu -q -x -k "two_streams or graph" > $R/gpu_serial.txt 2>&1; tail -1 $R/gpu_serial.txt' variants/serial; pack
OUT=/tmp/cv bash benchmarks/compare_variants.sh "$PROF" variants/mainb variants/streamsb variants/serialb; pack
kill %1; pack
