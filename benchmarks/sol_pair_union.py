"""How many K/V tile loads Sol's exact loop would save if the two 64-row work items of a
Hopper-loop program shared one key stream: the union of their routed lists. Counted on the CPU.

    python benchmarks/sol_pair_union.py --grid 21,45,80 --heads 16 --densities 0.10,0.15 \
        --inputs gaussian,video --out sol_pair_union.json

Today each consumer warpgroup streams its own list, so a loaded 64-key K/V tile (32 KB at
d 128) serves 64 query rows, and on random inputs the loop runs at the L2's rate (NOTES #28).
If both items of a program are in one head and stream the union of their lists, each consumer
still computes only its own blocks (the output is the same) while the L2 moves
|A ∪ B| tiles instead of |A| + |B|. This prints that ratio for three pairings of a head's
query blocks: ``routed`` (neighbours in ``sol_router.work_by_count``'s order, today's programs),
``w`` and ``t`` (a query block and its neighbour along the block grid's w or t axis).
Inputs: ``gaussian`` (the kernel benchmarks' q, k, v) or ``video`` (``workload.video_qkv``).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.workload import video_qkv  # noqa: E402
from kernels.sol_reference import sol_block_selection  # noqa: E402
from kernels.sol_router import work_by_count  # noqa: E402
from kernels.sol_routing import beta_for_density, sol_layout  # noqa: E402

PAIRINGS = ("routed", "w", "t")
INPUTS = ("gaussian", "video")


def neighbour_pairs(block_grid, axis: str) -> torch.Tensor:
    """int64 (P, 2): query blocks paired with their neighbour along ``axis`` ("w" or "t") of the
    block grid (t, h, w), blocks numbered row-major; an odd last block along the axis is alone
    (paired with itself, which costs its own list once)."""
    gt, gh, gw = block_grid
    index = torch.arange(gt * gh * gw).reshape(gt, gh, gw)
    dim = {"t": 0, "w": 2}[axis]
    n = index.shape[dim]
    first = index.narrow(dim, 0, n - n % 2).unflatten(dim, (n // 2, 2))
    pairs = first.movedim(dim + 1, -1).reshape(-1, 2)
    if n % 2:
        last = index.narrow(dim, n - 1, 1).reshape(-1, 1)
        pairs = torch.cat([pairs, last.expand(-1, 2)])
    return pairs


def routed_pairs(selected: torch.Tensor) -> torch.Tensor:
    """int64 (H, P, 2): the query blocks that ``work_by_count`` puts into one program, per head."""
    B, H, n, _ = selected.shape
    counts = torch.stack([selected.sum(-1), torch.zeros_like(selected[..., 0], dtype=torch.long)], -1)
    order = work_by_count(counts.to(torch.int32)).long().reshape(H, n) % n
    if n % 2:
        order = torch.cat([order, order[:, -1:]], dim=1)
    return order.reshape(H, -1, 2)


def union_ratio(selected: torch.Tensor, pairs: torch.Tensor) -> dict:
    """Tiles the pairs load with a shared stream over tiles with one stream per item.
    ``selected`` bool (B, H, N, N); ``pairs`` int64 (P, 2) for every head or (H, P, 2)."""
    B, H = selected.shape[:2]
    if pairs.dim() == 2:
        pairs = pairs.expand(H, -1, -1)
    heads = torch.arange(H)[:, None]
    a = selected[:, heads, pairs[..., 0]]  # (B, H, P, N)
    b = selected[:, heads, pairs[..., 1]]
    alone = pairs[..., 0] == pairs[..., 1]
    separate = a.sum(-1) + torch.where(alone, 0, b.sum(-1))
    union = (a | b).sum(-1)
    return {"separate_tiles": int(separate.sum()), "union_tiles": int(union.sum()),
            "ratio": round(float(union.sum()) / max(1, float(separate.sum())), 4)}


def inputs_for(kind: str, grid, heads: int, head_dim: int, seed: int):
    L = grid[0] * grid[1] * grid[2]
    if kind == "gaussian":
        g = torch.Generator().manual_seed(seed)
        return [torch.randn(1, L, heads, head_dim, generator=g).to(torch.bfloat16) for _ in range(3)]
    q, k, v, _ = video_qkv(grid, heads, head_dim, seed=seed)
    return q, k, v


def run(args) -> dict:
    grid = tuple(args.grid)
    layout = sol_layout(grid[0] * grid[1] * grid[2], grid)
    rows = []
    for kind in args.inputs:
        q, k, v = inputs_for(kind, grid, args.heads, args.head_dim, args.seed)
        for rho in args.densities:
            beta = beta_for_density(rho)
            selected = sol_block_selection(q, k, v, beta=beta, grid=grid)
            row = {"inputs": kind, "target_density": rho, "beta": round(beta, 4),
                   "density": round(float(selected.float().mean()), 4)}
            for pairing in args.pairings:
                pairs = routed_pairs(selected) if pairing == "routed" else neighbour_pairs(layout.block_grid, pairing)
                row[pairing] = union_ratio(selected, pairs)
            rows.append(row)
            print(f"{kind:8s} rho {rho:.2f} (measured {row['density']:.4f}): "
                  + ", ".join(f"{p} {row[p]['ratio']:.3f}" for p in args.pairings), flush=True)
    return {"grid": list(grid), "tile": list(layout.tile), "block_grid": list(layout.block_grid),
            "heads": args.heads, "head_dim": args.head_dim, "seed": args.seed, "rows": rows}


def _ints(text: str) -> list:
    return [int(x) for x in text.split(",")]


def _choices(allowed):
    def parse(text: str) -> list:
        names = text.split(",")
        bad = [n for n in names if n not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(allowed)}")
        return names
    return parse


def _densities(text: str) -> list:
    values = [float(x) for x in text.split(",")]
    if any(not 0 < x < 1 for x in values):
        raise argparse.ArgumentTypeError(f"densities must be in (0, 1), got {text}")
    return values


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--grid", type=_ints, default=[21, 45, 80], help="T,H,W of the token grid")
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--densities", type=_densities, default=[0.10, 0.15])
    ap.add_argument("--inputs", type=_choices(INPUTS), default=list(INPUTS))
    ap.add_argument("--pairings", type=_choices(PAIRINGS), default=list(PAIRINGS))
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    if len(args.grid) != 3 or min(args.grid) < 1:
        ap.error(f"--grid needs three positive sizes T,H,W, got {args.grid}")
    if args.heads < 1:
        ap.error(f"--heads must be >= 1, got {args.heads}")
    start = time.time()
    res = run(args)
    res["command"] = "python benchmarks/sol_pair_union.py " + " ".join(argv if argv is not None else sys.argv[1:])
    res["seconds"] = round(time.time() - start, 1)
    with open(args.out, "w") as f:
        json.dump(res, f, indent=1)
    return res


if __name__ == "__main__":
    main()
