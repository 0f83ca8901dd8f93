"""PSA's key sums pass (``kernels.engine.quantize.key_means``, the smoothing means of int8 and
fp8 calls) on the GPU at Wan 720p's size (75,600 tokens, 40 heads, d 128): its time per call
for each span and step of ``_key_sums_kernel`` (``KEY_SUM_SPAN`` tokens per program,
``KEY_SUM_ROWS`` per step), each checked bit for bit against the float reference, beside
PyTorch's float64 sum (the reference itself). The shipped setting should be the fastest row
or tie with it.
Without CUDA it runs through Triton's interpreter (TRITON_INTERPRET=1), timed by the wall
clock: a check of the sweep on a small ``--tokens`` / ``--heads``, not a timing.

    python3 benchmarks/bench_key_sums.py --out benchmarks/results/key_sums_h100.json
"""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels.engine.quantize as quantize  # noqa: E402
from benchmarks.kernel_device import kernel_device  # noqa: E402
from benchmarks.results_file import write_results  # noqa: E402
from kernels.quantized_reference import smoothing_mean  # noqa: E402

SPANS = (256, 512, 1024)
ROWS = (32, 64)


def milliseconds(fn, rep_ms: int, cuda: bool) -> float:
    """fn's time per call: ``triton.testing.do_bench`` on CUDA, else the median of three wall-clock runs."""
    if cuda:
        return triton.testing.do_bench(fn, rep=rep_ms)
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        fn()
        runs.append((time.perf_counter() - start) * 1e3)
    return statistics.median(runs)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="results file (JSON)")
    ap.add_argument("--rep-ms", type=int, default=200, help="triton.testing.do_bench's rep per row")
    ap.add_argument("--tokens", type=int, default=75600, help="sequence length (default: Wan 720p's)")
    ap.add_argument("--heads", type=int, default=40, help="heads (default: Wan2.1-14B's)")
    args = ap.parse_args(argv)
    if args.tokens < 1 or args.heads < 1:
        ap.error(f"--tokens and --heads: expected positive counts, got {args.tokens} and {args.heads}")
    device = kernel_device(ap)
    cuda = device == "cuda"
    L, H, D = args.tokens, args.heads, 128
    g = torch.Generator(device=device).manual_seed(0)
    # Channels offset from zero, as a model's keys are: what the smoothing mean removes.
    k = (torch.randn(1, L, H, D, device=device, dtype=torch.bfloat16, generator=g)
         + torch.linspace(-4, 6, D, device=device).to(torch.bfloat16))
    reference = smoothing_mean(k)
    rows = [{"variant": "PyTorch float64 sum (the reference)",
             "ms": milliseconds(lambda: smoothing_mean(k), args.rep_ms, cuda)}]
    shipped = (quantize.KEY_SUM_SPAN, quantize.KEY_SUM_ROWS)
    try:
        for span in SPANS:
            for step in ROWS:
                quantize.KEY_SUM_SPAN, quantize.KEY_SUM_ROWS = span, step
                equal = torch.equal(quantize.key_means(k, 0, H), reference)
                ms = milliseconds(lambda: quantize.key_means(k, 0, H), args.rep_ms, cuda)
                rows.append({"variant": f"span {span}, rows {step}", "shipped": (span, step) == shipped, "ms": ms,
                             "equal_to_reference": equal, "read_tb_per_s": k.numel() * k.element_size() / ms / 1e9})
    finally:
        quantize.KEY_SUM_SPAN, quantize.KEY_SUM_ROWS = shipped
    for row in rows:
        print(row, flush=True)
    write_results(args.out, {
        "command": "python3 " + " ".join(sys.argv),
        "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name() if cuda else "cpu (Triton's interpreter: not a timing)",
        "torch": torch.__version__, "triton": triton.__version__,
        "shape": {"tokens": L, "heads": H, "head_dim": D, "dtype": "bfloat16"},
        "rows": rows,
    })
    if not all(row.get("equal_to_reference", True) for row in rows):
        raise SystemExit("bench_key_sums: a row's means differ from the reference")


if __name__ == "__main__":
    main()
