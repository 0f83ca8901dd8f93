"""The search over attention calls or saved samples (spread over torch.distributed ranks when
they run), and the preset written from its table."""
from __future__ import annotations

import os

import torch

from ..preset_file import preset_from_selection, save_preset
from .accumulator import PSASearchAccumulator
from .loss_table import LossTable
from .samples import load_qkv_sample, read_sample_header


def search_calls(
    calls,
    *,
    grid,
    num_heads: int,
    tile,
    extra_tokens: int = 0,
    candidates=None,
    bucket_edges=(),
    query_tiles: int | None = 32,
    rows_per_tile: int | None = 32,
    seed: int = 0,
    device=None,
    group=None,
    progress=None,
) -> LossTable:
    """Loss table of a sequence of attention calls ``(layer, step, load)``; ``load()``
    returns the call's (q, k, v, ...) (B, L, H, D) and is called only where it is needed.

    With ``torch.distributed`` initialised, (layer, head) pairs are spread round-robin over
    the ranks of ``group``: a rank evaluates only its heads, calls ``load`` only for calls
    of layers where it owns a head (the others are counted with ``skip``), and the tables
    are summed with ``all_reduce`` on every rank (NCCL: on this rank's current GPU).
    ``progress(done, total)`` is called after every call.
    """
    import torch.distributed as dist

    calls = [(int(layer), float(step), load) for layer, step, load in calls]
    if not calls:
        raise ValueError("no calls given")
    H = int(num_heads)
    distributed = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank(group) if distributed else 0
    world = dist.get_world_size(group) if distributed else 1
    layers = sorted({layer for layer, _, _ in calls})
    pairs = [(layer, h) for layer in layers for h in range(H)]
    mine = {pair for i, pair in enumerate(pairs) if i % world == rank}
    acc = PSASearchAccumulator(
        grid, tile, H, candidates=candidates, extra_tokens=extra_tokens, bucket_edges=bucket_edges,
        query_tiles=query_tiles, rows_per_tile=rows_per_tile, seed=seed,
        owned=lambda layer, head: (layer, head) in mine, device=device,
    )
    for layer, step, _ in calls:
        acc.register(layer, step)
    for i, (layer, step, load) in enumerate(calls):
        if any((layer, h) in mine for h in range(H)):
            q, k, v = load()[:3]
            acc.add(q, k, v, layer=layer, step=step)
            del q, k, v
        else:
            acc.skip(layer, step)
        if progress is not None:
            progress(i + 1, len(calls))
    table = acc.table()
    if world > 1:
        backend = dist.get_backend(group)
        dev = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
        for name in ("sq_err", "ref_sq", "count"):
            t = getattr(table, name).to(dev)
            dist.all_reduce(t, op=dist.ReduceOp.SUM, group=group)
            setattr(table, name, t.cpu())
    table.settings["world_size"] = world
    return table


def search_samples(paths, *, tile, **options) -> LossTable:
    """Loss table of saved samples: :func:`search_calls` over the files, which must share one
    grid, extra-token count and head count; ``options`` are :func:`search_calls`' (candidates,
    bucket_edges, query_tiles, rows_per_tile, seed, device, group, progress). With
    ``torch.distributed`` initialised, heads are spread over the ranks."""
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise ValueError("no samples given")
    headers = [read_sample_header(p) for p in paths]
    grid, extra, H = headers[0]["grid"], headers[0]["extra_tokens"], headers[0]["shape"][2]
    for p, h in zip(paths, headers):
        if h["grid"] != grid or h["extra_tokens"] != extra or h["shape"][2] != H:
            raise ValueError(f"{p}: grid/extra_tokens/heads {h['grid']}/{h['extra_tokens']}/{h['shape'][2]} "
                             f"differ from the first sample's {grid}/{extra}/{H}")
    calls = [(h["layer"], h["step"], lambda p=p: load_qkv_sample(p)) for p, h in zip(paths, headers)]
    table = search_calls(calls, grid=grid, num_heads=H, tile=tile, extra_tokens=extra, **options)
    table.settings["samples"] = len(paths)
    return table


def write_preset(
    table: LossTable,
    out,
    *,
    alpha=None,
    target_sparsity=None,
    metric: str = "mse",
    name: str,
    family: str,
    model_name: str,
    fingerprint: dict,
    prompts: int = 1,
    author: str = "",
    notes: str = "",
    source: str = "searched",
):
    """Select masks from ``table`` (exactly one of ``alpha`` / ``target_sparsity``) and write
    the preset JSON to ``out`` (the CLI's ``select``); returns the :class:`kernels.preset_file.Preset`.
    ``fingerprint``: {"layers", "heads", "head_dim", "hidden_size"}."""
    s = table.select(alpha=alpha, target_sparsity=target_sparsity, metric=metric)
    preset = preset_from_selection(
        s, name=name, family=family, model_name=model_name, fingerprint=dict(fingerprint),
        grid=table.grid, tile=table.tile, candidates=table.candidates.shape[0], prompts=prompts,
        settings=table.settings, author=author, notes=notes, source=source,
    )
    save_preset(preset, out)
    return preset
