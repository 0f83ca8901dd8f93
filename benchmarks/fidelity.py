"""Fidelity of Sol-Attn on the video-like workload, against dense attention (float32).

Two studies, per head kind and overall:
1. Density sweep (densities 0.05-0.20, β = beta_for_density(ρ)): Sol-Attn output vs dense.
   On CUDA the Triton kernel ``kernels.sol_attention`` runs in the workload dtype; elsewhere
   ``kernels.sol_attention_reference`` (float32). Achieved density as the kernel reports it.
2. Ablation of the paper's Fig. 9 (sparsity 70-90 %): one block selection per sparsity
   (``sol_block_selection``), then ``sol_attention_reference`` on exactly those blocks with
   correction=False (plain block-sparse, "exact only") and correction=True ("exact or
   approximate"). By default β is calibrated by bisection so that the achieved mean density
   over all heads equals 1 − sparsity (``--ablation-beta gaussian`` uses 1 − Φ(β) instead).

Metrics: rel-L2 = ‖out − dense‖_F / ‖dense‖_F (per kind: sums of squares over its heads),
mean row cosine = mean over (batch, token, head) rows of cos(out_row, dense_row). Dense is
exact float32 attention computed in chunks of query rows (TF32 off).

CPU:  python benchmarks/fidelity.py --small
GPU:  python benchmarks/fidelity.py --device cuda
      (sweep on 21×45×80 = 75,600 tokens and ablation on 21×30×52 = 32,760 tokens, 40 heads,
       d = 128, bf16)
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

from benchmarks.workload import KINDS, default_logit_scale, video_qkv, workload_info  # noqa: E402
import kernels  # noqa: E402

DENSITIES = (0.05, 0.10, 0.15, 0.20)
SPARSITIES = (0.70, 0.75, 0.80, 0.85, 0.90)


@torch.no_grad()
def dense_attention(q, k, v, rows_per_chunk: int = 1024) -> torch.Tensor:
    """Exact softmax attention in float32, (B, L, H, D) -> (B, L, H, D) float32, one head at a time."""
    B, L, H, D = q.shape
    scale = 1.0 / math.sqrt(D)
    out = torch.empty((B, L, H, D), device=q.device, dtype=torch.float32)
    for b in range(B):
        for h in range(H):
            kf, vf = k[b, :, h].float(), v[b, :, h].float()
            for r0 in range(0, L, rows_per_chunk):
                qf = q[b, r0 : r0 + rows_per_chunk, h].float()
                out[b, r0 : r0 + rows_per_chunk, h] = torch.softmax(scale * qf @ kf.t(), dim=-1) @ vf
    return out


def head_errors(out: torch.Tensor, dense: torch.Tensor) -> dict:
    """Per head (H,) sums: squared error, squared reference, sum and count of row cosines."""
    o, d = out.float(), dense.float()
    err2 = (o - d).pow(2).sum(dim=(0, 1, 3))
    ref2 = d.pow(2).sum(dim=(0, 1, 3))
    cos = torch.nn.functional.cosine_similarity(o, d, dim=-1, eps=1e-12)  # (B, L, H)
    return {"err2": err2.double().cpu(), "ref2": ref2.double().cpu(), "cos_sum": cos.double().sum(dim=(0, 1)).cpu(),
            "rows": torch.full((o.shape[2],), o.shape[0] * o.shape[1], dtype=torch.float64)}


def aggregate(errs: dict, kinds: list[str], extra: dict | None = None) -> dict:
    """{'overall': {...}, 'by_kind': {kind: {...}}} with rel_l2 and mean_cos."""

    def agg(mask):
        idx = torch.tensor(mask)
        rec = {
            "rel_l2": math.sqrt(errs["err2"][idx].sum().item() / errs["ref2"][idx].sum().item()),
            "mean_cos": errs["cos_sum"][idx].sum().item() / errs["rows"][idx].sum().item(),
            "heads": int(idx.sum().item()),
        }
        for name, per_head in (extra or {}).items():
            rec[name] = per_head[idx].double().mean().item()
        return rec

    return {
        "overall": agg([True] * len(kinds)),
        "by_kind": {kd: agg([x == kd for x in kinds]) for kd in KINDS if kd in kinds},
    }


def run_sol(q, k, v, beta, grid=None, reorder=None):
    """Sol-Attn output and per-head achieved density (H,): kernel on CUDA, reference elsewhere.
    ``reorder`` = (bt, bh, bw) with ``grid``: 64-token blocks over tile-major token order."""
    kw = dict(beta=beta, return_stats=True, grid=grid, reorder=reorder)
    if q.device.type == "cuda":
        out, st = kernels.sol_attention(q, k, v, **kw)
        torch.cuda.synchronize()
        impl = "kernels.sol_attention (Triton)"
    else:
        out, st = kernels.sol_attention_reference(q, k, v, **kw)
        impl = "kernels.sol_attention_reference (float32)"
    return out, st["density"].float().mean(dim=0).cpu(), impl


def calibrated_beta(q, k, v, target_density: float, iters: int = 30) -> float:
    """β whose Sol selection has mean density (over batch and heads) closest to the target."""
    lo, hi = -1.0, 4.0
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        dens = kernels.sol_block_selection(q, k, v, beta=mid).float().mean().item()
        if dens > target_density:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def density_sweep(q, k, v, kinds, dense, densities, grid=None, reorder=None):
    rows = []
    for rho in densities:
        beta = kernels.beta_for_density(rho)
        t0 = time.time()
        out, dens, impl = run_sol(q, k, v, beta, grid, reorder)
        secs = time.time() - t0
        res = aggregate(head_errors(out, dense), kinds, {"density": dens})
        rows.append({"target_density": rho, "beta": beta, "impl": impl, "seconds": secs, **res})
        del out
    return rows


def ablation(q, k, v, kinds, dense, sparsities, beta_mode):
    rows = []
    H = q.shape[2]
    for sp in sparsities:
        target = 1.0 - sp
        beta = calibrated_beta(q, k, v, target) if beta_mode == "calibrated" else kernels.beta_for_density(target)
        sel = kernels.sol_block_selection(q, k, v, beta=beta)  # (B, H, N, N)
        dens = sel.float().mean(dim=(0, 2, 3)).cpu()
        rec = {"target_sparsity": sp, "beta": beta, "beta_mode": beta_mode,
               "achieved_sparsity": 1.0 - dens.mean().item()}
        for name, corr in (("exact_only", False), ("exact_plus_proxy", True)):
            out = torch.empty(q.shape, device=q.device, dtype=torch.float32)
            for h in range(H):
                out[:, :, h : h + 1] = kernels.sol_attention_reference(
                    q[:, :, h : h + 1], k[:, :, h : h + 1], v[:, :, h : h + 1], beta=beta,
                    selection=sel[:, h : h + 1], correction=corr,
                ).float()
            rec[name] = aggregate(head_errors(out, dense), kinds, {"density": dens})
            del out
        rec["rel_l2_reduction"] = {
            "overall": 1.0 - rec["exact_plus_proxy"]["overall"]["rel_l2"] / rec["exact_only"]["overall"]["rel_l2"],
            "by_kind": {
                kd: 1.0 - rec["exact_plus_proxy"]["by_kind"][kd]["rel_l2"] / rec["exact_only"]["by_kind"][kd]["rel_l2"]
                for kd in rec["exact_only"]["by_kind"]
            },
        }
        rows.append(rec)
    return rows


def print_tables(res: dict) -> None:
    sw = res["sweep"]
    print(f"== Sol-Attn vs dense: grid {sw['grid']} L={sw['tokens']} H={sw['heads']} {res['dtype']} on {res['device']}")
    if sw.get("dense_lowp_rel_l2") is not None:
        print(f"   floor: dense in {res['dtype']} (SDPA) vs float32 dense: rel-L2 {sw['dense_lowp_rel_l2']:.4f}")
    kinds = list(sw["rows"][0]["by_kind"])
    print(f"{'rho':>5s} {'beta':>6s} {'dens':>6s} {'relL2':>7s} {'cos':>7s}  " + "  ".join(f"{kd[:8]:>8s}" for kd in kinds) + "   (rel-L2 by kind)")
    for r in sw["rows"]:
        o = r["overall"]
        print(f"{r['target_density']:5.2f} {r['beta']:6.3f} {o['density']:6.3f} {o['rel_l2']:7.4f} {o['mean_cos']:7.4f}  "
              + "  ".join(f"{r['by_kind'][kd]['rel_l2']:8.4f}" for kd in kinds))
    ab = res["ablation"]
    print(f"== Ablation (paper Fig. 9): same blocks, exact-only vs exact+proxy; grid {ab['grid']} L={ab['tokens']}")
    print(f"{'spars':>5s} {'achvd':>6s} {'beta':>6s} {'L2 exact':>9s} {'L2 +prox':>9s} {'reduct':>7s} {'cos ex':>7s} {'cos +p':>7s}  "
          + "  ".join(f"{kd[:8]:>8s}" for kd in kinds) + "   (reduction by kind)")
    for r in ab["rows"]:
        e, c = r["exact_only"]["overall"], r["exact_plus_proxy"]["overall"]
        print(f"{r['target_sparsity']:5.2f} {r['achieved_sparsity']:6.3f} {r['beta']:6.3f} {e['rel_l2']:9.4f} {c['rel_l2']:9.4f} "
              f"{r['rel_l2_reduction']['overall']:7.1%} {e['mean_cos']:7.4f} {c['mean_cos']:7.4f}  "
              + "  ".join(f"{r['rel_l2_reduction']['by_kind'][kd]:8.1%}" for kd in kinds))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true",
                    help="CPU preset: grid 8 16 24 (3,072 tokens) for both studies, 16 heads, float32, reference")
    ap.add_argument("--grid", type=int, nargs=3, default=[21, 45, 80], help="density-sweep grid")
    ap.add_argument("--ablation-grid", type=int, nargs=3, default=[21, 30, 52], help="ablation grid (reference, O(L) rows per chunk)")
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--densities", type=float, nargs="+", default=list(DENSITIES))
    ap.add_argument("--sparsities", type=float, nargs="+", default=list(SPARSITIES))
    ap.add_argument("--ablation-beta", default="calibrated", choices=["calibrated", "gaussian"])
    ap.add_argument("--reorder", type=int, nargs=3, default=None, metavar=("BT", "BH", "BW"),
                    help="also run the density sweep with Sol's tile-major token order (e.g. 4 4 4)")
    ap.add_argument("--skip-sweep", action="store_true")
    ap.add_argument("--skip-ablation", action="store_true")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    if args.small:
        args.grid, args.ablation_grid = [8, 16, 24], [8, 16, 24]
        args.heads, args.device, args.dtype = 16, "cpu", "float32"
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    device = torch.device(args.device)
    dtype = getattr(torch, args.dtype)
    t_start = time.time()
    res = {
        "command": " ".join([os.path.basename(sys.executable)] + sys.argv),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "dtype": args.dtype,
        "seed": args.seed,
        "head_dim": args.head_dim,
        "tf32": False,
    }

    def workload(grid):
        q, k, v, kinds = video_qkv(tuple(grid), args.heads, args.head_dim, seed=args.seed, device=device, dtype=dtype)
        return q, k, v, kinds

    if not args.skip_sweep:
        q, k, v, kinds = workload(args.grid)
        dense = dense_attention(q, k, v)
        floor = None
        if dtype != torch.float32:
            lowp = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
            floor = aggregate(head_errors(lowp, dense), kinds)["overall"]["rel_l2"]
            del lowp
        res["sweep"] = {
            "grid": args.grid, "tokens": q.shape[1], "heads": args.heads, "kinds": kinds,
            "logit_scale": default_logit_scale(q.shape[1]), "dense_lowp_rel_l2": floor,
            "rows": density_sweep(q, k, v, kinds, dense, args.densities),
        }
        if args.reorder:
            res["sweep_reorder"] = {
                "grid": args.grid, "tile": args.reorder,
                "rows": density_sweep(q, k, v, kinds, dense, args.densities, tuple(args.grid), tuple(args.reorder)),
            }
            print("== Sol-Attn with reorder=%s vs row-major blocks, same β" % (tuple(args.reorder),))
            print("  rho   dens(row-major) relL2     dens(tiles) relL2")
            for a, b in zip(res["sweep"]["rows"], res["sweep_reorder"]["rows"]):
                print(f" {a['target_density']:.2f}   {a['overall']['density']:.3f}   {a['overall']['rel_l2']:.4f}"
                      f"      {b['overall']['density']:.3f}   {b['overall']['rel_l2']:.4f}")
        del q, k, v, dense
    if not args.skip_ablation:
        q, k, v, kinds = workload(args.ablation_grid)
        dense = dense_attention(q, k, v)
        res["ablation"] = {
            "grid": args.ablation_grid, "tokens": q.shape[1], "heads": args.heads, "kinds": kinds,
            "logit_scale": default_logit_scale(q.shape[1]),
            "rows": ablation(q, k, v, kinds, dense, args.sparsities, args.ablation_beta),
        }
        del q, k, v, dense
    res["head_gains"] = workload_info(kinds, args.seed, args.head_dim)
    res["total_seconds"] = time.time() - t_start
    if "sweep" in res and "ablation" in res:
        print_tables(res)
    out = args.out or os.path.join(
        ROOT, "benchmarks", "results",
        "fidelity_cpu_small.json" if args.small else f"fidelity_{res['device'].split()[-1].lower()}_{args.dtype}.json",
    )
    os.makedirs(os.path.dirname(out), exist_ok=True)
    with open(out, "w") as f:
        json.dump(res, f, indent=1)
    print(f"wrote {out}  ({res['total_seconds']:.1f} s)")


if __name__ == "__main__":
    main()
