"""One launch of each kernel on the 75,600-token shape, for Nsight Compute (hardware counters).

    ncu --clock-control none -k regex:"_sol_kernel|_psa_kernel" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct \
        python benchmarks/profile_kernels.py
"""
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels  # noqa: E402
from benchmarks.bench_kernels import psa_params_for_density, random_qkv  # noqa: E402
from kernels.sol_routing import block_lengths  # noqa: E402
from kernels.sol_triton import block_lists_from_selection, launch_sol_kernel  # noqa: E402


def main():
    L, H, D, rho = 75600, 40, 128, 0.15
    q, k, v = random_qkv(L, H, D, torch.bfloat16, seed=3)
    beta = kernels.beta_for_density(rho)
    kernels.sol_attention(q, k, v, beta=beta)  # compile outside the profiled launch set
    sel = kernels.sol_block_selection(q, k, v, beta=beta)
    lists = block_lists_from_selection(sel, L)
    unused = torch.zeros(1, device="cuda", dtype=q.dtype)
    lens = block_lengths(L, q.device)

    def plain():
        return launch_sol_kernel(q, k, v, unused, unused, unused.float(), unused.to(torch.int8), lens,
                                 scale=1 / math.sqrt(D), keep_diagonal=False, route=False, correction=False,
                                 block_lists=lists)

    plain()
    grid, tile = (21, 45, 80), (3, 8, 16)
    params, _ = psa_params_for_density(grid, tile, H, rho)
    kernels.psa_attention(q, k, v, grid=grid, params=params, tile=tile)
    torch.cuda.synchronize()
    # The profiled launches: fused Sol, Sol on precomputed lists, PSA.
    kernels.sol_attention(q, k, v, beta=beta)
    plain()
    kernels.psa_attention(q, k, v, grid=grid, params=params, tile=tile)
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
