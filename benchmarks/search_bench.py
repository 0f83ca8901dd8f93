"""PSA-Search over several GPUs on the synthetic workload: time of a full offline search.

The offline search spreads (layer, head) work over GPUs with torch.distributed; its
target: a full search for the Wan2.1-14B architecture at 720p (40 layers x 40 heads, ~100
candidates, one step bucket) in <= 20 minutes on two H200s. No model weights exist here, so
each layer's q/k/v come from ``benchmarks.workload.video_qkv`` (seed ``--seed + layer``),
made on the GPU of every rank that owns a head of that layer and fed straight into
``kernels.psa_search.search_calls`` (the same distributed core as ``python -m
kernels.psa_search search``: round-robin (layer, head) pairs, all_reduce of the tables).
Saving the 40 layers instead would take ~93 GB. Generation is part of the timed search and
is reported on its own as well.

    torchrun --nproc_per_node 2 benchmarks/search_bench.py --out $OUT/psa_search_h200x2.json

CPU smoke run (gloo, tiny shapes):

    python -m torch.distributed.run --nproc_per_node 2 benchmarks/search_bench.py \\
        --layers 2 --heads 4 --head-dim 16 --grid 4 8 8 --tile 2 4 4 --max-candidates 16 \\
        --out /tmp/psa_search_cpu.json

Rank 0 writes ``--out`` (JSON, rewritten after every layer, so a run cut off still leaves
data), the loss table ``<out stem>.table.safetensors`` and a preset selected at
``--target-sparsity`` ``<out stem>.preset.json`` (``kernels.psa_search.write_preset``,
marked as made on the synthetic workload, not the real model).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import sys
import time

import torch
import torch.distributed as dist

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks.results_file import write_results  # noqa: E402
from benchmarks.workload import DEFAULT_MIX, video_qkv  # noqa: E402
from kernels.layout import tile_layout  # noqa: E402
from kernels.psa_search import candidate_space  # noqa: E402
from kernels.psa_search.cli import init_distributed_from_env  # noqa: E402
from kernels.psa_search.search import search_calls, write_preset  # noqa: E402

TARGET_SECONDS = 20 * 60
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="result JSON (rank 0); table and preset are written next to it")
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--grid", type=int, nargs=3, default=[21, 45, 80], metavar=("T", "H", "W"))
    ap.add_argument("--tile", type=int, nargs=3, default=[3, 8, 16], metavar=("BT", "BH", "BW"))
    ap.add_argument("--max-candidates", type=int, default=100)
    ap.add_argument("--query-tiles", type=int, default=0, help="query blocks sampled per call (0: all)")
    ap.add_argument("--rows-per-tile", type=int, default=32, help="query rows sampled per block (0: all)")
    ap.add_argument("--seed", type=int, default=0, help="search seed; layer l's q/k/v use seed + l")
    ap.add_argument("--dtype", default="bf16", choices=sorted(DTYPES))
    ap.add_argument("--device", default=None, help="default: cuda:LOCAL_RANK when CUDA is available, else cpu")
    ap.add_argument("--metric", default="mse", choices=["mse", "rel"])
    ap.add_argument("--alphas", type=float, nargs="*", default=[0.003, 0.01, 0.03],
                    help="loss budgets whose selections are summarised")
    ap.add_argument("--target-sparsity", type=float, default=0.6, help="selection written as the preset")
    ap.add_argument("--family", default="wan")
    ap.add_argument("--model-name", default="Wan2.1-T2V-14B")
    ap.add_argument("--target-seconds", type=float, default=TARGET_SECONDS)
    return ap.parse_args(argv)


def command_line(argv):
    """The command as launched (torchrun sets LOCAL_WORLD_SIZE and TORCHELASTIC_RUN_ID)."""
    args = " ".join(argv)
    if "TORCHELASTIC_RUN_ID" in os.environ:
        return f"torchrun --nproc_per_node {os.environ.get('LOCAL_WORLD_SIZE', '?')} {args}"
    return f"python {args}"


def versions():
    out = {"python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda}
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:  # noqa: BLE001 - recorded, not needed on the CPU
        out["triton"] = None
    return out


def write_json(path, doc):
    write_results(path, doc)


def target_applies(args, world, cuda):
    """The target is for these settings only (anything else: ``met`` stays null)."""
    return (args.layers, args.heads, args.head_dim, tuple(args.grid), tuple(args.tile), world, cuda) == \
        (40, 40, 128, (21, 45, 80), (3, 8, 16), 2, True) and args.max_candidates >= 100


def main(argv=None) -> int:
    t_main = time.perf_counter()
    args = parse_args(argv)
    started = init_distributed_from_env()
    distributed = dist.is_initialized()
    rank = dist.get_rank() if distributed else 0
    world = dist.get_world_size() if distributed else 1
    backend = dist.get_backend() if distributed else None
    if args.device is not None:
        device = torch.device(args.device)
    elif torch.cuda.is_available():
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    cuda = device.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(device)

    def barrier():
        if distributed:
            dist.barrier()

    def say(msg):
        print(f"[rank {rank}/{world}] {msg}", flush=True)

    grid, tile = tuple(args.grid), tuple(args.tile)
    dtype = DTYPES[args.dtype]
    query_tiles, rows_per_tile = args.query_tiles or None, args.rows_per_tile or None
    layers = list(range(args.layers))
    lay = tile_layout(grid, tile)
    out = os.path.abspath(args.out)
    stem = out[:-5] if out.endswith(".json") else out
    table_path, preset_path = f"{stem}.table.safetensors", f"{stem}.preset.json"
    if rank == 0:
        os.makedirs(os.path.dirname(out), exist_ok=True)

    doc = {
        "benchmark": "PSA-Search, (layer, head) pairs spread over processes",
        "status": "running",
        "command": command_line(sys.argv),
        "argv": sys.argv,
        "workload": "synthetic: benchmarks/workload.py video_qkv (default head mix), generated per layer on "
                    "each rank's device; NOT model weights, NOT a real video",
        "settings": {
            "grid": list(grid), "tile": list(tile), "block_grid": [int(x) for x in lay.block_grid],
            "tokens": int(lay.n_tokens), "padded_tokens": int(lay.n_blocks * lay.block_tokens),
            "layers": args.layers, "heads": args.heads, "head_dim": args.head_dim, "dtype": str(dtype),
            "max_candidates": args.max_candidates, "candidates": None, "step_buckets": 1, "bucket_edges": [],
            "query_tiles": query_tiles, "rows_per_tile": rows_per_tile, "query_rows_per_head": None,
            "seed": args.seed, "layer_seed": "seed + layer", "head_kinds": [DEFAULT_MIX[h % len(DEFAULT_MIX)]
                                                                          for h in range(args.heads)],
            "metric": args.metric,
        },
        "environment": {"world_size": world, "backend": backend, "device": str(device), **versions(),
                        "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
                        "torch_threads": torch.get_num_threads()},
        "target": {"seconds": args.target_seconds, "met": None, "applies": target_applies(args, world, cuda),
                   "text": "full search, Wan2.1-14B architecture at 720p (40 layers x 40 heads, head_dim 128, "
                           "grid 21x45x80, tile 3x8x16, ~100 candidates, one step bucket), <= 20 min on two "
                           "H200s; met is null for other settings"},
        "progress": {},
        "timing": {},
        "files": {"table": os.path.basename(table_path), "preset": os.path.basename(preset_path)},
    }
    say(f"device {device}, backend {backend}, grid {grid}, tile {tile}, {args.layers} layers x {args.heads} heads")

    gen_s, layer_s, checks = {}, [], []
    clock = {}

    def load_layer(layer):
        def load():
            sync()
            t = time.perf_counter()
            q, k, v, _ = video_qkv(grid, args.heads, args.head_dim, seed=args.seed + layer, device=device,
                                   dtype=dtype)
            # exact checksum of the bits: every rank must have made the same tensors
            checks.append(torch.stack([x.contiguous().view(torch.int16 if x.element_size() == 2 else torch.int32)
                                       .sum(dtype=torch.int64) for x in (q, k, v)]))
            sync()
            gen_s[layer] = time.perf_counter() - t
            return q, k, v
        return load

    def progress(done, total):
        sync()
        now = time.perf_counter()
        layer = calls[done - 1][0]
        prev = clock["last"]
        clock["last"] = now
        g = gen_s.get(layer, 0.0)
        layer_s.append({"layer": layer, "seconds": now - prev, "generation_s": g, "evaluation_s": now - prev - g})
        elapsed = now - clock["t0"]
        say(f"layer {layer} ({done}/{total}): {now - prev:.2f} s (generation {g:.2f} s), elapsed {elapsed:.1f} s, "
            f"projected {elapsed / done * total:.1f} s")
        if rank == 0:
            doc["progress"] = {"calls_done": done, "calls": total, "elapsed_s": elapsed,
                               "projected_total_s": elapsed / done * total, "rank0_layers": layer_s}
            write_json(out, doc)

    # ------------------------------------------------------------------ the timed search
    sync()
    barrier()
    t0 = time.perf_counter()
    clock["t0"] = clock["last"] = t0
    cands = candidate_space(grid, tile, max_candidates=args.max_candidates, seed=args.seed)
    clock["candidates"] = clock["last"] = time.perf_counter()
    calls = [(layer, 0.0, load_layer(layer)) for layer in layers]
    table = search_calls(
        calls, grid=grid, num_heads=args.heads, tile=tile, candidates=cands, query_tiles=query_tiles,
        rows_per_tile=rows_per_tile, seed=args.seed, device=device, progress=progress,
    )
    sync()
    t_search = time.perf_counter()
    barrier()
    t_end = time.perf_counter()

    mine = {
        "rank": rank,
        "device_name": torch.cuda.get_device_name(device) if cuda else "cpu",
        "total_s": t_end - t0,
        "since_main_s": t_end - t_main,
        "search_s": t_search - t0,
        "generation_s": sum(gen_s.values()),
        "evaluation_s": sum(x["evaluation_s"] for x in layer_s),
        "candidate_space_s": clock["candidates"] - t0,
        "reduce_s": t_search - clock["last"],
        "layers_generated": len(gen_s),
        "max_memory_gb": torch.cuda.max_memory_allocated(device) / 1e9 if cuda else None,
        "checksums": torch.stack(checks).cpu().tolist() if checks else [],
    }
    ranks = [None] * world
    if distributed:
        dist.all_gather_object(ranks, mine)
    else:
        ranks = [mine]

    if rank == 0:
        total = max(r["total_s"] for r in ranks)
        table.settings.update({"workload": "synthetic (benchmarks/workload.py video_qkv)", "layer_seed": "seed + layer",
                               "seconds": total})
        table.save(table_path)
        sel = {}
        for a in args.alphas:
            s = table.select(alpha=a, metric=args.metric)
            sel[f"alpha={a:g}"] = {"mean_sparsity": s.mean_sparsity, "mean_loss": float(s.loss.mean()),
                                   "heads_within_budget": int((s.loss <= a).sum())}
        s = table.select(target_sparsity=args.target_sparsity, metric=args.metric)
        sel[f"target_sparsity={args.target_sparsity:g}"] = {
            "mean_sparsity": s.mean_sparsity, "mean_loss": float(s.loss.mean()),
            "heads_reaching_target": int((s.sparsity >= args.target_sparsity - 1e-12).sum())}
        name = re.sub(r"[^A-Za-z0-9._-]", "_", os.path.basename(stem))[:54] + "_synthetic"
        fp = {"layers": args.layers, "heads": args.heads, "head_dim": args.head_dim,
              "hidden_size": args.heads * args.head_dim}
        preset = write_preset(
            table, preset_path, target_sparsity=args.target_sparsity, metric=args.metric, name=name,
            family=args.family, model_name=args.model_name, fingerprint=fp, prompts=0, source="geometry",
            author="sparse-video-attention (benchmarks/search_bench.py)",
            notes="SYNTHETIC WORKLOAD, NOT SEARCHED ON THE REAL MODEL (no weights were available). "
                  f"PSA-Search timing benchmark: q/k/v of every layer from benchmarks/workload.py video_qkv "
                  f"(grid {list(grid)}, {args.heads} heads, head_dim {args.head_dim}, seed {args.seed} + layer), "
                  f"{table.candidates.shape[0]} candidates, all keys; per head the lowest-{args.metric} "
                  f"candidate with sparsity >= {args.target_sparsity}. Losses are on synthetic data.",
        )
        same = all(r["checksums"] == ranks[0]["checksums"] for r in ranks)
        doc["status"] = "done"
        doc["settings"]["candidates"] = int(table.candidates.shape[0])
        doc["settings"]["query_rows_per_head"] = int(table.count[0, 0, 0]) // args.head_dim
        doc["environment"]["devices"] = [r["device_name"] for r in ranks]
        doc["timing"] = {
            "total_wall_s": total,
            "generation_s_per_rank": [r["generation_s"] for r in ranks],
            "evaluation_s_per_rank": [r["evaluation_s"] for r in ranks],
            "reduce_s_per_rank": [r["reduce_s"] for r in ranks],
            "note": "total_wall_s: the slowest rank's total_s. Per rank: total_s = from a barrier before "
                    "candidate_space to a barrier after search_calls = candidate_space_s + generation_s + "
                    "evaluation_s + reduce_s + the final barrier; generation = video_qkv (+ a checksum) per "
                    "layer, CUDA-synchronised; evaluation = the rest of each layer's time (PSASearchAccumulator.add; "
                    "the first layer's also holds the accumulator's set-up); reduce = from the last layer to the "
                    "end of search_calls (waiting for the other ranks, all_reduce); since_main_s adds argument "
                    "parsing and process-group set-up (not interpreter start or imports)",
            "per_rank": [{k: v for k, v in r.items() if k != "checksums"} for r in ranks],
        }
        doc["target"]["met"] = bool(total <= args.target_seconds) if doc["target"]["applies"] else None
        doc["checks"] = {"generation_identical_across_ranks": same,
                         "evaluated_heads": int((~torch.isnan(table.loss()).all(-1)).sum()),
                         "expected_heads": args.layers * args.heads}
        doc["table"] = {"summary": table.summary(), "selections": sel}
        doc["preset"] = {"name": preset.name, "source": preset.source, "sparsity": preset.stats["sparsity"],
                         "mean_loss": preset.stats["mean_loss"]}
        write_json(out, doc)
        verdict = {True: "met", False: "NOT met", None: "not applicable to these settings"}[doc["target"]["met"]]
        say(f"done: {total:.1f} s total (target {args.target_seconds:.0f} s: {verdict}); "
            f"wrote {out}, {table_path}, {preset_path}")
        say(json.dumps(doc["table"]["selections"]))
    if started:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
