"""Build, check and time the sparse attention kernels against cuDNN SDPA in one GPU job.

Usage (on a CUDA machine; writes one JSON file with the command that made it):
    python benchmarks/bench_kernels.py --out out/kernels_h200.json

``--loops ws,tma`` times the block loops of Hopper side by side (``LOOPS``: the warp-specialised
loop and the portable kernel with TMA boxes); ``--loops sm89,sm89/num_stages=4`` a forced
launch row beside itself with settings changed (``LOOP_SETTINGS``). A forced pre-Hopper row
is compiled for this GPU: on Hopper its dots are ``wgmma`` unless the process runs with
``DISABLE_MMA_V3=1`` (recorded in the file), which gives the row's own ``mma.sync`` (and turns
the ``tma`` loop's to ``mma.sync`` too; the ``ws`` loop keeps its ``wgmma``). Its Triton
launches run with the shared memory an SM of the row's GPU holds (``sm_shared_memory``: 100 KB
on RTX 30/40/50, 164 KB on the A100), so as many programs share an SM as there; each row
records the bytes it emulated (``sm89/shared_memory_per_sm=233472`` times the row with an
H100's SM).
``--precisions bf16,int8,fp8`` times every Sol, PSA and forced-architecture row once per
precision of the exact blocks' QKᵀ (``precision`` of the kernels: on a ``ws`` row PSA's quantized calls run the Hopper loop and Sol's the portable
kernel, ``kernels.engine``; fp8 on a forced sm_80 / sm_86 row is refused, and the row records
the error), each with its rel-L2 against cuDNN's output. ``--psa-presets all`` also times PSA
with the masks users run: each shipped preset's middle layer, with its own heads, grid, tile
and its model's q/k/v layout. ``--kitchen`` times comfy-kitchen's ``sol_attn`` (the kernel of
ComfyUI's own Model Sparse Attention node) beside each Sol row, on the same inputs: at the
same β (its ``tau``) and at the τ whose error matches the pack's (``bench_kitchen``). comfy-kitchen
is never a dependency of the pack: the package is put on ``PYTHONPATH`` for the benchmark only
(docs/DEVELOPMENT.md says how). Every speed is also reported as a ratio to cuDNN SDPA timed in
the same run. Correctness is checked first, on fresh random inputs, against the float32
reference of the same precision, with the output memory poisoned (NaN) beforehand so unwritten
elements show.
"""
from __future__ import annotations

import argparse
import dataclasses
import itertools
import math
import os
import platform
import sys
import time

import torch
import torch.nn.functional as F
import triton

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import kernels  # noqa: E402
from benchmarks.results_file import write_results  # noqa: E402
from benchmarks.sm_shared_memory import SharedMemoryPerSM  # noqa: E402
from kernels.engine import block_sparse_attention  # noqa: E402
from kernels.engine.launch_config import ARCHITECTURES  # noqa: E402
from kernels.sol_reference import check_sol_call  # noqa: E402
from kernels.sol_gpu_routing import pool_blocks, pooled_term, route  # noqa: E402


OUT_PATH = None
PRECISIONS = ("bf16",)  # --precisions: of the exact blocks' QKᵀ, every row timed once per precision
SM_MEMORY = None  # SharedMemoryPerSM on a CUDA run: forced rows get their GPU's shared memory per SM


def save(results):
    """Write the JSON after every row, so a job stopped at its time limit still leaves data."""
    write_results(OUT_PATH, results)


def run_as(config):
    """Triton launches from now on run with ``config``'s shared memory per SM where it is smaller
    than this GPU's (``sm_shared_memory``); the bytes emulated, or None."""
    return SM_MEMORY.emulate(config) if SM_MEMORY is not None else None


