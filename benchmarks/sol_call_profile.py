"""Where the time of one whole ``sol_attention`` call goes, kernel by kernel (torch.profiler).

Per shape and kind of inputs: the call's time between CUDA events, the GPU time of each kernel
it launches (summed over the call, with the number of launches), their sum and the rest
(``idle_ms``: the GPU idle between kernels, launch gaps and the tails of one launch before the
next starts). The kernels are timed in profiled calls, the call in unprofiled ones, so the rest
is only a bound: it reads negative when the profiler's own cost exceeds the idle time.
Heads run in groups (``sol.head_groups``), so every kernel appears once per group: the loop's
launches per call are the groups.

    python3 benchmarks/sol_call_profile.py --seqs 75600,131072 --densities 0.15,0.10 --out sol_profile.json
"""
import argparse
import json
import os
import sys
from collections import defaultdict

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels  # noqa: E402
from benchmarks.bench_kernels import SOL_INPUTS, SOL_SHAPES, random_qkv, video_like_qkv  # noqa: E402

LOOP_KERNELS = ("_ws_block_sparse_kernel", "_block_sparse_kernel")


def profile_call(call, calls: int):
    """(ms per call between events, {kernel: (ms per call, launches per call)})."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        call()
    end.record()
    torch.cuda.synchronize()
    wall = start.elapsed_time(end) / calls
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            call()
        torch.cuda.synchronize()
    per_kernel = defaultdict(lambda: [0.0, 0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = per_kernel[event.name]
            entry[0] += event.device_time_total / 1000 / calls
            entry[1] += 1
    return wall, {name: (ms, n / calls) for name, (ms, n) in per_kernel.items()}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqs", default="75600", help=f"comma separated, of {sorted(SOL_SHAPES)} (their grids)")
    ap.add_argument("--densities", default="0.15", help="one per sequence, or one for all")
    ap.add_argument("--inputs", default="gaussian,video", help=f"comma separated, of {', '.join(SOL_INPUTS)}")
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--calls", type=int, default=10, help="calls timed, and as many profiled")
    ap.add_argument("--corrections", default="on,off", help="with (on) and/or without (off) the pooled term")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        args.seqs = [int(x) for x in args.seqs.split(",")]
        args.densities = [float(x) for x in args.densities.split(",")]
    except ValueError:
        ap.error(f"--seqs and --densities: numbers, comma separated, got {args.seqs!r} and {args.densities!r}")
    if any(L not in SOL_SHAPES for L in args.seqs):
        ap.error(f"--seqs: each one of {sorted(SOL_SHAPES)}, got {args.seqs}")
    if len(args.densities) not in (1, len(args.seqs)) or not all(0 < r <= 1 for r in args.densities):
        ap.error(f"--densities: one in (0, 1], or one per sequence, got {args.densities}")
    args.densities = args.densities * len(args.seqs) if len(args.densities) == 1 else args.densities
    args.inputs = args.inputs.split(",")
    if any(kind not in SOL_INPUTS for kind in args.inputs):
        ap.error(f"--inputs: each one of {', '.join(SOL_INPUTS)}, got {args.inputs}")
    corrections = args.corrections.split(",")
    if not corrections or any(c not in ("on", "off") for c in corrections):
        ap.error(f"--corrections: 'on' and/or 'off', got {args.corrections!r}")
    args.corrections = [c == "on" for c in corrections]
    if args.heads < 1 or args.calls < 1:
        ap.error("--heads and --calls must be positive")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    return args


def main(argv=None):
    args = parse_args(argv)
    H, D = args.heads, 128
    rows = []
    for L, rho in zip(args.seqs, args.densities):
        grid = SOL_SHAPES[L]
        for kind in args.inputs:
            q, k, v = video_like_qkv(grid, H, D, seed=L) if kind == "video" else random_qkv(L, H, D, torch.bfloat16,
                                                                                             seed=L)
            beta = kernels.beta_for_density(rho)
            for correction in args.corrections:
                wall, per_kernel = profile_call(
                    lambda: kernels.sol_attention(q, k, v, beta=beta, grid=grid, correction=correction), args.calls)
                busy = sum(ms for ms, _ in per_kernel.values())
                groups = sum(n for name, (_, n) in per_kernel.items() if name in LOOP_KERNELS)
                rows.append(dict(L=L, inputs=kind, density_target=rho, correction=correction, heads=H,
                                 head_groups=groups, call_ms=wall, kernels_ms=busy, idle_ms=wall - busy,
                                 kernels={name: dict(ms=ms, launches=n) for name, (ms, n) in
                                          sorted(per_kernel.items(), key=lambda kv: -kv[1][0])}))
                print(f"L={L} {kind} ρ={rho} correction={correction} groups={groups:g}: call {wall:.2f} ms, "
                      f"kernels {busy:.2f} ms, idle {wall - busy:.2f} ms", flush=True)
                for name, (ms, n) in sorted(per_kernel.items(), key=lambda kv: -kv[1][0])[:12]:
                    print(f"    {ms:8.3f} ms  ×{n:5.1f}  {name[:100]}")
    meta = dict(command=" ".join(sys.argv), device=torch.cuda.get_device_name(), torch=torch.__version__,
                triton=__import__("triton").__version__)
    with open(args.out, "w") as f:
        json.dump(dict(meta, rows=rows), f, indent=1)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
