"""Time a shipped PSA preset layer by layer at the model's real attention shape, against
cuDNN SDPA in the same run: where an end-to-end PSA forward loses against its density.

    python benchmarks/bench_preset.py --preset wan2.1_14b_720p_81f.json --batch 2 --out results.json

Per layer: the preset's block density, the PSA call's time, and its share of the ideal
(cuDNN's time × density). The sum over layers is the forward's self-attention time that
``e2e_comfyui.py`` measures inside ComfyUI (there: forward minus the stub's forward), so the
two together separate the kernel from everything around it. Random inputs; the speed of the
kernel does not depend on the values.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels  # noqa: E402
from benchmarks.bench_kernels import bench_ms, cudnn_sdpa  # noqa: E402
from kernels.presets import load_preset  # noqa: E402
from kernels.psa_mask import psa_block_mask  # noqa: E402

PRESET_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mask_presets")


def preset_argument(ap, name: str):
    """The preset ``--preset`` names: a path, or a file of mask_presets/; a usage error if not."""
    try:
        return load_preset(name) if os.path.isfile(name) else load_preset(name, [PRESET_DIR])
    except ValueError as e:
        ap.error(f"--preset: {e}")


def summarise(rows, cudnn_ms: float) -> dict:
    """All layers together: PSA's time, the ideal (cuDNN × density per layer), the share of
    the ideal reached and the speed-up over cuDNN on every layer."""
    total = sum(r["ms"] for r in rows)
    ideal = sum(cudnn_ms * r["density"] for r in rows)
    return dict(cudnn_ms=cudnn_ms, layers=len(rows), psa_ms_sum=total, ideal_ms_sum=ideal,
                share_of_ideal=ideal / total, speedup=cudnn_ms * len(rows) / total)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--preset", required=True, help="a file of mask_presets/ (wan2.1_14b_720p_81f.json) or a path")
    ap.add_argument("--batch", type=int, default=2, help="2: CFG's conditional and unconditional halves")
    ap.add_argument("--extra-tokens", type=int, default=0, help="text tokens after the grid (HunyuanVideo: 256)")
    ap.add_argument("--heads-first", action="store_true", help="q/k/v stored (B, H, L, D), as HunyuanVideo hands them over")
    ap.add_argument("--grid", default="", help="T,H,W to time the preset's masks on instead of its own grid "
                    "(the block grid must stay the same: e.g. 21,48,80 for a 21,45,80 preset, without its padding)")
    ap.add_argument("--layers", default="", help="comma-separated layers (default: all)")
    ap.add_argument("--rep-ms", type=int, default=200)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    preset = preset_argument(ap, args.preset)
    if args.grid:
        try:
            preset = preset.params_for_grid(tuple(int(x) for x in args.grid.split(",")))
        except ValueError as e:
            ap.error(f"--grid: {e}")
    layers = [int(x) for x in args.layers.split(",") if x] or list(range(preset.num_layers))
    bad = [x for x in layers if not 0 <= x < preset.num_layers]
    if bad:
        ap.error(f"--layers: {bad} outside the preset's {preset.num_layers} layers")
    grid, tile = tuple(preset.grid), tuple(preset.tile)
    H, D = preset.num_heads, int(preset.fingerprint["head_dim"])
    L = grid[0] * grid[1] * grid[2] + args.extra_tokens
    g = torch.Generator(device="cuda").manual_seed(0)
    if args.heads_first:
        q, k, v = (torch.randn(args.batch, H, L, D, device="cuda", dtype=torch.bfloat16, generator=g).transpose(1, 2)
                   for _ in range(3))
    else:
        q, k, v = (torch.randn(args.batch, L, H, D, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
    t_dense = bench_ms(lambda: cudnn_sdpa(q, k, v), args.rep_ms)
    rows = []
    for layer in layers:
        params = preset.params_for(layer)
        density = psa_block_mask(grid, params, tile).float().mean().item()

        def call():
            return kernels.psa_attention(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=args.extra_tokens)

        out = call()
        ms = bench_ms(call, args.rep_ms)
        rows.append(dict(layer=layer, density=density, ms=ms, share_of_ideal=t_dense * density / ms,
                         finite=bool(torch.isfinite(out).all())))
        print(f"layer {layer:2d} density {density:.3f} psa {ms:7.2f} ms ({t_dense / ms:.2f}x, "
              f"{rows[-1]['share_of_ideal']:.0%} of ideal)", flush=True)
    summary = summarise(rows, t_dense)
    print(f"cuDNN {t_dense:.2f} ms per layer; {len(rows)} layers: psa {summary['psa_ms_sum']:.1f} ms, "
          f"ideal {summary['ideal_ms_sum']:.1f} ms "
          f"({summary['share_of_ideal']:.0%}), {summary['speedup']:.2f}x", flush=True)
    result = dict(command="python " + " ".join(sys.argv), started=time.strftime("%Y-%m-%d %H:%M:%S"),
                  device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                  preset=preset.name, grid=grid, tile=tile, batch=args.batch, heads=H, head_dim=D,
                  extra_tokens=args.extra_tokens, heads_first=args.heads_first, rows=rows, summary=summary)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
