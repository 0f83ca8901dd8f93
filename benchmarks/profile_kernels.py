"""One launch of each kernel on the 75,600-token shape, for Nsight Compute (hardware counters).

    ncu --clock-control none -k regex:"_block_sparse_kernel|_route_kernel|_pool_kernel" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
        python benchmarks/profile_kernels.py
"""
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels  # noqa: E402
from benchmarks.bench_kernels import psa_params_for_density, random_qkv  # noqa: E402


def main():
    L, H, D, rho = 75600, 40, 128, 0.15
    grid, tile = (21, 45, 80), (3, 8, 16)
    q, k, v = random_qkv(L, H, D, torch.bfloat16, seed=3)
    beta = kernels.beta_for_density(rho)
    params, _ = psa_params_for_density(grid, tile, H, rho)
    for _ in range(2):  # the first round compiles
        kernels.sol_attention(q, k, v, beta=beta, grid=grid)
        kernels.psa_attention(q, k, v, grid=grid, params=params, tile=tile)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
