"""What 8-bit P·V operands would add to the error of the exact blocks, on the CPU.

The engine's exact blocks take QKᵀ in bf16, int8 or fp8 (``precision``) and P·V always in the
input dtype. This tool measures why: sampled query rows of the video-like workload
(``benchmarks.workload``, Wan 720p grid) attend to every key in 64-key blocks, in the online
softmax the kernels run (float64 here, P relative to the running row max), with the P·V
operands of each kind below, against the same loop with exact operands. The figure is rel-L2
over all sampled rows and heads; the error bound of ``precision`` allows 0.002 added to bf16's.

- ``bf16``: P rounded to bf16, V as given (bf16): what the kernels do;
- ``int8 P, static scale``: P's codes round(127·p) (p <= 1), V's int8 codes per channel
  (scale max |v| / 127 over the head's tokens);
- ``int8 P, row scale``: P's codes per row of each block, scale max_j p / 127, V as above;
- ``int8 P, bf16 V``: P's static codes, V as given;
- ``fp8 P``: P's e4m3 codes of 448·p (the format's full range), V as given.

    python3 benchmarks/pv_code_error.py --out benchmarks/results/pv_code_error_cpu.json
"""
from __future__ import annotations

import argparse
import datetime
import math
import os
import platform
import sys

import torch

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.results_file import write_results  # noqa: E402
from benchmarks.workload import video_qkv  # noqa: E402

KEY_STEP = 64
INT8_BOUND = 127.0
FP8_BOUND = 448.0  # the largest finite e4m3
KINDS = ("bf16", "int8 P, static scale", "int8 P, row scale", "int8 P, bf16 V", "fp8 P")
INT8_V = ("int8 P, static scale", "int8 P, row scale")  # the kinds with V's int8 codes


def value_codes(v: torch.Tensor) -> torch.Tensor:
    """v (L, D) float64 after int8 codes per channel: round(v / s) · s, s = max |v| / 127."""
    scale = v.abs().amax(0).clamp_min(torch.finfo(torch.float64).tiny) / INT8_BOUND
    return torch.round(v / scale) * scale


def p_operand(p: torch.Tensor, kind: str) -> torch.Tensor:
    """P (rows, keys) float64, 0 <= p <= 1, as the P·V operand of ``kind`` (in float64)."""
    if kind == "exact":
        return p
    if kind == "bf16":
        return p.to(torch.bfloat16).double()
    if kind in ("int8 P, static scale", "int8 P, bf16 V"):
        return torch.round(p * INT8_BOUND) / INT8_BOUND
    if kind == "int8 P, row scale":
        scale = p.amax(1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny) / INT8_BOUND
        return torch.round(p / scale) * scale
    if kind == "fp8 P":
        return (p * FP8_BOUND).float().to(torch.float8_e4m3fn).double() / FP8_BOUND
    raise ValueError(f"unknown operand kind {kind!r}; choose from {', '.join(KINDS)}")


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, kind: str, scale: float) -> torch.Tensor:
    """The online softmax over ``KEY_STEP``-key blocks of q (rows, D) against k, v (L, D),
    float64, with the P·V operands of ``kind`` (or "exact")."""
    values = value_codes(v) if kind in INT8_V else v
    m = torch.full((q.shape[0],), -math.inf, dtype=torch.float64)
    l_sum = torch.zeros(q.shape[0], dtype=torch.float64)
    acc = torch.zeros(q.shape[0], v.shape[1], dtype=torch.float64)
    for start in range(0, k.shape[0], KEY_STEP):
        s = (q @ k[start:start + KEY_STEP].T) * scale
        m_new = torch.maximum(m, s.amax(1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[:, None])
        l_sum = l_sum * alpha + p.sum(1)
        acc = acc * alpha[:, None] + p_operand(p, kind) @ values[start:start + KEY_STEP]
        m = m_new
    return acc / l_sum[:, None]


def study(grid, heads: int, head_dim: int, rows: int, seed: int) -> dict:
    """rel-L2 per operand kind, over all heads, and per head."""
    q, k, v, kinds = video_qkv(grid, heads, head_dim, seed=seed)
    L = q.shape[1]
    picked = torch.randperm(L, generator=torch.Generator().manual_seed(seed))[:rows]
    scale = head_dim ** -0.5
    sq_err = {kind: 0.0 for kind in KINDS}
    sq_ref = 0.0
    per_head = []
    for h in range(heads):
        qh, kh, vh = q[0, picked, h].double(), k[0, :, h].double(), v[0, :, h].double()
        exact = attend(qh, kh, vh, "exact", scale)
        ref_norm = exact.norm().item()
        sq_ref += ref_norm ** 2
        row = dict(head=h, kind=kinds[h])
        for kind in KINDS:
            err = (attend(qh, kh, vh, kind, scale) - exact).norm().item()
            sq_err[kind] += err ** 2
            row[kind] = err / ref_norm
        per_head.append(row)
        print(f"head {h} ({kinds[h]}): " + ", ".join(f"{kind} {row[kind]:.5f}" for kind in KINDS), flush=True)
    rel = {kind: math.sqrt(sq_err[kind] / sq_ref) for kind in KINDS}
    return dict(rel_l2=rel, added_to_bf16={kind: rel[kind] - rel["bf16"] for kind in KINDS}, per_head=per_head)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="results file (JSON)")
    ap.add_argument("--grid", default="21,45,80", help="token grid T,H,W (default Wan 720p)")
    ap.add_argument("--heads", type=int, default=8, help="heads of the workload's default mix")
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rows", type=int, default=512, help="query rows sampled per head")
    ap.add_argument("--seed", type=int, default=75600)
    args = ap.parse_args(argv)
    try:
        grid = tuple(int(x) for x in args.grid.split(","))
    except ValueError:
        ap.error(f"--grid: expected T,H,W, got {args.grid!r}")
    if len(grid) != 3 or min(grid) < 1:
        ap.error(f"--grid: expected three positive integers, got {args.grid!r}")
    if args.heads < 1 or args.rows < 1 or args.head_dim < 2:
        ap.error("--heads and --rows must be at least 1, --head-dim at least 2")
    result = study(grid, args.heads, args.head_dim, min(args.rows, math.prod(grid)), args.seed)
    print("rel-L2: " + ", ".join(f"{kind} {err:.5f}" for kind, err in result["rel_l2"].items()))
    if args.out:
        write_results(args.out, dict(
            command="python3 benchmarks/pv_code_error.py " + " ".join(argv if argv is not None else sys.argv[1:]),
            started=datetime.datetime.now().isoformat(timespec="seconds"), torch=torch.__version__,
            python=platform.python_version(), grid=list(grid), heads=args.heads, head_dim=args.head_dim,
            rows=args.rows, seed=args.seed, key_step=KEY_STEP, **result))
    return result


if __name__ == "__main__":
    main()
