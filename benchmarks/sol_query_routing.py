"""Sol-Attn routed per 64-token query block (the method) against per pair of query blocks (two
64-token blocks at one place in frames 2m and 2m + 1 routed as one 128-token block, keys still
in 64-token blocks), at equal density, on the video-like workload: the error a 128-row query
tile would cost. Such tiles would let Sol's Hopper loop share every key step between its two
consumers, as PSA's does (kernels/DESIGN.md, "Sol routes 64-row query blocks").

For each target density, β is calibrated by bisection per routing so that the mean density of
exact blocks meets the target; the outputs are the float32 reference's
(``sol_reference.sol_output_for_selection``) against dense float32 attention. CPU or CUDA.

    python benchmarks/sol_query_routing.py --grid 12 30 40 --heads 8 --out q128.json
"""
from __future__ import annotations

import argparse
import math
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.fidelity import aggregate, bisect_beta, dense_attention, head_errors  # noqa: E402
from benchmarks.results_file import write_results  # noqa: E402
from benchmarks.workload import video_qkv  # noqa: E402
from kernels.engine.pair_streams import pair_partners  # noqa: E402
from kernels.sol_reference import pooled_means, selection_from_means, sol_output_for_selection  # noqa: E402
from kernels.sol_rules import block_thresholds, forced_key_blocks, per_head_beta, sol_layout  # noqa: E402

ROUTINGS = (64, 128)  # query rows routed as one


class Routing:
    """The exact-block selection of one call, routed per query block (64 rows) or per pair of
    query blocks (128 rows: the pair's length-weighted query mean, one selection for both)."""

    def __init__(self, q, k, grid):
        B, L, H, D = q.shape
        self.scale = 1.0 / math.sqrt(D)
        self.layout = sol_layout(L, tuple(grid), None, q.device)
        self.forced = forced_key_blocks(self.layout, [])
        self.q_mean, self.k_mean = pooled_means(q, self.layout).float(), pooled_means(k, self.layout).float()
        pairs = pair_partners(self.layout)
        self.first, second = pairs[:, 0], pairs[:, 1]
        self.has_second = second >= 0
        self.second = second[self.has_second]
        lengths = self.layout.lengths.float()
        w0 = lengths[self.first]
        w1 = torch.where(self.has_second, lengths[second.clamp_min(0)], 0.0)
        self.pair_mean = ((self.q_mean[:, :, self.first] * w0[:, None]
                           + self.q_mean[:, :, second.clamp_min(0)] * w1[:, None]) / (w0 + w1)[:, None])

    def selection(self, rows: int, beta: float) -> torch.Tensor:
        q_mean = self.q_mean if rows == 64 else self.pair_mean
        betas = per_head_beta(beta, q_mean.shape[1], q_mean.device)
        tau = block_thresholds(q_mean, self.k_mean, betas, "exact", self.scale)
        chosen = selection_from_means(q_mean, self.k_mean, tau, self.forced, self.scale)
        if rows == 64:
            return chosen
        selection = torch.empty(*chosen.shape[:2], self.layout.n_blocks, self.layout.n_blocks, dtype=torch.bool,
                                device=chosen.device)
        selection[:, :, self.first] = chosen
        selection[:, :, self.second] = chosen[:, :, self.has_second]
        return selection

    def calibrated_beta(self, rows: int, target: float) -> float:
        return bisect_beta(lambda beta: self.selection(rows, beta).float().mean().item(), target)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--grid", type=int, nargs=3, default=[12, 30, 40])
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--densities", type=float, nargs="+", default=[0.10, 0.15, 0.20, 0.25])
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if any(not 0 < rho < 1 for rho in args.densities):
        ap.error(f"--densities: expected shares in (0, 1), got {args.densities}")
    torch.backends.cuda.matmul.allow_tf32 = False
    device = torch.device(args.device)
    q, k, v, kinds = video_qkv(tuple(args.grid), args.heads, args.head_dim, seed=args.seed, device=device,
                               dtype=torch.float32)
    dense = dense_attention(q, k, v)
    routing = Routing(q, k, args.grid)
    rows = []
    for rho in args.densities:
        for query_rows in ROUTINGS:
            beta = routing.calibrated_beta(query_rows, rho)
            selection = routing.selection(query_rows, beta)
            out = sol_output_for_selection(q, k, v, selection, routing.layout, routing.scale)
            overall = aggregate(head_errors(out, dense), kinds)["overall"]
            row = {"target_density": rho, "query_rows": query_rows, "beta": beta,
                   "density": selection.float().mean().item(), "rel_l2": overall["rel_l2"],
                   "mean_cos": overall["mean_cos"]}
            rows.append(row)
            print(f"ρ {rho:.2f}, query rows {query_rows:3d}: β {beta:.3f} density {row['density']:.4f} "
                  f"rel-L2 {row['rel_l2']:.4f} mean cos {row['mean_cos']:.5f}", flush=True)
    res = {"command": " ".join([os.path.basename(sys.executable)] + sys.argv),
           "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
           "torch": torch.__version__, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
           "grid": args.grid, "heads": args.heads, "head_dim": args.head_dim, "seed": args.seed, "kinds": kinds,
           "rows": rows}
    if args.out:
        write_results(args.out, res)
    return res


if __name__ == "__main__":
    main()
