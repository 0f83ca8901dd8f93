"""Statistics of the video-like workload, per head kind (see WORKLOAD.md).

Per head, from exact attention computed in chunks of query rows (memory O(rows · L)):
- top15_mass: share of attention mass in the top 15 % of 64-token key blocks. Mass by block:
  for query block i, M_ij = mean over its query rows of Σ_{t ∈ block j} p_rt; the top
  ceil(0.15·N) blocks of row i by M_ij; averaged over query blocks i. This is what an oracle
  block-sparse method at 85 % sparsity could keep.
- self / same_hw_other_frames / same_frame / neighbourhood (|Δt|,|Δh|,|Δw| ≤ 1) mass per
  query token, averaged: checks that the head kinds behave as labelled.
- sol_mass[β]: mass inside the blocks Sol-Attn selects at β (kernels.sol_block_selection).
From the Sol proxy scores ŝ_ij = s·Q̄_i·K̄_j (block means), standardized per query block row
(z = (ŝ − μ_i)/σ_i, population moments over the N key blocks, as in the paper's eq. 5):
- skew = E z³, excess kurtosis = E z⁴ − 3 (pooled over rows and heads of a kind);
- density[β]: the share of exact blocks that Sol selects at β, against 1 − Φ(β).

CPU: python benchmarks/workload_stats.py --small
GPU: python benchmarks/workload_stats.py --device cuda --dtype bfloat16 --grid 21 45 80 --heads 40
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.workload import KINDS, default_logit_scale, grid_positions, video_qkv, workload_info  # noqa: E402
from kernels import density_for_beta, sol_block_selection  # noqa: E402

BLOCK = 64
BETAS = (1.0, 1.5, 2.0)
TOP_FRACTION = 0.15


@torch.no_grad()
def head_attention_stats(q, k, grid, *, query_block_stride: int = 1, rows_per_chunk: int = 1024, scale=None):
    """Exact-attention statistics of one head: q, k (L, D) (any float dtype; computed in fp32).

    Returns (block_mass (Nq', N) float32 for the query blocks used, token stats dict).
    query_block_stride > 1 uses every stride-th query block only (to bound time at full size).
    """
    L, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    n = -(-L // BLOCK)
    qf, kf = q.float(), k.float()
    pos = grid_positions(grid, q.device)
    qblocks = list(range(0, n, query_block_stride))
    mass_rows = []
    sums = {"self": 0.0, "same_hw_other_frames": 0.0, "same_frame": 0.0, "neighbourhood": 0.0}
    count = 0
    per_chunk = max(1, rows_per_chunk // BLOCK)
    for c0 in range(0, len(qblocks), per_chunk):
        blocks = torch.tensor(qblocks[c0 : c0 + per_chunk], device=q.device)
        rows = (blocks[:, None] * BLOCK + torch.arange(BLOCK, device=q.device)).flatten()
        rows = rows[rows < L]
        p = torch.softmax(scale * (qf[rows] @ kf.t()), dim=-1)  # (R, L)
        # mass by key block, then mean over the rows of each query block
        by_key = torch.nn.functional.pad(p, (0, n * BLOCK - L)).view(rows.numel(), n, BLOCK).sum(-1)
        qb = rows // BLOCK
        agg = torch.zeros((n, n), device=q.device).index_add_(0, qb, by_key)
        cnt = torch.zeros(n, device=q.device).index_add_(0, qb, torch.ones_like(qb, dtype=torch.float32))
        mass_rows.append(agg[blocks] / cnt[blocks, None])
        pr = pos[rows]
        dpos = (pr[:, None, :] - pos[None, :, :]).abs()  # (R, L, 3)
        same_t = dpos[..., 0] == 0
        same_hw = (dpos[..., 1] == 0) & (dpos[..., 2] == 0)
        sums["self"] += p.gather(1, rows[:, None]).sum().item()
        sums["same_hw_other_frames"] += (p * (same_hw & ~same_t)).sum().item()
        sums["same_frame"] += (p * same_t).sum().item()
        sums["neighbourhood"] += (p * (dpos <= 1).all(-1)).sum().item()
        count += rows.numel()
        del p, by_key, dpos
    token = {name: val / count for name, val in sums.items()}
    return torch.cat(mass_rows, dim=0), token, qblocks


def top_fraction_mass(block_mass: torch.Tensor, fraction: float = TOP_FRACTION) -> float:
    n = block_mass.shape[-1]
    k = max(1, math.ceil(fraction * n))
    return block_mass.topk(k, dim=-1).values.sum(-1).mean().item()


@torch.no_grad()
def proxy_z(q, k, scale=None):
    """Standardized proxy scores z (N, N) of one head, q/k (L, D), rows standardized."""
    L, D = q.shape
    scale = 1.0 / math.sqrt(D) if scale is None else scale
    n = -(-L // BLOCK)
    idx = torch.arange(L, device=q.device) // BLOCK
    lens = torch.zeros(n, device=q.device).index_add_(0, idx, torch.ones(L, device=q.device))
    qm = torch.zeros((n, D), device=q.device).index_add_(0, idx, q.float()) / lens[:, None]
    km = torch.zeros((n, D), device=q.device).index_add_(0, idx, k.float()) / lens[:, None]
    s = scale * qm @ km.t()
    mu = s.mean(-1, keepdim=True)
    sd = s.std(-1, unbiased=False, keepdim=True).clamp_min(1e-12)
    return (s - mu) / sd


def _moments(z: torch.Tensor) -> dict:
    z = z.flatten().double()
    return {"skew": (z**3).mean().item(), "excess_kurtosis": ((z**4).mean() - 3.0).item()}


def run(args) -> dict:
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    grid = tuple(args.grid)
    t0 = time.time()
    q, k, v, kinds = video_qkv(
        grid, args.heads, args.head_dim, batch=1, kinds=args.kinds, seed=args.seed, device=device, dtype=dtype
    )
    if device.type == "cuda":
        torch.cuda.synchronize()
    gen_s = time.time() - t0
    L = q.shape[1]
    n = -(-L // BLOCK)
    selections = {b: sol_block_selection(q, k, v, beta=b)[0] for b in BETAS}  # (H, N, N)
    heads = []
    t1 = time.time()
    for h in range(args.heads):
        bm, token, qblocks = head_attention_stats(
            q[0, :, h], k[0, :, h], grid, query_block_stride=args.query_block_stride, rows_per_chunk=args.rows_per_chunk
        )
        z = proxy_z(q[0, :, h], k[0, :, h])
        rec = {"head": h, "kind": kinds[h], "top15_mass": top_fraction_mass(bm), **token, **_moments(z)}
        rec["z_above"] = {str(b): (z > b).float().mean().item() for b in BETAS}
        for b in BETAS:
            sel = selections[b][h]
            rec.setdefault("sol_density", {})[str(b)] = sel.float().mean().item()
            per_row = sel.float().mean(-1)
            rec.setdefault("sol_density_p10_p90", {})[str(b)] = [
                torch.quantile(per_row, 0.1).item(), torch.quantile(per_row, 0.9).item()
            ]
            rec.setdefault("sol_mass", {})[str(b)] = (bm * sel[qblocks].float()).sum(-1).mean().item()
        rec["_z"] = z
        heads.append(rec)
    stats_s = time.time() - t1

    def summarize(recs):
        out = {"heads": len(recs)}
        for key in ("top15_mass", "self", "same_hw_other_frames", "same_frame", "neighbourhood"):
            out[key] = sum(r[key] for r in recs) / len(recs)
        out.update(_moments(torch.cat([r["_z"].flatten() for r in recs])))
        for key in ("sol_density", "sol_mass", "z_above"):
            out[key] = {str(b): sum(r[key][str(b)] for r in recs) / len(recs) for b in BETAS}
        return out

    by_kind = {kd: summarize([r for r in heads if r["kind"] == kd]) for kd in KINDS if kd in kinds}
    overall = summarize(heads)
    for r in heads:
        del r["_z"]
    return {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "grid": list(grid),
        "tokens": L,
        "blocks": n,
        "heads": args.heads,
        "head_dim": args.head_dim,
        "dtype": args.dtype,
        "seed": args.seed,
        "logit_scale": default_logit_scale(L),
        "query_block_stride": args.query_block_stride,
        "gaussian_density": {str(b): density_for_beta(b) for b in BETAS},
        "generate_s": gen_s,
        "stats_s": stats_s,
        "overall": overall,
        "by_kind": by_kind,
        "per_head": heads,
        "head_gains": workload_info(kinds, args.seed, args.head_dim),
    }


def print_table(res: dict) -> None:
    g = res["gaussian_density"]
    print(f"grid {res['grid']} L={res['tokens']} N={res['blocks']} heads={res['heads']} {res['dtype']} on {res['device']}")
    print("1-Phi(beta): " + "  ".join(f"b={b}: {d:.3f}" for b, d in g.items()))
    hdr = f"{'kind':9s} {'n':>3s} {'top15':>6s} {'self':>5s} {'hw,t!=':>6s} {'frame':>6s} {'nbhd':>5s} {'skew':>6s} {'kurt':>6s}  " \
          + "  ".join(f"dens@{b}" for b in BETAS) + "  " + "  ".join(f"mass@{b}" for b in BETAS)
    print(hdr)
    rows = list(res["by_kind"].items()) + [("overall", res["overall"])]
    for name, s in rows:
        print(
            f"{name:9s} {s['heads']:3d} {s['top15_mass']:6.3f} {s['self']:5.3f} {s['same_hw_other_frames']:6.3f} "
            f"{s['same_frame']:6.3f} {s['neighbourhood']:5.3f} {s['skew']:6.2f} {s['excess_kurtosis']:6.2f}  "
            + "  ".join(f"{s['sol_density'][str(b)]:8.3f}" for b in BETAS) + "  "
            + "  ".join(f"{s['sol_mass'][str(b)]:8.3f}" for b in BETAS)
        )


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true", help="CPU preset: grid 8 16 24 (3,072 tokens), 16 heads, float32")
    ap.add_argument("--grid", type=int, nargs=3, default=[21, 45, 80])
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--kinds", nargs="+", default=None, help="one kind per head (default: the workload's mix)")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--query-block-stride", type=int, default=1, help="use every n-th query block for mass stats")
    ap.add_argument("--rows-per-chunk", type=int, default=1024)
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/workload_stats_<tag>.json)")
    args = ap.parse_args(argv)
    if args.small:
        args.grid, args.heads, args.device, args.dtype = [8, 16, 24], 16, "cpu", "float32"
    res = run(args)
    print_table(res)
    out = args.out or os.path.join(
        ROOT, "benchmarks", "results",
        f"workload_stats_{'cpu_small' if args.small else 'x'.join(map(str, args.grid)) + '_' + res['device'].split()[-1].lower()}.json",
    )
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
