"""The command line of the PSA search: ``python -m kernels.psa_search search|show|select``,
and the torch.distributed set-up of a torchrun launch."""
from __future__ import annotations

import argparse
import math
import os
import sys

import torch

from .._checks import check_int, shown
from .._files import check_output_path
from ..layout import check_tile
from ..preset_file import check_bucket_edges, json_loads
from ..psa_mask import format_params
from .candidates import candidate_space
from .loss_table import LossTable, MAX_SAMPLED
from .samples import read_sample_header
from .search import search_samples, write_preset


def init_distributed_from_env() -> bool:
    """Start torch.distributed when torchrun started this process (WORLD_SIZE > 1); True if
    started here (the caller then destroys the group)."""
    import torch.distributed as dist

    if int(os.environ.get("WORLD_SIZE", "1")) > 1 and not dist.is_initialized():
        backend = "nccl" if torch.cuda.is_available() else "gloo"
        if backend == "nccl":  # one GPU per process, bound to the group (barriers know it)
            device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(device)
            dist.init_process_group(backend, device_id=device)
        else:
            dist.init_process_group(backend)
        return True
    return False


PROG = "python -m kernels.psa_search"
_EXAMPLES = {
    None: """examples:
  python -m kernels.psa_search search samples/ --tile 3 8 16 --out wan14b_720p.safetensors
  torchrun --nproc_per_node 2 -m kernels.psa_search search samples/ --tile 3 8 16 --out wan14b_720p.safetensors
  python -m kernels.psa_search show wan14b_720p.safetensors --sparsity 0.6
  python -m kernels.psa_search select wan14b_720p.safetensors --alpha 0.007 --out wan14b_720p.json \\
      --name wan14b_720p --family wan --model-name Wan2.1-T2V-14B --fingerprint 40 40 128 5120

Step by step: docs/PRESETS.md.""",
    "search": """examples:
  python -m kernels.psa_search search samples/ --tile 3 8 16 --out wan14b_720p.safetensors
  python -m kernels.psa_search search samples/ --tile 3 8 16 --out t.safetensors --bucket-edges 0.5 --query-tiles 0
  torchrun --nproc_per_node 2 -m kernels.psa_search search samples/ --tile 3 8 16 --out t.safetensors""",
    "select": """examples:
  python -m kernels.psa_search select t.safetensors --alpha 0.007 --out wan14b_720p.json --name wan14b_720p \\
      --family wan --model-name Wan2.1-T2V-14B --fingerprint 40 40 128 5120 --prompts 2
  python -m kernels.psa_search select t.safetensors --sparsity 0.6 --metric rel --out hy.json --name hy_720p \\
      --family hunyuan_video --model-name HunyuanVideo --fingerprint 60 24 128 3072""",
    "show": """examples:
  python -m kernels.psa_search show t.safetensors
  python -m kernels.psa_search show t.safetensors --alpha 0.007 --metric mse""",
}


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Every option's default after its help (required ones have none; a help that states
    its default itself is left alone), the examples epilog as written."""

    def _get_help_string(self, action):
        if action.required or action.default is None or "default" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def _arg_type(convert, what):
    """An argparse type: ``convert`` of text written with ASCII characters only (Python's int()
    and float() also read other scripts' digits, "１" is 1), a finite result, else the error
    argparse reports for the option."""
    def parse(text):
        try:
            value = convert(text) if text.isascii() else None
        except ValueError:
            value = None
        if value is None or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"expected {what} written with the digits 0-9, got {shown(text)}")
        return value

    parse.__name__ = what
    return parse


_INT, _FLOAT = _arg_type(int, "an integer"), _arg_type(float, "a number")


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog=PROG, formatter_class=_HelpFormatter, epilog=_EXAMPLES[None],
        description="PSA-Search from saved q/k/v samples (run under torchrun to spread heads over processes).",
    )
    sub = ap.add_subparsers(dest="cmd", required=True, metavar="{search,select,show}")

    def command(name, help):
        return sub.add_parser(name, help=help, description=help[0].upper() + help[1:] + ".",
                              formatter_class=_HelpFormatter, epilog=_EXAMPLES[name])

    s = command("search", "evaluate every candidate on the samples, write a loss table")
    s.add_argument("samples", nargs="+", help="sample files (.safetensors) or folders holding them")
    s.add_argument("--tile", type=_INT, nargs=3, required=True, metavar=("BT", "BH", "BW"),
                   help="PSA tile in tokens (frames, rows, columns); required")
    s.add_argument("--out", required=True, help="loss table to write (.safetensors); required")
    s.add_argument("--max-candidates", type=_INT, default=128, help="candidate masks per head")
    s.add_argument("--candidates-json", default=None,
                   help="JSON list of extra [Tw,To,Ts,Sw,So,Ss] rows to add (default: none)")
    s.add_argument("--query-tiles", type=_INT, default=32, help="query blocks sampled per call (0: all)")
    s.add_argument("--rows-per-tile", type=_INT, default=32, help="query rows sampled per block (0: all)")
    s.add_argument("--bucket-edges", type=_FLOAT, nargs="*", default=[],
                   help="step bucket edges, ascending progress values in (0, 1) (default: none, one bucket)")
    s.add_argument("--seed", type=_INT, default=0, help="seed of the candidate and row sampling")
    s.add_argument("--device", default=None,
                   help="torch device of the evaluation, e.g. cpu or cuda:1 (default: the current CUDA "
                        "device when there is one, else the CPU)")
    sel = command("select", "pick masks from a loss table and write a preset")
    sel.add_argument("table", help="loss table written by the search (.safetensors)")
    g = sel.add_mutually_exclusive_group(required=True)
    g.add_argument("--alpha", type=_FLOAT, help="loss budget: per head the sparsest mask with loss <= alpha "
                                                "(this or --sparsity is required)")
    g.add_argument("--sparsity", type=_FLOAT, help="target sparsity in [0, 1]: per head the lowest-loss mask "
                                                   "at least this sparse (this or --alpha is required)")
    sel.add_argument("--metric", default="mse", choices=["mse", "rel"],
                     help="loss: mse (mean squared error) or rel (relative to the dense output's energy)")
    sel.add_argument("--out", required=True, help="preset to write (.json); required")
    sel.add_argument("--name", required=True, help="preset name, [A-Za-z0-9._-], 1-64 characters; required")
    sel.add_argument("--family", required=True,
                     help="model family, as the nodes name it (wan, hunyuan_video, ltxv, ltx2); required")
    sel.add_argument("--model-name", required=True, help="model name stored in the preset; required")
    sel.add_argument("--fingerprint", type=_INT, nargs=4, required=True,
                     metavar=("LAYERS", "HEADS", "HEAD_DIM", "HIDDEN"),
                     help="the model's layers, heads, head dim and hidden size; required")
    sel.add_argument("--prompts", type=_INT, default=1, help="prompts the table was searched on")
    sel.add_argument("--author", default="", help="author stored in the preset (default: empty)")
    sel.add_argument("--notes", default="", help="free text stored in the preset (default: empty)")
    show = command("show", "summarise a loss table, optionally with a selection")
    show.add_argument("table", help="loss table written by the search (.safetensors)")
    show.add_argument("--alpha", type=_FLOAT, default=None, help="also show the selection for this loss budget "
                                                                 "(default: none)")
    show.add_argument("--sparsity", type=_FLOAT, default=None, help="also show the selection for this target "
                                                                    "sparsity (default: none)")
    show.add_argument("--metric", default="mse", choices=["mse", "rel"], help="loss of the selection")
    return ap


def _sample_paths(items) -> list:
    paths = []
    for p in items:
        if os.path.isdir(p):
            found = sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith(".safetensors"))
            if not found:
                raise ValueError(f"{p}: the folder holds no .safetensors sample files")
            paths += found
        elif not os.path.exists(p):
            raise ValueError(f"{p}: no such file or folder")
        else:
            paths.append(p)
    return paths


def _device(text):
    if text is None:
        return f"cuda:{torch.cuda.current_device()}" if torch.cuda.is_available() else None
    try:
        dev = torch.device(text)
    except RuntimeError:
        raise ValueError(f"--device: {shown(text)} is not a torch device (e.g. cpu, cuda, cuda:1)") from None
    if dev.type not in ("cpu", "cuda"):  # e.g. meta holds no values to evaluate
        raise ValueError(f"--device: {shown(text)}: the search computes on cpu or cuda devices only")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device: {shown(text)}: CUDA is not available here")
    if dev.type == "cuda" and dev.index is not None and dev.index >= torch.cuda.device_count():
        raise ValueError(f"--device: {shown(text)}: this machine has {torch.cuda.device_count()} CUDA devices")
    return str(dev)


def _search(args) -> int:
    import time

    import torch.distributed as dist

    out = check_output_path(args.out, "--out")  # before the search, not after it
    paths = _sample_paths(args.samples)
    tile = check_tile(args.tile, "--tile")
    for name, value, lo, hi in (("--max-candidates", args.max_candidates, 1, None),
                                ("--query-tiles", args.query_tiles, 0, MAX_SAMPLED),
                                ("--rows-per-tile", args.rows_per_tile, 0, MAX_SAMPLED),
                                ("--seed", args.seed, 0, None)):
        check_int(value, name, lo, hi)
    edges = check_bucket_edges(args.bucket_edges, "--bucket-edges")
    device = _device(args.device)
    h0 = read_sample_header(paths[0])
    extra = json_loads(args.candidates_json, "--candidates-json") if args.candidates_json else ()
    try:
        cands = candidate_space(h0["grid"], tile, max_candidates=args.max_candidates, seed=args.seed, extra=extra)
    except ValueError as e:
        raise ValueError(f"--tile / --candidates-json: {e}") from None
    started = init_distributed_from_env()
    try:
        rank = dist.get_rank() if dist.is_initialized() else 0
        t0 = time.time()
        table = search_samples(
            paths, tile=tile, candidates=cands, bucket_edges=edges,
            query_tiles=args.query_tiles or None, rows_per_tile=args.rows_per_tile or None,
            seed=args.seed, device=device,
        )
        table.settings["seconds"] = time.time() - t0
        if rank == 0:
            table.save(out)
            print(table.summary())
            print(f"wrote {out} in {table.settings['seconds']:.1f} s")
    finally:
        if started:
            dist.destroy_process_group()
    return 0


def _show(args) -> int:
    table = LossTable.load(args.table)
    print(table.summary())
    if args.alpha is not None or args.sparsity is not None:
        s = table.select(alpha=args.alpha, target_sparsity=args.sparsity, metric=args.metric)
        print(f"selection {s.rule}: mean sparsity {s.mean_sparsity:.3f}")
        for bi in range(s.params.shape[0]):
            for li, layer in enumerate(s.layers):
                picks = ", ".join(format_params(r) for r in s.params[bi, li])
                print(f"  bucket {bi} layer {layer}: {picks}")
    return 0


def _select(args) -> int:
    check_output_path(args.out, "--out")
    table = LossTable.load(args.table)
    L, Hn, Dh, hidden = args.fingerprint
    preset = write_preset(
        table, args.out, alpha=args.alpha, target_sparsity=args.sparsity, metric=args.metric, name=args.name,
        family=args.family, model_name=args.model_name,
        fingerprint={"layers": L, "heads": Hn, "head_dim": Dh, "hidden_size": hidden},
        prompts=args.prompts, author=args.author, notes=args.notes,
    )
    print(f"wrote {args.out}: sparsity {preset.stats['sparsity']:.3f}")
    return 0


def main(argv=None) -> int:
    """The command line; returns the exit status (2 with a one-line error on bad input)."""
    args = _parser().parse_args(argv)
    try:
        return {"search": _search, "show": _show, "select": _select}[args.cmd](args)
    except (ValueError, OSError) as e:
        print(f"{PROG}: error: {' '.join(str(e).split())}"[:2000], file=sys.stderr)
        return 2

