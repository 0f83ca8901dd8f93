"""How much of a dense pass a shipped PSA preset leaves the Hopper loop, counted on the CPU:
the lower bound on the end-to-end PSA forward at cuDNN's own speed.

    python benchmarks/preset_tile_work.py --preset wan2.1_14b_720p_81f.json \
        --dense-s 23.380 --stub-s 6.921 --out preset_tile_work.json

The loop's unit of work is a query tile (128 rows) against a ring step (128 key slots). Per
layer this counts the tile-steps the preset's mask costs, as the loop runs it (a block's query
tiles: ``block_mask.work_order``; a key block's steps: ``hopper_loop.key_steps``, with the
720p edge cover), over the tiles of a dense pass over the same tokens, (L / 128)². Given a
dense forward and the forward without self-attention (``e2e_comfyui.py``'s "dense" and
"stub"), it prints the forward that attention at cuDNN's per-tile rate on exactly those
tile-steps gives: stub + tile density × (dense − stub).
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.bench_preset import preset_argument  # noqa: E402
from kernels.block_mask import block_layout  # noqa: E402
from kernels.hopper_loop import ROWS, key_steps  # noqa: E402
from kernels.psa_mask import psa_kernel_mask  # noqa: E402
from kernels.tile_loop import tma_sub_frames  # noqa: E402

QUERY_TILE = 2 * ROWS.value  # PSA's 128-row query tiles (both consumer warpgroups)


def tile_density(visited: torch.Tensor, layout, sub_frames: int) -> float:
    """Tile-steps of the bool (H, n_blocks, n_blocks) visited pairs over a dense pass's (L/128)²."""
    query_tiles = -(-layout.lengths.long().cpu() // QUERY_TILE)
    steps = key_steps(layout, sub_frames)
    work = (query_tiles[None, :, None] * visited.long() * steps[None, None, :]).sum().item()
    return work / visited.shape[0] / (layout.n_tokens / QUERY_TILE) ** 2


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", required=True, help="a file of mask_presets/ (wan2.1_14b_720p_81f.json) or a path")
    ap.add_argument("--extra-tokens", type=int, default=0, help="text tokens after the grid (HunyuanVideo: 256)")
    ap.add_argument("--dense-s", type=float, help="measured dense forward, seconds")
    ap.add_argument("--stub-s", type=float, help="measured forward without self-attention, seconds")
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    preset = preset_argument(ap, args.preset)
    if args.extra_tokens < 0:
        ap.error(f"--extra-tokens must be >= 0, got {args.extra_tokens}")
    if (args.dense_s is None) != (args.stub_s is None):
        ap.error("--dense-s and --stub-s go together")
    if args.dense_s is not None and not 0 < args.stub_s < args.dense_s:
        ap.error(f"need 0 < --stub-s < --dense-s, got {args.stub_s} and {args.dense_s}")
    grid, tile = tuple(preset.grid), tuple(preset.tile)
    layout = block_layout(grid, tile, args.extra_tokens)
    sub_frames = tma_sub_frames(tile)
    if sub_frames is None or sub_frames * tile[1] * tile[2] != QUERY_TILE:
        ap.error(f"--preset: tile {tile} has no 128-key TMA box; the Hopper loop does not run it")
    rows = []
    for layer in range(preset.num_layers):
        mask = psa_kernel_mask(grid, preset.params_for(layer), tile, args.extra_tokens)
        visited = mask.to_dense()[0]
        rows.append(dict(layer=layer, block_density=visited.float().mean().item(),
                         tile_density=tile_density(visited, layout, sub_frames)))
    mean = {key: sum(r[key] for r in rows) / len(rows) for key in ("block_density", "tile_density")}
    result = dict(command="python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
                  preset=preset.name, grid=grid, tile=tile, extra_tokens=args.extra_tokens, rows=rows, **mean)
    print(f"{preset.name}: block density {mean['block_density']:.4f}, tile density {mean['tile_density']:.4f}")
    if args.dense_s is not None:
        attention = mean["tile_density"] * (args.dense_s - args.stub_s)
        result.update(dense_s=args.dense_s, stub_s=args.stub_s, attention_at_cudnn_rate_s=attention,
                      forward_at_cudnn_rate_s=args.stub_s + attention,
                      speedup_at_cudnn_rate=args.dense_s / (args.stub_s + attention))
        print(f"at cuDNN's per-tile rate: attention {attention:.3f} s, forward {args.stub_s + attention:.3f} s, "
              f"{result['speedup_at_cudnn_rate']:.3f}x", flush=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
