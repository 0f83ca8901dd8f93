"""Mean SM clock and power of the busy samples (power > 300 W) between each variant's marks,
after its first 6 s (process start, compile, routing set-up), from a call's nvidia-smi log.

    python3 benchmarks/results/sol_floors_h200/smi_summary.py benchmarks/results/sol_floors_h200/call6_power
"""
import csv
import datetime
import gzip
import statistics as st
import sys

d = sys.argv[1]
marks = {}
for line in open(f"{d}/marks.txt"):
    kind, variant, t = line.split()
    marks.setdefault(variant, {})[kind] = float(t)
samples = []
for r in list(csv.reader(gzip.open(f"{d}/smi.csv.gz", "rt")))[1:]:
    try:
        ts = datetime.datetime.strptime(r[0].strip(), "%Y/%m/%d %H:%M:%S.%f").replace(tzinfo=datetime.timezone.utc)
        samples.append((ts.timestamp(), float(r[1].split()[0]), float(r[3].split()[0])))
    except (ValueError, IndexError):
        pass
for variant, m in marks.items():
    busy = [s for s in samples if m["start"] + 6 <= s[0] <= m["end"] and s[2] > 300]
    print(f"{variant}: {len(busy)} busy samples, SM clock {st.mean(s[1] for s in busy):.0f} MHz "
          f"(min {min(s[1] for s in busy):.0f}), power {st.mean(s[2] for s in busy):.0f} W (max {max(s[2] for s in busy):.0f} W)")