def bench_ms(fn, rep_ms):
    return triton.testing.do_bench(fn, warmup=max(25, rep_ms // 4), rep=rep_ms, return_mode="median")


def cudnn_sdpa(q, k, v):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


def rel_l2(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def row_cosine(a, b):
    return F.cosine_similarity(a.float(), b.float(), dim=-1).mean().item()


def poison_allocator(nbytes):
    """Leave NaN-filled blocks in the caching allocator so the next torch.empty reuses them."""
    junk = torch.full((nbytes // 2 + 1024,), float("nan"), dtype=torch.bfloat16, device="cuda")
    del junk


QKV_LAYOUT = "blhd"  # --layout: how q/k/v are stored (the benchmark's inputs)


SOL_INPUTS = ("gaussian", "video")  # --sol-inputs: random q/k/v, or benchmarks/workload.py's video-like ones


def video_like_qkv(grid, H, D, seed):
    """``workload.video_qkv`` on the GPU (bf16), in the benchmark's layout: attention that is
    local in the token grid, so neighbouring query blocks route alike."""
    from benchmarks.workload import video_qkv

    q, k, v, _ = video_qkv(grid, H, D, seed=seed, device="cuda", dtype=torch.bfloat16)
    if QKV_LAYOUT == "heads_first":
        return [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
    return [q, k, v]


def random_qkv(L, H, D, dtype, seed, layout=None):
    """q, k, v (1, L, H, D): stored (1, L, H·D) as Wan and LTX hand them over ("blhd"), or
    heads first (1, H, L, D) as HunyuanVideo does ("heads_first"); ``layout`` None: --layout's."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    if (layout or QKV_LAYOUT) == "heads_first":
        return [torch.randn(1, H, L, D, device="cuda", dtype=dtype, generator=g).transpose(1, 2) for _ in range(3)]
    return [torch.randn(1, L, H, D, device="cuda", dtype=dtype, generator=g) for _ in range(3)]


def peak_extra_mb(fn):
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak / 2**20


def ran_precision(precision, config, method):
    """What a ``method`` ("sol" or "psa") call in ``precision`` runs as (``auto`` resolved for
    the launch row ``config``, or this GPU's when None), with why."""
    from kernels.engine.precision import resolve_precision

    return resolve_precision(precision, config or kernels.config_for_device("cuda"), method)


def check_sol(results):
    """Kernel vs reference on moderate shapes: 3D tiles (auto and forced), row-major, several β,
    both estimators, sinks, text tokens after the grid; each precision against the reference of
    that precision."""
    cases = [
        (1, 4096 + 37, None, 4, 128, torch.bfloat16, 1.0, "exact", None),
        (2, 3000, None, 3, 64, torch.float16, 1.5, "diag", [(2900, 3000)]),
        (1, 6 * 45 * 80, (6, 45, 80), 2, 128, torch.bfloat16, 1.04, "exact", None),
        (1, 5 * 45 * 80 + 256, (5, 45, 80), 2, 128, torch.bfloat16, 1.28, "diag", None),
        (3, 777, (7, 11, 10), 2, 128, torch.float16, float("-inf"), "exact", None),
    ]
    for (i, (B, L, grid, H, D, dtype, beta, est, sinks)), precision in itertools.product(enumerate(cases),
                                                                                         PRECISIONS):
        g = torch.Generator(device="cuda").manual_seed(1000 + i)
        q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=dtype, generator=g) for _ in range(3))
        kw = dict(beta=beta, estimator=est, sinks=sinks, grid=grid, return_stats=True)
        poison_allocator(q.numel() * q.element_size())
        out, st = kernels.sol_attention(q, k, v, precision=precision, **kw)
        ran = ran_precision(precision, None, "sol").precision
        ref, rst = kernels.sol_attention_reference(q, k, v, precision=ran, **kw)
        entry = dict(method="sol", precision=precision, shape=[B, L, H, D], grid=grid, dtype=str(dtype), beta=beta,
                     estimator=est, sinks=sinks, rel_l2_vs_reference=rel_l2(out, ref),
                     all_finite=bool(torch.isfinite(out).all()),
                     exact_block_rows_differing=float((st["exact_blocks"] != rst["exact_blocks"]).float().mean()),
                     density_kernel=st["density"].mean().item(), density_reference=rst["density"].mean().item())
        entry["ok"] = entry["all_finite"] and entry["rel_l2_vs_reference"] < 2e-2
        results["checks"].append(entry)
        print(f"check sol {precision} {entry['shape']} grid={grid} {dtype} β={beta} {est}: "
              f"rel_l2={entry['rel_l2_vs_reference']:.2e} "
              f"finite={entry['all_finite']} density {entry['density_kernel']:.3f}/{entry['density_reference']:.3f} "
              f"rows differing {entry['exact_block_rows_differing']:.1e}", flush=True)


def flex_block_mask(selection, L, block=64):
    """FlexAttention BlockMask whose picked blocks of a bool (B, H, N, N) mask are all full."""
    from torch.nn.attention.flex_attention import BlockMask

    counts = selection.sum(-1, dtype=torch.int32)
    ids = torch.argsort((~selection).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    zeros = torch.zeros_like(counts)
    return BlockMask.from_kv_blocks(zeros, torch.zeros_like(ids), counts, ids, BLOCK_SIZE=block, seq_lengths=(L, L))


SOL_SHAPES = {75600: (21, 45, 80), 131072: (32, 64, 64)}

# Block loops a benchmark can time side by side on Hopper: "default" is the GPU's own row
# (launch_config), "ws" the warp-specialised loop (hopper_loop), "ws2" the same with rings of
# at most 2 slots, "tma" the portable kernel with TMA boxes.
# The block loops a row can time: this GPU's, the Hopper row's variants, and every other
# architecture's launch row forced here (sm80, sm86, ...: its kernel on this GPU, beside
# comfy-kitchen with --kitchen).
LOOPS = {"default": None, "ws": ARCHITECTURES[(9, 0)],
         "ws2": dataclasses.replace(ARCHITECTURES[(9, 0)], num_stages=2),
         "tma": dataclasses.replace(ARCHITECTURES[(9, 0)], warp_specialized=False),
         **{f"sm{major}{minor}": config for (major, minor), config in ARCHITECTURES.items() if (major, minor) != (9, 0)}}
# The settings a loop name may change after a "/": "sm89/num_stages=4/sol_warps=8" is the sm_89
# row with those two changed, so one call can time a row beside its variants.
LOOP_SETTINGS = ("num_stages", "sol_stages", "psa_quantized_stages", "sol_warps", "psa_warps", "psa_block_n",
                 "pool_chunk", "shared_memory_per_sm")


def loop_config(name: str):
    """The launch configuration a ``--loops`` name stands for (``LOOPS``, optionally with
    ``/setting=value`` changes of ``LOOP_SETTINGS``); a ValueError that says what is wrong."""
    base, *changes = name.split("/")
    if base not in LOOPS:
        raise ValueError(f"unknown {base}; choose from {', '.join(LOOPS)}")
    if changes and LOOPS[base] is None:
        raise ValueError(f"{name}: name a row to change (default is whatever this GPU runs)")
    settings = {}
    for change in changes:
        key, _, value = change.partition("=")
        if key not in LOOP_SETTINGS or not value.isdigit() or int(value) < 1:
            raise ValueError(f"{name}: expected setting=positive integer, setting one of "
                             f"{', '.join(LOOP_SETTINGS)}, got {change!r}")
        settings[key] = int(value)
    return dataclasses.replace(LOOPS[base], **settings) if settings else LOOPS[base]


def sol_pieces(q, k, v, beta, grid, tile):
    """The three stages of one Sol call for all heads, for timing them apart: the routed mask
    and the pooled term (one group of all heads; the benchmark's memory is not the point here)."""
    layout, forced, beta_t, scale = check_sol_call(q, k, v, beta=beta, estimator="exact", grid=grid, tile=tile,
                                                   sinks=None, scale=None, for_kernel=True)
    H = q.shape[2]

    def routing():
        qm, km, vm = pool_blocks(q, k, v, layout, 0, H)
        mask = route(qm, km, beta_t, forced, layout, estimator="exact", scale=scale)
        return mask, pooled_term(km, vm, layout)

    return layout, routing, scale


def bench_sol(results, seqs, densities, tilings, H, D, rep_ms, pool_chunks=(), loops=("default",),
              inputs=("gaussian",), kitchen=None):
    """Per sequence, kind of inputs (``SOL_INPUTS``), tiling (``rowmajor``, ``auto`` or
    ``bt:bh:bw``) and density: the whole call, the engine fed
    the same mask (the "lists" baseline), the routing alone, memory, and fidelity against
    cuDNN on these inputs; once per block loop of ``loops`` (``LOOPS``) and precision
    (``PRECISIONS``). With ``kitchen`` (comfy-kitchen's ``sol_attn``), each row also gets
    ``bench_kitchen``'s timings."""
    for L, kind in itertools.product(seqs, inputs):
        grid = SOL_SHAPES.get(L)
        if kind == "video":
            q, k, v = video_like_qkv(grid, H, D, seed=L)
        else:
            q, k, v = random_qkv(L, H, D, torch.bfloat16, seed=L)
        ref = cudnn_sdpa(q, k, v)
        t_dense = bench_ms(lambda: cudnn_sdpa(q, k, v), rep_ms)
        mem_dense = peak_extra_mb(lambda: cudnn_sdpa(q, k, v))
        print(f"L={L} grid={grid} {kind} inputs: cuDNN {t_dense:.2f} ms", flush=True)
        for tiling in tilings:
            if tiling == "rowmajor" or grid is None:
                g, tile = None, None
            else:
                g, tile = grid, (None if tiling == "auto" else tuple(int(x) for x in tiling.split(":")))
            for rho, loop, precision in itertools.product(densities, loops, PRECISIONS):
                cfg = LOOPS[loop]
                emulated = run_as(cfg)
                beta = kernels.beta_for_density(rho)
                kw = dict(beta=beta, grid=g, tile=tile, config=cfg, precision=precision)
                t0 = time.perf_counter()
                out, st = kernels.sol_attention(q, k, v, return_stats=True, **kw)
                torch.cuda.synchronize()
                first_call_s = time.perf_counter() - t0
                density = st["density"].mean().item()
                t_sol = bench_ms(lambda: kernels.sol_attention(q, k, v, **kw), rep_ms)
                mem_sol = peak_extra_mb(lambda: kernels.sol_attention(q, k, v, **kw))
                layout, routing, scale = sol_pieces(q, k, v, beta, g, tile)
                mask, pooled = routing()
                t_route = bench_ms(routing, rep_ms)
                # The engine fed the routed mask; int8 / fp8 quantize the keys there (their
                # smoothing mean from a PyTorch pass: the whole call takes it from the pooling).
                engine = dict(scale=scale, precision=precision)
                t_lists = bench_ms(lambda: block_sparse_attention(q, k, v, mask, config=cfg, **engine), rep_ms)
                t_lists_pooled = bench_ms(
                    lambda: block_sparse_attention(q, k, v, mask, pooled=pooled, config=cfg, **engine), rep_ms)
                pool_variants = {}  # the pooled term in other step sizes (LaunchConfig.pool_chunk)
                for chunk in pool_chunks:
                    chunk_cfg = dataclasses.replace(cfg or ARCHITECTURES[(9, 0)], pool_chunk=chunk)
                    pool_variants[str(chunk)] = bench_ms(
                        lambda: block_sparse_attention(q, k, v, mask, pooled=pooled, config=chunk_cfg, **engine),
                        rep_ms)
                mask = pooled = None  # free the scratch before the next row
                n_keep = max(64, int(round(density * L)))
                t_ideal = bench_ms(lambda: cudnn_sdpa(q, k[:, :n_keep], v[:, :n_keep]), rep_ms)
                row = dict(L=L, inputs=kind, grid=g, tile=list(layout.tile), tiling=tiling, loop=loop,
                           shared_memory_per_sm_emulated=emulated, precision=precision,
                           precision_ran=ran_precision(precision, cfg, "sol").describe(),
                           blocks=layout.n_blocks,
                           padding=layout.n_slots / L - 1, heads=H, head_dim=D, target_density=rho, beta=beta,
                           density=density, cudnn_ms=t_dense, sol_ms=t_sol, speedup=t_dense / t_sol,
                           precomputed_mask_ms=t_lists, precomputed_mask_with_pooled_term_ms=t_lists_pooled,
                           routing_ms=t_route, routing_and_correction_overhead=t_sol / t_lists - 1,
                           correction_share=t_lists_pooled / t_lists - 1,
                           precomputed_mask_with_pooled_term_ms_by_chunk=pool_variants,
                           ideal_ms=t_ideal, ideal_speedup=t_dense / t_ideal,
                           rel_l2_vs_dense=rel_l2(out, ref), row_cosine_vs_dense=row_cosine(out, ref),
                           first_call_s=first_call_s, peak_extra_mb_sol=mem_sol, peak_extra_mb_cudnn=mem_dense,
                           memory_over_dense=(mem_sol - mem_dense) / mem_dense)
                if kitchen is not None:
                    row["kitchen"] = bench_kitchen(kitchen, q, k, v, ref, t_dense, beta, row["rel_l2_vs_dense"],
                                                   rep_ms)
                    kit = row["kitchen"]
                    print(f"  comfy-kitchen sol_attn tau={beta:.3f}: {kit['same_beta']['speedup']:.2f}x rel_l2 "
                          f"{kit['same_beta']['rel_l2_vs_dense']:.4f}; equal error tau="
                          f"{kit['equal_error']['tau']:.3f}: {kit['equal_error']['speedup']:.2f}x rel_l2 "
                          f"{kit['equal_error']['rel_l2_vs_dense']:.4f}", flush=True)
                results["sol"].append(row)
                save(results)
                print(f"  {loop} {precision} {tiling} tile={row['tile']} ρ={rho:.2f} density={density:.3f} "
                      f"sol {t_sol:.2f} ms "
                      f"({t_dense / t_sol:.2f}x) lists {t_lists:.2f} "
                      f"(+pooled {t_lists_pooled:.2f}) "
                      f"routing {t_route:.2f} overhead {100 * row['routing_and_correction_overhead']:.1f}% "
                      f"ideal {t_dense / t_ideal:.2f}x rel_l2 {row['rel_l2_vs_dense']:.3f} "
                      f"mem +{mem_sol:.0f}MB vs +{mem_dense:.0f}MB first {first_call_s:.1f}s", flush=True)
                del out


def kitchen_version():
    import importlib.metadata
    import comfy_kitchen
    try:
        return importlib.metadata.version("comfy-kitchen")
    except importlib.metadata.PackageNotFoundError:   # unpacked on PYTHONPATH without its dist-info
        return getattr(comfy_kitchen, "__version__", "unknown")


def kitchen_sol_attn():
    """comfy-kitchen's ``sol_attn``, or the reason it cannot run here."""
    try:
        import comfy_kitchen
    except Exception as exc:
        return None, f"comfy_kitchen is not importable ({type(exc).__name__}: {exc})"
    if not torch.cuda.is_available() or not comfy_kitchen.sol_attn_is_available(torch.device("cuda")):
        return None, "comfy_kitchen.sol_attn is not available on this device"
    return comfy_kitchen.sol_attn, None


def bench_kitchen(sol_attn, q, k, v, ref, t_dense, beta, pack_rel_l2, rep_ms, steps=12):
    """comfy-kitchen's ``sol_attn`` on the pack's inputs: at ``tau`` = ``beta`` (the same
    threshold rule, τ = μ + βσ on its row-major 64-token blocks) and at the largest τ whose
    rel-L2 against cuDNN is at most the pack's (``pack_rel_l2``), found by bisection on
    [-1, beta] (error grows with τ)."""
    q, k, v = (x.contiguous() for x in (q, k, v))

    def measure(tau):
        out = sol_attn(q, k, v, tau=tau)
        err = rel_l2(out, ref)
        del out
        return err

    def timed(tau):
        ms = bench_ms(lambda: sol_attn(q, k, v, tau=tau), rep_ms)
        return dict(tau=tau, rel_l2_vs_dense=measure(tau), ms=ms, speedup=t_dense / ms)

    same = timed(beta)
    lo, hi = -1.0, beta
    if measure(lo) > pack_rel_l2:
        equal = dict(timed(lo), note=f"no tau in [-1, {beta:.3f}] reaches the pack's rel-L2")
    else:
        for _ in range(steps):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if measure(mid) <= pack_rel_l2 else (lo, mid)
        equal = timed(lo)
    return dict(same_beta=same, equal_error=equal, pack_rel_l2_vs_dense=pack_rel_l2)


def bench_arch_configs(results, H, D, rep_ms, archs):
    """Each architecture's launch configuration forced on this GPU, once per precision: checked
    against the float reference of that precision (two heads), then timed at full size against
    cuDNN in the same run, with each call's rel-L2 against cuDNN's output."""
    grid, tile = (21, 45, 80), (3, 8, 16)
    L = grid[0] * grid[1] * grid[2]
    q, k, v = random_qkv(L, H, D, torch.bfloat16, seed=77)
    ref_dense = cudnn_sdpa(q, k, v)
    t_dense = bench_ms(lambda: cudnn_sdpa(q, k, v), rep_ms)
    params = {rho: psa_params_for_density(grid, tile, H, rho) for rho in (0.15, 0.40)}
    small = [x[:, :, :2] for x in (q, k, v)]
    for cap, precision in itertools.product(archs, PRECISIONS):
        config = ARCHITECTURES[cap]
        row = dict(arch=f"sm_{cap[0]}{cap[1]}", config=config.describe(), precision=precision, L=L, grid=grid,
                   cudnn_ms=t_dense, shared_memory_per_sm_emulated=run_as(config))
        kw = dict(config=config, precision=precision)
        try:  # fp8 on a row without fp8 tensor cores: the ValueError is the row's error
            row["precision_ran"] = {m: ran_precision(precision, config, m).describe() for m in ("sol", "psa")}
            p2 = params[0.15][0][:2]
            poison_allocator(small[0].numel() * 2)
            out = kernels.psa_attention(*small, grid=grid, params=p2, tile=tile, **kw)
            row["psa_rel_l2_vs_reference"] = rel_l2(out, kernels.psa_attention_reference(
                *small, grid=grid, params=p2, tile=tile, precision=ran_precision(precision, config, "psa").precision))
            poison_allocator(small[0].numel() * 2)
            out = kernels.sol_attention(*small, beta=1.04, grid=grid, **kw)
            row["sol_rel_l2_vs_reference"] = rel_l2(out, kernels.sol_attention_reference(
                *small, beta=1.04, grid=grid, precision=ran_precision(precision, config, "sol").precision))
            for rho, (p, dens) in params.items():
                def psa():
                    return kernels.psa_attention(q, k, v, grid=grid, params=p, tile=tile, **kw)
                err = rel_l2(psa(), ref_dense)
                ms = bench_ms(psa, rep_ms)
                row[f"psa_{rho:.2f}"] = dict(density=dens, ms=ms, speedup=t_dense / ms, rel_l2_vs_cudnn=err)
            for rho in (0.10, 0.15):
                beta = kernels.beta_for_density(rho)

                def sol():
                    return kernels.sol_attention(q, k, v, beta=beta, grid=grid, **kw)
                err = rel_l2(sol(), ref_dense)
                ms = bench_ms(sol, rep_ms)
                row[f"sol_{rho:.2f}"] = dict(ms=ms, speedup=t_dense / ms, rel_l2_vs_cudnn=err)
        except Exception as exc:  # a configuration that fails is recorded, not fatal
            row["error"] = f"{type(exc).__name__}: {exc}"[:400]
        results["arch_configs"].append(row)
        save(results)
        print("arch", row, flush=True)


PSA_SHAPES = {
    # name: (grid, tile): the paper's settings, then the grids of the shipped presets whose tiles
    # differ from them (mask_presets/wan2.2_ti2v_5b_720p_121f.json, wan2.1_1.3b_480p_81f.json,
    # ltx2_720p_121f.json)
    "wan720p": ((21, 45, 80), (3, 8, 16)),
    "wan720p_unpadded": ((21, 48, 80), (3, 8, 16)),
    "hunyuan768p": ((30, 48, 80), (6, 8, 8)),
    "wan22_5b_720p": ((31, 22, 40), (2, 8, 8)),
    "wan21_1.3b_480p": ((21, 30, 52), (3, 8, 8)),
    "ltx2_720p": ((16, 22, 40), (2, 4, 8)),
}


def psa_params_for_density(grid, tile, heads, rho):
    """Per-head stripe parameters whose token-level densities average about rho.

    Candidates are local, temporal, spatial and strided heads; each head takes the candidate
    nearest to its own density target, spread ±50 % around rho so heads differ in cost.
    """
    from kernels.psa_mask import psa_mask

    nT, nH, nW = (-(-g // t) for g, t in zip(grid, tile))
    cands = []
    for tw in range(1, nT + 1):
        for sw in range(1, nH * nW + 1):
            for ss in (0, nW, 3):
                cands.append([tw, 0, 0, sw, 0, ss])
    cands = torch.tensor(cands)
    dens = psa_mask(grid, cands, tile).density(tokens=True)
    targets = torch.linspace(0.5 * rho, 1.5 * rho, heads)
    pick = (dens[None, :] - targets[:, None]).abs().argmin(dim=1)
    params = cands[pick]
    return params, psa_mask(grid, params, tile).density(tokens=True).mean().item()


def check_psa(results):
    """PSA kernel vs its reference, each precision against the reference of that precision."""
    cases = [((5, 9, 12), (2, 4, 8), 0, 1, 3, 128, torch.bfloat16),
             ((6, 16, 16), (3, 8, 8), 77, 2, 2, 64, torch.float16),
             ((21, 45, 80), (3, 8, 16), 0, 1, 2, 128, torch.bfloat16)]
    for (i, (grid, tile, extra, B, H, D, dtype)), precision in itertools.product(enumerate(cases), PRECISIONS):
        L = grid[0] * grid[1] * grid[2] + extra
        g = torch.Generator(device="cuda").manual_seed(2000 + i)
        q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=dtype, generator=g) for _ in range(3))
        params, dens = psa_params_for_density(grid, tile, H, 0.3)
        kw = dict(grid=grid, params=params, tile=tile, extra_tokens=extra)
        poison_allocator(q.numel() * q.element_size())
        out = kernels.psa_attention(q, k, v, precision=precision, **kw)
        ref = kernels.psa_attention_reference(q, k, v, precision=ran_precision(precision, None, "psa").precision, **kw)
        entry = dict(method="psa", precision=precision, grid=grid, tile=tile, extra_tokens=extra, shape=[B, L, H, D],
                     dtype=str(dtype), rel_l2_vs_reference=rel_l2(out, ref), all_finite=bool(torch.isfinite(out).all()))
        entry["ok"] = entry["all_finite"] and entry["rel_l2_vs_reference"] < 2e-2
        results["checks"].append(entry)
        print(f"check psa {precision} {grid} {tile} extra={extra} {dtype}: rel_l2={entry['rel_l2_vs_reference']:.2e} "
              f"finite={entry['all_finite']}", flush=True)


def flex_psa_block_mask(grid, params, tile, L):
    """FlexAttention block mask (128-token blocks) equal to the PSA mask, on blocked inputs."""
    from kernels.psa_mask import psa_block_mask

    bt = tile[0] * tile[1] * tile[2]
    rep = bt // 128
    m = psa_block_mask(grid, params, tile).cuda()
    m = m.repeat_interleave(rep, dim=1).repeat_interleave(rep, dim=2)[None]
    return flex_block_mask(m, L, block=128)


PRESET_FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "mask_presets")


def shipped_presets():
    """name -> path of every preset in the pack's mask_presets/."""
    return {name[:-len(".json")]: os.path.join(PRESET_FOLDER, name)
            for name in sorted(os.listdir(PRESET_FOLDER)) if name.endswith(".json")}


@dataclasses.dataclass(frozen=True)
class PsaWorkload:
    """One PSA timing: a grid and tile, stripe parameters (heads, 6), and where they came from."""

    name: str
    grid: tuple
    tile: tuple
    params: torch.Tensor
    target_density: float | None  # the --psa-densities value, None for a preset's own parameters
    preset_layer: int | None = None
    layout: str | None = None  # q/k/v's memory layout (random_qkv); None: --layout's


# How a model family's adapter hands q/k/v to the kernels, where not as (1, L, H·D) rows:
# HunyuanVideo's double blocks hand them heads first.
FAMILY_LAYOUTS = {"hunyuan_video": "heads_first"}


def psa_workloads(shapes, densities, H, presets):
    """The --psa-shapes grids at each of ``densities`` (``H`` heads of synthetic stripes), then
    each named shipped preset at its middle layer's own parameters (first step bucket), with
    that preset's heads and in its model's q/k/v layout: the cost of the masks users run."""
    from kernels.preset_file import preset_from_json

    for name in shapes:
        grid, tile = PSA_SHAPES[name]
        for rho in densities:
            yield PsaWorkload(name, grid, tile, psa_params_for_density(grid, tile, H, rho)[0], rho)
    for name in presets:
        with open(shipped_presets()[name], encoding="utf-8") as f:
            preset = preset_from_json(f.read())
        layer = preset.num_layers // 2
        yield PsaWorkload(name, tuple(preset.grid), tuple(preset.tile), preset.params_for(layer), None, layer,
                          FAMILY_LAYOUTS.get(preset.family, "blhd"))


def bench_psa(results, workloads, D, rep_ms, flex_on, loops=("default",)):
    from kernels.layout import tile_layout
    from kernels.psa_mask import psa_mask

    flex = None
    if flex_on:
        from torch.nn.attention.flex_attention import flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
    inputs = None  # (grid, heads, layout) -> q, k, v, cuDNN's output, time and memory: shared by its rows
    for work in workloads:
        grid, tile, params = work.grid, work.tile, work.params
        L, H, layout = grid[0] * grid[1] * grid[2], params.shape[0], work.layout or QKV_LAYOUT
        if inputs is None or inputs[0] != (grid, H, layout):
            inputs = q = k = v = ref = None  # free the last grid's tensors first
            q, k, v = random_qkv(L, H, D, torch.bfloat16, seed=L + 1, layout=layout)
            t_dense = bench_ms(lambda: cudnn_sdpa(q, k, v), rep_ms)
            mem_dense = peak_extra_mb(lambda: cudnn_sdpa(q, k, v))
            inputs = (grid, H, layout), q, k, v, cudnn_sdpa(q, k, v), t_dense, mem_dense
        _, q, k, v, ref, t_dense, mem_dense = inputs
        source = (f"target density {work.target_density:.2f}" if work.preset_layer is None
                  else f"preset layer {work.preset_layer}")
        print(f"PSA {work.name} grid={grid} tile={tile} L={L} heads={H} {layout}, {source}: cuDNN {t_dense:.2f} ms",
              flush=True)
        dens = psa_mask(grid, params, tile).density(tokens=True).mean().item()
        for loop, precision in itertools.product(loops, PRECISIONS):
            kw = dict(grid=grid, params=params, tile=tile, config=LOOPS[loop], precision=precision)
            emulated = run_as(LOOPS[loop])
            t0 = time.perf_counter()
            out = kernels.psa_attention(q, k, v, **kw)
            torch.cuda.synchronize()
            first_call_s = time.perf_counter() - t0
            err = rel_l2(out, ref)
            del out
            t_psa = bench_ms(lambda: kernels.psa_attention(q, k, v, **kw), rep_ms)
            mem = peak_extra_mb(lambda: kernels.psa_attention(q, k, v, **kw))
            n_keep = max(64, int(round(dens * L)))
            t_ideal = bench_ms(lambda: cudnn_sdpa(q, k[:, :n_keep], v[:, :n_keep]), rep_ms)
            row = dict(shape=work.name, loop=loop, shared_memory_per_sm_emulated=emulated, precision=precision,
                       precision_ran=ran_precision(precision, LOOPS[loop], "psa").describe(), grid=grid, tile=tile, L=L,
                       heads=H, head_dim=D, target_density=work.target_density, rel_l2_vs_cudnn=err,
                       density=dens, cudnn_ms=t_dense, psa_ms=t_psa, speedup=t_dense / t_psa,
                       ideal_ms=t_ideal, ideal_speedup=t_dense / t_ideal, share_of_ideal=t_ideal / t_psa,
                       first_call_s=first_call_s, peak_extra_mb_psa=mem, peak_extra_mb_cudnn=mem_dense)
            if work.preset_layer is not None:
                row.update(preset_layer=work.preset_layer, layout=layout)
            if flex is not None and loop == loops[0] and precision == PRECISIONS[0]:
                try:
                    lay = tile_layout(grid, tile, device="cuda")
                    qb, kb, vb = (lay.to_blocks(x, dim=1).transpose(1, 2) for x in (q, k, v))
                    bm = flex_psa_block_mask(grid, params, tile, lay.n_slots)
                    flex(qb, kb, vb, block_mask=bm)
                    row["flex_ms"] = bench_ms(lambda: flex(qb, kb, vb, block_mask=bm), rep_ms)
                    row["flex_speedup"] = t_dense / row["flex_ms"]
                    del qb, kb, vb
                except Exception as exc:  # record why FlexAttention could not run, keep the job going
                    row["flex_error"] = f"{type(exc).__name__}: {exc}"[:300]
            results["psa"].append(row)
            save(results)
            print(f"  {loop} {precision} density={dens:.3f} psa {t_psa:.2f} ms ({t_dense / t_psa:.2f}x, "
                  f"{100 * t_ideal / t_psa:.0f}% of ideal {t_dense / t_ideal:.2f}x) rel_l2 {err:.3f} "
                  f"flex {row.get('flex_speedup', float('nan')):.2f}x mem +{mem:.0f}MB vs +{mem_dense:.0f}MB "
                  f"first {first_call_s:.1f}s", flush=True)


def bench_dense_ceiling(results, H, D, rep_ms, loops=("default",)):
    """Per-block efficiency with every block visited (80,640 tokens, 21x48x80, no padding):
    cuDNN; FlexAttention without a mask (Triton's generated dense kernel in this stack); our
    PSA kernel with the full mask; our Sol loop (64-row tiles) fed every block, as routed with
    β = -inf (so the mask has its bitmap, as a Sol call's), bare and with the pooled term
    (every block routed: the pooled chunks are read and masked out). The ratio of each to cuDNN bounds what a block-sparse kernel of the same loop can reach per
    block."""
    from torch.nn.attention.flex_attention import flex_attention

    grid, tile = PSA_SHAPES["wan720p_unpadded"]
    L = grid[0] * grid[1] * grid[2]
    q, k, v = random_qkv(L, H, D, torch.bfloat16, seed=11)
    scale = 1 / math.sqrt(D)
    ref = cudnn_sdpa(q, k, v)
    t_dense = bench_ms(lambda: cudnn_sdpa(q, k, v), rep_ms)
    row = dict(L=L, heads=H, head_dim=D, cudnn_ms=t_dense)
    nT, nH, nW = (g // t for g, t in zip(grid, tile))
    full = torch.tensor([[nT, 0, 0, nH * nW, 0, 0]] * H)
    _, route_every_block, _ = sol_pieces(q, k, v, float("-inf"), None, None)
    every_block, pooled = route_every_block()
    variants = {}
    for loop in loops:  # name -> (launch row, call)
        cfg = LOOPS[loop]
        variants[f"psa_full_mask_{loop}"] = cfg, lambda cfg=cfg: kernels.psa_attention(
            q, k, v, grid=grid, params=full, tile=tile, config=cfg)
        variants[f"sol_loop_all_blocks_{loop}"] = cfg, lambda cfg=cfg: block_sparse_attention(
            q, k, v, every_block, scale=scale, config=cfg)
        variants[f"sol_loop_all_blocks_pooled_{loop}"] = cfg, lambda cfg=cfg: block_sparse_attention(
            q, k, v, every_block, scale=scale, pooled=pooled, config=cfg)
    flex = torch.compile(flex_attention, dynamic=False)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    variants["flex_no_mask"] = None, lambda: flex(qt, kt, vt).transpose(1, 2)
    results["ceiling"] = row
    for name, (cfg, fn) in variants.items():
        run_as(cfg)
        try:
            err = rel_l2(fn(), ref)
            ms = bench_ms(fn, rep_ms)
            row[name] = dict(ms=ms, share_of_cudnn=t_dense / ms, rel_l2_vs_cudnn=err)
        except Exception as exc:  # record why a variant could not run, keep the job going
            row[name] = dict(error=f"{type(exc).__name__}: {exc}"[:300])
        print(f"ceiling {name}: {row[name]}", flush=True)
        save(results)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--sol-seqs", default="75600,131072")
    ap.add_argument("--densities", default="0.05,0.10,0.15,0.20,0.25")
    ap.add_argument("--sol-inputs", default="gaussian",
                    help=f"Sol's inputs, comma separated: {', '.join(SOL_INPUTS)} (video: benchmarks/workload.py, "
                         f"on the --sol-seqs of {sorted(SOL_SHAPES)} only)")
    ap.add_argument("--tilings", default="rowmajor,auto,2:4:8,4:4:4,2:8:4",
                    help="Sol blocks: rowmajor, auto (sol_tile_for_grid) or bt:bh:bw, comma separated")
    ap.add_argument("--layout", default="blhd", choices=["blhd", "heads_first"], help="memory layout of q/k/v")
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rep-ms", type=int, default=400)
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--psa-shapes", default="wan720p,wan720p_unpadded,hunyuan768p")
    ap.add_argument("--psa-densities", default="0.15,0.40")
    ap.add_argument("--psa-presets", default="",
                    help="also time PSA with shipped presets' own masks (their middle layer), comma separated "
                         "names from mask_presets/, or all")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--pool-chunks", default="", help="also time Sol's pooled term with these chunks, e.g. 128")
    ap.add_argument("--archs", default="", help="architecture configurations to force and time, e.g. 8.0,8.6,9.0")
    ap.add_argument("--ceiling", action="store_true", help="also time the kernels with every block visited")
    ap.add_argument("--kitchen", action="store_true",
                    help="also time comfy-kitchen's sol_attn beside each Sol row (comfy_kitchen on PYTHONPATH)")
    ap.add_argument("--loops", default="default",
                    help=f"block loops to time, comma separated: {', '.join(LOOPS)} (default: this GPU's); a "
                         f"row with settings changed: sm89/num_stages=4 ({', '.join(LOOP_SETTINGS)})")
    ap.add_argument("--precisions", default="bf16",
                    help=f"precisions of the exact blocks to time every row in, comma separated: "
                         f"{', '.join(kernels.PRECISIONS)} (default bf16)")
    ap.add_argument("--scratch-share", type=float, default=None,
                    help="the engine's scratch budget as a share of the output (engine.SCRATCH_SHARE, "
                         "default 0.04): larger runs a call's heads in fewer, larger groups")
    args = ap.parse_args(argv)
    if args.scratch_share is not None:
        if not 0 < args.scratch_share <= 1:
            ap.error(f"--scratch-share: expected a share in (0, 1], got {args.scratch_share}")
        kernels.engine.SCRATCH_SHARE = args.scratch_share
    loops = [x for x in args.loops.split(",") if x]
    if not loops:
        ap.error(f"--loops: unknown (none given); choose from {', '.join(LOOPS)}")
    for name in loops:
        try:
            LOOPS[name] = loop_config(name)
        except ValueError as exc:
            ap.error(f"--loops: {exc}")
    sol_inputs = [x for x in args.sol_inputs.split(",") if x]
    bad = sorted(set(sol_inputs) - set(SOL_INPUTS))
    if bad or not sol_inputs:
        ap.error(f"--sol-inputs: unknown {', '.join(bad) or '(none given)'}; choose from {', '.join(SOL_INPUTS)}")
    precisions = [x for x in args.precisions.split(",") if x]
    wrong = sorted(set(precisions) - set(kernels.PRECISIONS))
    if wrong or not precisions:
        ap.error(f"--precisions: unknown {', '.join(wrong) or '(none given)'}; choose from "
                 f"{', '.join(kernels.PRECISIONS)}")
    psa_shapes = [x for x in args.psa_shapes.split(",") if x]
    unknown = sorted(set(psa_shapes) - set(PSA_SHAPES))
    if unknown:
        ap.error(f"--psa-shapes: unknown {', '.join(unknown)}; choose from {', '.join(PSA_SHAPES)}")
    presets = [x for x in args.psa_presets.split(",") if x]
    if presets == ["all"]:
        presets = list(shipped_presets())
    missing = sorted(set(presets) - set(shipped_presets()))
    if missing:
        ap.error(f"--psa-presets: unknown {', '.join(missing)}; choose from all, {', '.join(shipped_presets())}")
    sol_seqs = [int(x) for x in args.sol_seqs.split(",") if x]
    if "video" in sol_inputs and set(sol_seqs) - set(SOL_SHAPES):
        ap.error(f"--sol-inputs video needs a video grid: --sol-seqs from {sorted(SOL_SHAPES)}, got {args.sol_seqs}")
    kitchen = None
    if args.kitchen:
        kitchen, why_not = kitchen_sol_attn()
        if kitchen is None:
            ap.error(f"--kitchen: {why_not}")
    global OUT_PATH, QKV_LAYOUT, PRECISIONS, SM_MEMORY
    OUT_PATH, QKV_LAYOUT, PRECISIONS = args.out, args.layout, tuple(precisions)
    SM_MEMORY = SharedMemoryPerSM()
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    results = dict(command="python " + " ".join(sys.argv), started=time.strftime("%Y-%m-%d %H:%M:%S"),
                   comfy_kitchen=kitchen_version() if kitchen is not None else None,
                   device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                   python=platform.python_version(), disable_mma_v3=os.environ.get("DISABLE_MMA_V3", ""),
                   shared_memory_per_sm=SM_MEMORY.device_bytes,
                   layout=args.layout, precisions=list(PRECISIONS),
                   scratch_share=kernels.engine.SCRATCH_SHARE, checks=[],
                   sol=[], psa=[], arch_configs=[])
    if not args.skip_checks:
        check_sol(results)
        check_psa(results)
    if args.archs:
        archs = [tuple(int(x) for x in a.split(".")) for a in args.archs.split(",")]
        bench_arch_configs(results, args.heads, args.head_dim, args.rep_ms, archs)
    if args.ceiling:
        bench_dense_ceiling(results, args.heads, args.head_dim, args.rep_ms, loops)
    bench_sol(results, sol_seqs, [float(x) for x in args.densities.split(",")],
              [t for t in args.tilings.split(",") if t], args.heads, args.head_dim, args.rep_ms,
              [int(x) for x in args.pool_chunks.split(",") if x], loops, inputs=sol_inputs, kitchen=kitchen)
    workloads = psa_workloads(psa_shapes, [float(x) for x in args.psa_densities.split(",")], args.heads, presets)
    bench_psa(results, workloads, args.head_dim, args.rep_ms, not args.no_flex, loops)
    save(results)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
