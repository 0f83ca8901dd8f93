"""Fidelity of Sol-Attn on the video-like workload, against dense attention (float32).

One study: for every block shape (``--tilings``: ``rowmajor`` 64-token slivers of the sequence,
``auto`` = ``kernels.sol_tile_for_grid``, or a 64-token 3D tile ``bt:bh:bw``) and every target
density (0.05-0.25), β is calibrated by bisection so that the achieved mean density of exact
blocks (over all heads) equals the target (``sol_block_selection``), so every block shape is
compared at equal density; then Sol-Attn runs on those same blocks, once per precision of the
exact blocks' QKᵀ (``--precisions``: ``bf16``, the input dtype, ``int8`` and ``fp8``; the β of
a row is shared by its precisions). On CUDA the Triton path ``kernels.sol_attention`` runs in
the workload dtype; elsewhere ``kernels.sol_attention_reference`` (float32, with the codes of
the kernels for ``int8`` and ``fp8``).

Metrics: rel-L2 = ‖out − dense‖_F / ‖dense‖_F (per kind: sums of squares over its heads),
mean row cosine = mean over (batch, token, head) rows of cos(out_row, dense_row). Dense is
exact float32 attention computed in chunks of query rows (TF32 off).

CPU:  python benchmarks/fidelity.py --small
GPU:  python benchmarks/fidelity.py --device cuda   (21×45×80 = 75,600 tokens, 40 heads, d = 128, bf16)
      python benchmarks/fidelity.py --device cuda --precisions bf16,int8,fp8 --tilings auto
      python benchmarks/fidelity.py --device cuda --precisions bf16,int8,fp8 --tilings auto \
          --psa-preset mask_presets/wan2.1_14b_720p_81f.json    # PSA too, one layer of the preset
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

from benchmarks.results_file import write_results  # noqa: E402
from benchmarks.workload import KINDS, default_logit_scale, video_qkv, workload_info  # noqa: E402
import kernels  # noqa: E402

DENSITIES = (0.05, 0.10, 0.15, 0.20, 0.25)
PRECISIONS = ("bf16", "int8", "fp8")  # of the exact blocks' QKᵀ (kernels.PRECISIONS less "auto": no GPU to choose for)
TILINGS = ("rowmajor", "auto", "2:4:8", "1:8:8", "4:4:4", "2:8:4")


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


def blocks_of(tiling: str, grid):
    """(grid, tile) keyword values of ``kernels.sol_attention`` for a tiling name."""
    if tiling == "rowmajor":
        return {"grid": None, "tile": None}
    if tiling == "auto":
        return {"grid": tuple(grid), "tile": None}
    return {"grid": tuple(grid), "tile": tuple(int(x) for x in tiling.split(":"))}


def run_method(method: str, q, k, v, **kw):
    """``kernels.<method>_attention`` (Triton) on CUDA, its float32 reference elsewhere: its
    result and which of the two ran."""
    if q.device.type == "cuda":
        result = getattr(kernels, f"{method}_attention")(q, k, v, **kw)
        torch.cuda.synchronize()
        return result, f"kernels.{method}_attention (Triton)"
    return getattr(kernels, f"{method}_attention_reference")(q, k, v, **kw), \
        f"kernels.{method}_attention_reference (float32)"


def run_sol(q, k, v, beta, blocks, precision="bf16"):
    """Sol-Attn output and per-head achieved density (H,), the exact blocks in ``precision``."""
    (out, st), impl = run_method("sol", q, k, v, beta=beta, return_stats=True, precision=precision, **blocks)
    return out, st["density"].float().mean(dim=0).cpu(), impl


def calibrated_beta(q, k, v, target_density: float, blocks: dict, iters: int = 30) -> float:
    """β whose Sol selection has mean density (over batch and heads) closest to the target."""
    return bisect_beta(lambda beta: kernels.sol_block_selection(q, k, v, beta=beta, **blocks).float().mean().item(),
                       target_density, iters)


def bisect_beta(density_of, target_density: float, iters: int = 30) -> float:
    """β in [-1, 4] where ``density_of(β)`` (falling as β rises) meets the target, by bisection."""
    lo, hi = -1.0, 4.0
    for _ in range(iters):
        mid = 0.5 * (lo + hi)
        if density_of(mid) > target_density:
            lo = mid
        else:
            hi = mid
    return 0.5 * (lo + hi)


def study(q, k, v, kinds, dense, grid, tilings, densities, precisions=("bf16",)):
    """One row per block shape, target density and precision (the β calibrated once per block
    shape and density, shared by the precisions)."""
    rows = []
    for tiling in tilings:
        blocks = blocks_of(tiling, grid)
        for rho in densities:
            beta = calibrated_beta(q, k, v, rho, blocks)
            for precision in precisions:
                rec = {"tiling": tiling, "tile": list(blocks["tile"] or ()), "target_density": rho, "beta": beta,
                       "precision": precision}
                t0 = time.time()
                out, dens, impl = run_sol(q, k, v, beta, blocks, precision)
                rec["sol"] = scored(out, dense, kinds, impl, t0, {"density": dens})
                rows.append(rec)
                say(f"{tiling:>8s} {precision} ρ={rho:.2f} β={beta:.3f} density "
                    f"{rec['sol']['overall']['density']:.3f}", rec["sol"])
    return rows


def scored(out, dense, kinds, impl: str, t0: float, extra=None) -> dict:
    """The errors of ``out`` against ``dense`` (``aggregate``), which implementation ran and
    its seconds since ``t0``."""
    return dict(aggregate(head_errors(out, dense), kinds, extra), impl=impl, seconds=time.time() - t0)


def say(label: str, scores: dict) -> None:
    w = scores["overall"]
    print(f"{label}: rel-L2 {w['rel_l2']:.4f} cos {w['mean_cos']:.4f}", flush=True)


def psa_study(q, k, v, kinds, dense, grid, preset_path, layer, precisions):
    """PSA with one layer of a shipped preset (its masks, grid and tile; the preset's first
    step bucket), once per precision of the exact blocks' QKᵀ, against the same dense output."""
    preset = kernels.load_preset(preset_path)
    if tuple(preset.grid) != tuple(grid):
        raise SystemExit(f"--psa-preset {preset_path}: its grid {list(preset.grid)} is not --grid {list(grid)}")
    heads = q.shape[2]
    if preset.num_heads < heads:
        raise SystemExit(f"--psa-preset {preset_path}: {preset.num_heads} heads, the workload has {heads}")
    params = preset.params_for(layer)[:heads]
    density = kernels.psa_block_mask(tuple(grid), params, tuple(preset.tile)).float().mean().item()
    rows = []
    for precision in precisions:
        kw = dict(grid=tuple(grid), params=params, tile=tuple(preset.tile), precision=precision)
        t0 = time.time()
        out, impl = run_method("psa", q, k, v, **kw)
        rec = {"preset": os.path.basename(preset_path), "layer": layer, "tile": list(preset.tile),
               "density": density, "precision": precision, "psa": scored(out, dense, kinds, impl, t0)}
        rows.append(rec)
        say(f"     psa {precision} {rec['preset']} layer {layer} density {density:.3f}", rec["psa"])
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--small", action="store_true",
                    help="CPU preset: grid 8 16 24 (3,072 tokens), 16 heads, float32, reference")
    ap.add_argument("--grid", type=int, nargs=3, default=[21, 45, 80])
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "float32"])
    ap.add_argument("--densities", type=float, nargs="+", default=list(DENSITIES))
    ap.add_argument("--tilings", default=",".join(TILINGS), help="block shapes, comma separated")
    ap.add_argument("--precisions", default="bf16",
                    help=f"precisions of the exact blocks, comma separated: {', '.join(PRECISIONS)} (default bf16)")
    ap.add_argument("--psa-preset", default=None,
                    help="also run PSA with this preset file's masks (its grid must be --grid), e.g. "
                         "mask_presets/wan2.1_14b_720p_81f.json")
    ap.add_argument("--psa-layer", type=int, default=0, help="the preset layer whose masks PSA runs (default 0)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    precisions = [x for x in args.precisions.split(",") if x]
    wrong = sorted(set(precisions) - set(PRECISIONS))
    if wrong or not precisions:
        ap.error(f"--precisions: unknown {', '.join(wrong) or '(none given)'}; choose from {', '.join(PRECISIONS)}")
    if args.small:
        args.grid, args.heads, args.device, args.dtype = [8, 16, 24], 16, "cpu", "float32"
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
    q, k, v, kinds = video_qkv(tuple(args.grid), args.heads, args.head_dim, seed=args.seed, device=device, dtype=dtype)
    dense = dense_attention(q, k, v)
    floor = None
    if dtype != torch.float32:
        lowp = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)
        floor = aggregate(head_errors(lowp, dense), kinds)["overall"]["rel_l2"]
        del lowp
    res["study"] = {
        "grid": args.grid, "tokens": q.shape[1], "heads": args.heads, "kinds": kinds,
        "logit_scale": default_logit_scale(q.shape[1]), "dense_lowp_rel_l2": floor,
        "rows": study(q, k, v, kinds, dense, args.grid, [t for t in args.tilings.split(",") if t], args.densities,
                      precisions),
    }
    if args.psa_preset:
        res["psa"] = psa_study(q, k, v, kinds, dense, args.grid, args.psa_preset, args.psa_layer, precisions)
    res["head_gains"] = workload_info(kinds, args.seed, args.head_dim)
    res["total_seconds"] = time.time() - t_start
    out = args.out or os.path.join(
        ROOT, "out",
        "fidelity_tiles_cpu_small.json" if args.small else f"fidelity_tiles_{res['device'].split()[-1].lower()}_{args.dtype}.json",
    )
    os.makedirs(os.path.dirname(out), exist_ok=True)
    write_results(out, res)
    print(f"wrote {out}  ({res['total_seconds']:.1f} s)")


if __name__ == "__main__":
    main()
