"""What ComfyUI 0.33's HunyuanVideo join order costs the sparse call.

0.33 hands HunyuanVideo's joint attention over as [text, video] (0.3.75 as [video, text]);
the kernels take the video first, so the dispatcher copies q, k and v into that order and
the output back (``kernels.layout.tokens_to_front`` / ``tokens_back``, in the call's own
heads-first layout, as ``nodes.dispatch.kernel_input`` does). Per method this times the
kernel call on video-first inputs (0.3.75's order) and the same call with the copies around
it on the same tokens joined text first, on HunyuanVideo-shaped inputs stored heads first as
ComfyUI hands them (fresh gaussian values). Before timing, the two outputs must agree token
for token once put in one order (the reorder is a permutation), and hold no NaN: the outputs
are allocated from NaN-poisoned memory.

    python3 benchmarks/join_order_cost.py --out join_order_cost.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels  # noqa: E402
from benchmarks.bench_kernels import bench_ms, poison_allocator, psa_params_for_density  # noqa: E402
from kernels.layout import tokens_back, tokens_to_front  # noqa: E402

METHODS = ("sol", "psa")
PSA_TILE = (3, 8, 16)  # the shipped HunyuanVideo 720p preset's tile
# The two orders run the same kernels on the same values in the same layout, so they should
# agree exactly; a difference beyond bf16 rounding of one output means a reorder bug.
AGREEMENT = 1e-2


def joined_inputs(grid, text_tokens, heads, head_dim, *, text_first, device, dtype, seed):
    """q, k, v (1, H, L, D) as ComfyUI's HunyuanVideo hands them over (heads first): the video
    tokens and the text tokens of one draw, joined in either order (the same values)."""
    n_video = grid[0] * grid[1] * grid[2]
    g = torch.Generator(device=device).manual_seed(seed)
    tensors = []
    for _ in range(3):
        video = torch.randn(1, heads, n_video, head_dim, device=device, dtype=dtype, generator=g)
        text = torch.randn(1, heads, text_tokens, head_dim, device=device, dtype=dtype, generator=g)
        tensors.append(torch.cat((text, video) if text_first else (video, text), dim=2))
    return tensors


def method_call(method, grid, text_tokens, heads, density):
    """The kernel call of ``method`` on video-first (1, L, H, D) q, k, v; returns the output."""
    if method == "sol":
        beta = kernels.beta_for_density(density)
        return lambda q, k, v: kernels.sol_attention(q, k, v, beta=beta, grid=grid)
    params, _ = psa_params_for_density(grid, PSA_TILE, heads, density)
    return lambda q, k, v: kernels.psa_attention(q, k, v, grid=grid, params=params, tile=PSA_TILE,
                                                 extra_tokens=text_tokens)


def dispatched(call, text_first, text_tokens, n_video):
    """``call`` as the dispatcher runs it on a (1, H, L, D) join: the video moved to the front
    in that layout (copies when the text comes first), the output put back in the join's order."""
    start = text_tokens if text_first else 0

    def run(q, k, v):
        inputs = (tokens_to_front(t, start, n_video, dim=2).transpose(1, 2) for t in (q, k, v))
        return tokens_back(call(*inputs), start, n_video)
    return run


def agreement(method, grid, text_tokens, heads, head_dim, density, *, device, dtype, seed=0):
    """(largest |difference|, NaN seen) between the call on the video-first join and the call
    on the text-first join, the first put in the second's order (outputs poisoned first)."""
    n_video = grid[0] * grid[1] * grid[2]
    call = method_call(method, grid, text_tokens, heads, density)
    outputs = []
    for text_first in (False, True):
        qkv = joined_inputs(grid, text_tokens, heads, head_dim, text_first=text_first, device=device,
                            dtype=dtype, seed=seed)
        if qkv[0].is_cuda:  # NaN-filled memory for the outputs to reuse
            poison_allocator(4 * qkv[0].numel() * qkv[0].element_size())
        outputs.append(dispatched(call, text_first, text_tokens, n_video)(*qkv))
    want, got = tokens_back(outputs[0], text_tokens, n_video), outputs[1]   # video first -> text first
    nan = bool(torch.isnan(got).any() or torch.isnan(want).any())
    return float((got.float() - want.float()).abs().max()), nan


def parse_grid(text):
    """(T, H, W) from "T,H,W" of positive integers, or None."""
    try:
        grid = tuple(int(x) for x in text.split(","))
    except ValueError:
        return None
    return grid if len(grid) == 3 and min(grid) >= 1 else None


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--grid", default="33,45,80", help="video token grid T,H,W (HunyuanVideo 720p, 129 frames)")
    ap.add_argument("--text", type=int, default=256, help="text tokens")
    ap.add_argument("--heads", type=int, default=24)
    ap.add_argument("--head-dim", type=int, default=128, choices=(64, 128))
    ap.add_argument("--density", type=float, default=0.15)
    ap.add_argument("--methods", default="sol,psa", help=f"comma separated, of {', '.join(METHODS)}")
    ap.add_argument("--rep-ms", type=int, default=400)
    args = ap.parse_args(argv)
    grid = parse_grid(args.grid)
    if grid is None:
        ap.error(f"--grid: expected three positive integers T,H,W, got {args.grid!r}")
    methods = [m for m in args.methods.split(",") if m]
    if not methods or any(m not in METHODS for m in methods):
        ap.error(f"--methods: expected some of {', '.join(METHODS)}, got {args.methods!r}")
    if args.text < 1 or args.heads < 1 or args.rep_ms < 1:
        ap.error("--text, --heads and --rep-ms must be positive")
    if not 0.0 < args.density < 1.0:
        ap.error(f"--density must be strictly between 0 and 1, got {args.density}")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA device (the timing); the CPU tests check the agreement")

    n_video = grid[0] * grid[1] * grid[2]
    results = {"command": " ".join(sys.argv), "device": torch.cuda.get_device_name(),
               "grid": list(grid), "text_tokens": args.text, "heads": args.heads, "head_dim": args.head_dim,
               "density": args.density, "rows": []}
    for method in methods:
        largest, nan = agreement(method, grid, args.text, args.heads, args.head_dim, args.density,
                                 device="cuda", dtype=torch.bfloat16)
        row = {"method": method, "max_abs_difference": largest, "nan": nan}
        if largest <= AGREEMENT and not nan:
            call = method_call(method, grid, args.text, args.heads, args.density)
            joins = [joined_inputs(grid, args.text, args.heads, args.head_dim, text_first=first,
                                   device="cuda", dtype=torch.bfloat16, seed=1) for first in (False, True)]
            copies = [tokens_to_front(t, args.text, n_video, dim=2) for t in joins[1]]
            out = call(*(t.transpose(1, 2) for t in copies))
            row["video_first_ms"] = bench_ms(lambda: dispatched(call, False, args.text, n_video)(*joins[0]),
                                            args.rep_ms)
            row["text_first_ms"] = bench_ms(lambda: dispatched(call, True, args.text, n_video)(*joins[1]),
                                           args.rep_ms)
            row["copies_in_ms"] = bench_ms(lambda: [tokens_to_front(t, args.text, n_video, dim=2) for t in joins[1]],
                                          args.rep_ms)
            row["copy_out_ms"] = bench_ms(lambda: tokens_back(out, args.text, n_video), args.rep_ms)
            row["overhead"] = row["text_first_ms"] / row["video_first_ms"] - 1.0
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
        with open(args.out, "w") as f:
            json.dump(results, f, indent=1)
    return results


if __name__ == "__main__":
    main()
