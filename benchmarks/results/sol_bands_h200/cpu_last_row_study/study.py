"""Sol's fidelity with each remainder tiling of branch sol-row-bands, float32 reference
against dense attention (see ../README.md).

Run it on that branch, naming the tilings to try: main has no bands, so on main every
tiling but "uniform" is refused by `sol_routing.sol_layout`.
"""
import os
import sys
import time

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", "..", ".."))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))

import kernels.sol_routing as sol_routing  # noqa: E402
from kernels.sol_reference import sol_attention_reference  # noqa: E402
from workload import video_qkv  # noqa: E402

GRID = (9, 45, 80)
HEADS = 8
HEAD_DIM = 64
ROWS_PER_CHUNK = 4096

# Each tiling: (number of block rows, tile shape) per band, top to bottom.
TILINGS = {
    "uniform": ((45, (1, 8, 8)),),
    "D_248_818": ((40, (1, 8, 8)), (4, (2, 4, 8)), (1, (8, 1, 8))),
    "D_248_1164": ((40, (1, 8, 8)), (4, (2, 4, 8)), (1, (1, 1, 64))),
    "D_248_2132": ((40, (1, 8, 8)), (4, (2, 4, 8)), (1, (2, 1, 32))),
}


def dense_attention(q, k, v, scale):
    """Exact softmax attention, chunked over query rows to bound CPU memory."""
    out = torch.empty_like(q)
    seq_len = q.shape[1]
    for head in range(q.shape[2]):
        qh, kh, vh = q[0, :, head], k[0, :, head], v[0, :, head]
        for start in range(0, seq_len, ROWS_PER_CHUNK):
            rows = slice(start, start + ROWS_PER_CHUNK)
            out[0, rows, head] = torch.softmax(qh[rows] @ kh.T * scale, -1) @ vh
    return out


def relative_l2(approx, exact):
    return ((approx - exact).norm() / exact.norm()).item()


def main(names):
    torch.set_num_threads(2)
    q, k, v, _ = video_qkv(GRID, heads=HEADS, head_dim=HEAD_DIM, dtype=torch.float32, seed=5)
    seq_len = q.shape[1]
    exact = dense_attention(q, k, v, HEAD_DIM ** -0.5)
    for name in names:
        tiling = TILINGS[name]
        sol_routing.sol_bands = lambda grid, tile, tiling=tiling: tiling
        n_blocks = sol_routing.sol_layout(seq_len, GRID).n_blocks
        for beta in (1.0, 1.2):
            started = time.time()
            out, stats = sol_attention_reference(q, k, v, beta=beta, grid=GRID, return_stats=True)
            print(f"{name} {n_blocks} {beta} density {stats['density'].mean():.4f} "
                  f"relL2 {relative_l2(out, exact):.4f} ({time.time() - started:.0f}s)", flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
