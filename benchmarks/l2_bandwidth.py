"""The rate at which this GPU moves K/V-sized tiles from L2 into shared memory through TMA
boxes, with no attention around them: the ceiling of a block loop that is bound by its key
loads (Sol's 64-row work items on routed lists, benchmarks/NOTES.md #28).

    python benchmarks/l2_bandwidth.py --out l2_bandwidth.json

Each program streams ``--steps`` tiles of 64 rows × 128 bf16 columns (16 KB, one K or V tile
of a 64-token block) from a table of ``--megabytes``, through a pipelined TMA load, and sums
them so that nothing is optimised away. Two orders:
- "shared": every program reads the same sequence of tiles, as a full mask's work items do;
- "random": each program reads its own random tiles, as routed lists on random inputs do.

Working sets that fit in L2 and ones that do not separate the L2 rate from HBM's. The sums
are checked against torch's before any timing.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

TILE_ROWS, TILE_COLS = 64, 128  # one K (or V) tile of a 64-token block at d 128


@triton.jit
def _stream_tiles(table, order, sums, n_steps, ROWS: tl.constexpr, COLS: tl.constexpr, STAGES: tl.constexpr):
    pid = tl.program_id(0)
    acc = tl.zeros([ROWS, COLS], tl.float32)
    for i in tl.range(n_steps, num_stages=STAGES):
        tile = tl.load(order + pid.to(tl.int64) * n_steps + i)
        acc += table.load([tile * ROWS, 0]).to(tl.float32)
    tl.store(sums + pid, tl.sum(acc))


def tile_orders(n_tiles: int, programs: int, steps: int, kind: str, generator: torch.Generator) -> torch.Tensor:
    """int32 (programs, steps): the tiles each program reads."""
    if kind == "shared":
        return (torch.arange(steps) % n_tiles).to(torch.int32).repeat(programs, 1)
    if kind == "random":
        return torch.randint(0, n_tiles, (programs, steps), generator=generator, dtype=torch.int32)
    raise ValueError(f"order must be 'shared' or 'random', got {kind!r}")


def stream(table: torch.Tensor, order: torch.Tensor, stages: int = 3) -> torch.Tensor:
    """Per program, the float32 sum of the tiles of ``order`` (programs, steps) of ``table``
    (tiles · 64, 128)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    programs, steps = order.shape
    sums = torch.empty(programs, dtype=torch.float32, device=table.device)
    desc = TensorDescriptor.from_tensor(table, [TILE_ROWS, TILE_COLS])
    _stream_tiles[(programs,)](desc, order, sums, steps, ROWS=TILE_ROWS, COLS=TILE_COLS, STAGES=stages)
    return sums


def reference_sums(table: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    per_tile = table.float().reshape(-1, TILE_ROWS * TILE_COLS).sum(-1)
    return per_tile[order.long()].sum(-1)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--megabytes", default="16,38,80,1024", help="table sizes, comma separated")
    ap.add_argument("--orders", default="shared,random")
    ap.add_argument("--steps", type=int, default=512, help="tiles per program")
    ap.add_argument("--waves", type=int, default=8, help="programs per SM")
    ap.add_argument("--rep-ms", type=int, default=200)
    ap.add_argument("--out", required=True)
    args = ap.parse_args(argv)
    try:
        sizes = [float(x) for x in args.megabytes.split(",") if x]
    except ValueError:
        ap.error(f"--megabytes: numbers, comma separated, got {args.megabytes!r}")
    orders = [x for x in args.orders.split(",") if x]
    bad = [x for x in orders if x not in ("shared", "random")]
    if bad or not orders:
        ap.error(f"--orders: 'shared' and/or 'random', got {args.orders!r}")
    if not sizes or min(sizes) < 1 or args.steps < 1 or args.waves < 1:
        ap.error("--megabytes (each >= 1), --steps and --waves must be positive")
    if not torch.cuda.is_available():
        ap.error("needs a CUDA GPU")
    from benchmarks.bench_kernels import bench_ms

    dev = torch.device("cuda")
    programs = torch.cuda.get_device_properties(dev).multi_processor_count * args.waves
    g = torch.Generator().manual_seed(0)
    tile_bytes = TILE_ROWS * TILE_COLS * 2
    rows = []
    for mb in sizes:
        n_tiles = max(1, int(mb * 2**20 // tile_bytes))
        table = torch.randn(n_tiles * TILE_ROWS, TILE_COLS, device=dev, dtype=torch.bfloat16)
        for kind in orders:
            order = tile_orders(n_tiles, programs, args.steps, kind, g).to(dev)
            got, want = stream(table, order), reference_sums(table, order)
            torch.testing.assert_close(got, want, rtol=1e-3, atol=1e-2)
            ms = bench_ms(lambda: stream(table, order), args.rep_ms)
            tb_s = programs * args.steps * tile_bytes / (ms * 1e-3) / 1e12
            rows.append(dict(megabytes=mb, order=kind, programs=programs, steps=args.steps, ms=ms, tb_per_s=tb_s))
            print(f"{mb:7.0f} MB {kind:6s}: {ms:8.3f} ms, {tb_s:5.2f} TB/s", flush=True)
    result = dict(command="python " + " ".join([sys.argv[0], *(argv if argv is not None else sys.argv[1:])]),
                  device=torch.cuda.get_device_name(dev), torch=torch.__version__, triton=triton.__version__,
                  tile=[TILE_ROWS, TILE_COLS], rows=rows)
    with open(args.out, "w") as f:
        json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
