"""Sum of Sol's loop launches in a call-5 Nsight Compute CSV: time, cycles (the slowest SM's,
per launch) and the mean SM clock.

    python3 benchmarks/results/sol_floors_h200/ncu_cycles.py benchmarks/results/sol_floors_h200/call5_cycles/ncu_*.csv
"""
import collections
import csv
import os
import sys

for path in sys.argv[1:]:
    with open(path) as f:
        rows = list(csv.reader(line for line in f if line.startswith('"')))
    metrics = collections.defaultdict(list)
    for row in rows[1:]:
        entry = dict(zip(rows[0], row))
        metrics[entry["Metric Name"]].append(float(entry["Metric Value"].replace(",", "")))
    clocks = metrics["sm__cycles_elapsed.avg.per_second"]
    print(f"{os.path.basename(path)}: {len(clocks)} launches, {sum(metrics['gpu__time_duration.sum']) / 1e6:.2f} ms, "
          f"{sum(metrics['sm__cycles_elapsed.max']) / 1e6:.2f} M cycles, {sum(clocks) / len(clocks) / 1e6:.0f} MHz")
