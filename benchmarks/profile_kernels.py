"""Kernel launches of one Sol and one PSA call (and cuDNN's dense attention on the same
inputs, as the reference for stall reasons and issue rates), for Nsight Compute.

Two rounds compile and warm up; only the third, between ``cudaProfilerStart`` and ``Stop``,
is meant to be profiled (``--profile-from-start off``):

    ncu --profile-from-start off --clock-control none -k regex:"_block_sparse_kernel|_route_kernel|_pool_kernel" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
        python benchmarks/profile_kernels.py --seq 131072 --methods sol --sol-launch per_group

``--sol-launch`` forces how Sol's Hopper loop launches a head group (NOTES #39): ``per_head``
or ``per_group`` (one launch for the group); ``auto`` is the shipped rule (per head where a
head's K and V exceed the L2). Warp stall samples per SASS instruction, against cuDNN's kernel
on the same inputs (NOTES #43; ``-k .`` and ``-c 3`` for cuDNN, whose kernel name varies):

    ncu --profile-from-start off --clock-control none --set full --import-source no \
        -k regex:_ws_block_sparse_kernel -c 1 -o sol python benchmarks/profile_kernels.py --methods sol
    ncu -i sol.ncu-rep --page source --csv --print-source sass > sol_sass.csv
"""
import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels  # noqa: E402
from benchmarks.bench_kernels import SOL_SHAPES, cudnn_sdpa, psa_params_for_density, random_qkv  # noqa: E402

PSA_TILE = (3, 8, 16)
SOL_LAUNCHES = ("auto", "per_head", "per_group")
METHODS = ("sol", "psa", "cudnn")


def force_sol_launch(mode: str) -> None:
    """Make the Hopper loop launch Sol's head groups ``mode``-wise (``hopper_loop.l2_bytes``
    decides: a 1-byte L2 splits every group, an unknown one (0) splits none)."""
    if mode == "auto":
        return
    from kernels import hopper_loop

    hopper_loop.l2_bytes = lambda device: 1 if mode == "per_head" else 0


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seq", type=int, default=75600, choices=sorted(SOL_SHAPES), help="tokens (their grid)")
    ap.add_argument("--methods", default="sol,psa", help=f"comma separated, of {', '.join(METHODS)}")
    ap.add_argument("--density", type=float, default=0.15)
    ap.add_argument("--sol-launch", default="auto", choices=SOL_LAUNCHES)
    args = ap.parse_args(argv)
    args.methods = [m for m in args.methods.split(",") if m]
    if not args.methods or any(m not in METHODS for m in args.methods):
        ap.error(f"--methods: of {', '.join(METHODS)}, comma separated, got {args.methods}")
    if not 0 < args.density <= 1:
        ap.error(f"--density: in (0, 1], got {args.density}")
    return args


def main(argv=None):
    args = parse_args(argv)
    force_sol_launch(args.sol_launch)
    H, D = 40, 128
    grid = SOL_SHAPES[args.seq]
    q, k, v = random_qkv(args.seq, H, D, torch.bfloat16, seed=3)
    beta = kernels.beta_for_density(args.density)
    params = psa_params_for_density(grid, PSA_TILE, H, args.density)[0] if "psa" in args.methods else None

    def round_of_calls():
        if "sol" in args.methods:
            kernels.sol_attention(q, k, v, beta=beta, grid=grid)
        if "psa" in args.methods:
            kernels.psa_attention(q, k, v, grid=grid, params=params, tile=PSA_TILE)
        if "cudnn" in args.methods:
            cudnn_sdpa(q, k, v)

    for _ in range(2):  # the first round compiles
        round_of_calls()
    torch.cuda.synchronize()
    torch.cuda.profiler.start()
    round_of_calls()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
