"""Build, check and time the sparse attention kernels against cuDNN SDPA in one GPU job.

Usage (on a CUDA machine; writes one JSON file with the command that made it):
    python benchmarks/bench_kernels.py --out benchmarks/results/kernels_h200.json

Every speed is also reported as a ratio to cuDNN SDPA timed in the same run. Correctness is
checked first, on fresh random inputs, against the float32 reference, with the output
memory poisoned (NaN) beforehand so unwritten elements show.
"""
from __future__ import annotations

import argparse
import json
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
from kernels.sol_routing import block_lengths  # noqa: E402
from kernels.sol_triton import SOL_CHUNK, block_lists_from_selection, launch_sol_kernel  # noqa: E402


OUT_PATH = None


def save(results):
    """Write the JSON after every row, so a job stopped at its time limit still leaves data."""
    with open(OUT_PATH, "w") as f:
        json.dump(results, f, indent=1)


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


def random_qkv(L, H, D, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
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


def check_sol(results):
    """Kernel vs reference on moderate shapes, several β, both estimators, sinks, diagonal."""
    cases = [
        (1, 4096 + 37, 4, 128, torch.bfloat16, 1.0, "exact", None, False),
        (2, 3000, 3, 64, torch.float16, 1.5, "diag", [(2900, 3000)], True),
        (1, 8192, 2, 128, torch.bfloat16, 0.5, "diag", None, True),
        (3, 777, 2, 128, torch.float16, float("-inf"), "exact", None, False),
    ]
    for i, (B, L, H, D, dtype, beta, est, sinks, diag) in enumerate(cases):
        g = torch.Generator(device="cuda").manual_seed(1000 + i)
        q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=dtype, generator=g) for _ in range(3))
        kw = dict(beta=beta, estimator=est, sinks=sinks, keep_diagonal=diag, return_stats=True)
        poison_allocator(q.numel() * q.element_size())
        out, st = kernels.sol_attention(q, k, v, **kw)
        ref, rst = kernels.sol_attention_reference(q, k, v, **kw)
        entry = dict(shape=[B, L, H, D], dtype=str(dtype), beta=beta, estimator=est, sinks=sinks,
                     keep_diagonal=diag, rel_l2_vs_reference=rel_l2(out, ref),
                     all_finite=bool(torch.isfinite(out).all()),
                     density_kernel=st["density"].mean().item(), density_reference=rst["density"].mean().item())
        entry["ok"] = entry["all_finite"] and entry["rel_l2_vs_reference"] < 2e-2
        results["checks"].append(entry)
        print(f"check sol {entry['shape']} {dtype} β={beta} {est}: rel_l2={entry['rel_l2_vs_reference']:.2e} "
              f"finite={entry['all_finite']} density {entry['density_kernel']:.3f}/{entry['density_reference']:.3f}",
              flush=True)


def flex_block_mask(selection, L, block=64):
    """FlexAttention BlockMask whose picked blocks of a bool (B, H, N, N) mask are all full."""
    from torch.nn.attention.flex_attention import BlockMask

    counts = selection.sum(-1, dtype=torch.int32)
    ids = torch.argsort((~selection).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    zeros = torch.zeros_like(counts)
    return BlockMask.from_kv_blocks(zeros, torch.zeros_like(ids), counts, ids, BLOCK_SIZE=block, seq_lengths=(L, L))


def bench_sol(results, seqs, densities, H, D, rep_ms, flex_seqs):
    flex = None
    if flex_seqs:
        from torch.nn.attention.flex_attention import flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
    for L in seqs:
        q, k, v = random_qkv(L, H, D, torch.bfloat16, seed=L)
        ref = cudnn_sdpa(q, k, v)
        t_dense = bench_ms(lambda: cudnn_sdpa(q, k, v), rep_ms)
        mem_dense = peak_extra_mb(lambda: cudnn_sdpa(q, k, v))
        print(f"L={L}: cuDNN {t_dense:.2f} ms", flush=True)
        lens = block_lengths(L, q.device)
        for rho in densities:
            beta = kernels.beta_for_density(rho)
            t0 = time.perf_counter()
            out, st = kernels.sol_attention(q, k, v, beta=beta, return_stats=True)
            torch.cuda.synchronize()
            first_call_s = time.perf_counter() - t0
            density = st["density"].mean().item()
            t_sol = bench_ms(lambda: kernels.sol_attention(q, k, v, beta=beta), rep_ms)
            mem_sol = peak_extra_mb(lambda: kernels.sol_attention(q, k, v, beta=beta))
            sel = kernels.sol_block_selection(q, k, v, beta=beta)
            lists = block_lists_from_selection(sel, L)
            unused = torch.zeros(1, device="cuda", dtype=q.dtype)
            scale = 1 / math.sqrt(D)

            def run_lists():
                return launch_sol_kernel(q, k, v, unused, unused, unused.float(), unused.to(torch.int8), lens,
                                         scale=scale, keep_diagonal=False, route=False, correction=False,
                                         block_lists=lists)[0]

            t_lists = bench_ms(run_lists, rep_ms)
            n_keep = max(64, int(round(density * L)))
            t_ideal = bench_ms(lambda: cudnn_sdpa(q, k[:, :n_keep], v[:, :n_keep]), rep_ms)
            row = dict(L=L, heads=H, head_dim=D, target_density=rho, beta=beta, density=density,
                       cudnn_ms=t_dense, sol_ms=t_sol, speedup=t_dense / t_sol,
                       precomputed_mask_ms=t_lists, routing_and_correction_overhead=t_sol / t_lists - 1,
                       ideal_ms=t_ideal, ideal_speedup=t_dense / t_ideal,
                       rel_l2_vs_dense=rel_l2(out, ref), row_cosine_vs_dense=row_cosine(out, ref),
                       first_call_s=first_call_s, peak_extra_mb_sol=mem_sol, peak_extra_mb_cudnn=mem_dense,
                       inputs_mb=3 * q.numel() * 2 / 2**20)
            if flex is not None and L in flex_seqs:
                try:
                    bm = flex_block_mask(sel, L)
                    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
                    opts = {"BLOCK_M": 64, "BLOCK_N": 64}
                    flex(qt, kt, vt, block_mask=bm, kernel_options=opts)
                    row["flex_ms"] = bench_ms(lambda: flex(qt, kt, vt, block_mask=bm, kernel_options=opts), rep_ms)
                    row["flex_speedup"] = t_dense / row["flex_ms"]
                except Exception as exc:  # record why FlexAttention could not run, keep the job going
                    row["flex_error"] = f"{type(exc).__name__}: {exc}"[:300]
            results["sol"].append(row)
            save(results)
            print(f"  ρ={rho:.2f} β={beta:.2f} density={density:.3f} sol {t_sol:.2f} ms ({t_dense / t_sol:.2f}x) "
                  f"lists {t_lists:.2f} ms (overhead {100 * (t_sol / t_lists - 1):.1f}%) ideal {t_dense / t_ideal:.2f}x "
                  f"flex {row.get('flex_speedup', float('nan')):.2f}x rel_l2 {row['rel_l2_vs_dense']:.3f} "
                  f"mem +{mem_sol:.0f}MB vs +{mem_dense:.0f}MB first {first_call_s:.1f}s", flush=True)
            del sel, lists, out


def sweep_sol(results, L, rho, H, D, rep_ms, configs):
    """Time launch configurations (warps:stages:per_sm:tma) of the Sol kernel, fused and fed
    precomputed lists."""
    q, k, v = random_qkv(L, H, D, torch.bfloat16, seed=7)
    beta = kernels.beta_for_density(rho)
    from kernels.sol_routing import block_thresholds, forced_key_blocks, pooled_blocks

    scale = 1 / math.sqrt(D)
    q_mean, k_mean32, k_mean, v_mean, lens = pooled_blocks(q, k, v)
    tau = block_thresholds(q_mean, k_mean32, torch.full((H,), beta, device="cuda"), "exact", scale).contiguous()
    forced = forced_key_blocks([], L, q.device).to(torch.int8)
    k_mean, v_mean = k_mean.contiguous(), v_mean.contiguous()
    lists = block_lists_from_selection(kernels.sol_block_selection(q, k, v, beta=beta), L)
    t_dense = bench_ms(lambda: cudnn_sdpa(q, k, v), rep_ms)
    t_prep = bench_ms(lambda: block_thresholds(*pooled_blocks(q, k, v)[:2], torch.full((H,), beta, device="cuda"),
                                               "exact", scale), rep_ms)
    for warps, stages, per_sm, tma, *chunk in configs:
        chunk = chunk[0] if chunk else SOL_CHUNK
        row = dict(L=L, target_density=rho, num_warps=warps, num_stages=stages, programs_per_sm=per_sm,
                   tma=bool(tma), chunk=chunk, cudnn_ms=t_dense, prep_ms=t_prep)
        try:
            fused = lambda: launch_sol_kernel(q, k, v, k_mean, v_mean, tau, forced, lens, scale=scale,  # noqa: E731
                                              keep_diagonal=False, num_warps=warps, num_stages=stages,
                                              programs_per_sm=per_sm, tma=bool(tma), chunk=chunk)
            plain = lambda: launch_sol_kernel(q, k, v, k_mean, v_mean, tau, forced, lens, scale=scale,  # noqa: E731
                                              keep_diagonal=False, route=False, correction=False,
                                              block_lists=lists, num_warps=warps, num_stages=stages,
                                              programs_per_sm=per_sm, tma=bool(tma))
            # The routing pass without the correction: what picking and staging cost alone.
            route_only = lambda: launch_sol_kernel(q, k, v, k_mean, v_mean, tau, forced, lens, scale=scale,  # noqa: E731
                                                   keep_diagonal=False, correction=False, num_warps=warps,
                                                   num_stages=stages, programs_per_sm=per_sm, tma=bool(tma),
                                                   chunk=chunk)
            row["fused_kernel_ms"] = bench_ms(fused, rep_ms)
            row["lists_kernel_ms"] = bench_ms(plain, rep_ms)
            row["routing_without_correction_ms"] = bench_ms(route_only, rep_ms)
        except Exception as exc:  # a configuration that does not compile or fit is recorded, not fatal
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        results["sweep"].append(row)
        print("sweep", {k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in row.items()}, flush=True)


PSA_ORDERS = ("heaviest", "head")

PSA_SHAPES = {
    # name: (grid, tile), the paper's settings
    "wan720p": ((21, 45, 80), (3, 8, 16)),
    "wan720p_unpadded": ((21, 48, 80), (3, 8, 16)),
    "hunyuan768p": ((30, 48, 80), (6, 8, 8)),
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
    cases = [((5, 9, 12), (2, 4, 8), 0, 1, 3, 128, torch.bfloat16),
             ((6, 16, 16), (3, 8, 8), 77, 2, 2, 64, torch.float16),
             ((21, 45, 80), (3, 8, 16), 0, 1, 2, 128, torch.bfloat16)]
    for i, (grid, tile, extra, B, H, D, dtype) in enumerate(cases):
        L = grid[0] * grid[1] * grid[2] + extra
        g = torch.Generator(device="cuda").manual_seed(2000 + i)
        q, k, v = (torch.randn(B, L, H, D, device="cuda", dtype=dtype, generator=g) for _ in range(3))
        params, dens = psa_params_for_density(grid, tile, H, 0.3)
        poison_allocator(q.numel() * q.element_size())
        out = kernels.psa_attention(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
        ref = kernels.psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
        entry = dict(method="psa", grid=grid, tile=tile, extra_tokens=extra, shape=[B, L, H, D], dtype=str(dtype),
                     rel_l2_vs_reference=rel_l2(out, ref), all_finite=bool(torch.isfinite(out).all()))
        entry["ok"] = entry["all_finite"] and entry["rel_l2_vs_reference"] < 2e-2
        results["checks"].append(entry)
        print(f"check psa {grid} {tile} extra={extra} {dtype}: rel_l2={entry['rel_l2_vs_reference']:.2e} "
              f"finite={entry['all_finite']}", flush=True)


def flex_psa_block_mask(grid, params, tile, L):
    """FlexAttention block mask (128-token blocks) equal to the PSA mask, on blocked inputs."""
    from kernels.psa_mask import psa_block_mask

    bt = tile[0] * tile[1] * tile[2]
    rep = bt // 128
    m = psa_block_mask(grid, params, tile).cuda()
    m = m.repeat_interleave(rep, dim=1).repeat_interleave(rep, dim=2)[None]
    return flex_block_mask(m, L, block=128)


def bench_psa(results, shapes, densities, H, D, rep_ms, flex_on):
    from kernels.layout import tile_layout

    flex = None
    if flex_on:
        from torch.nn.attention.flex_attention import flex_attention

        flex = torch.compile(flex_attention, dynamic=False)
    for name in shapes:
        grid, tile = PSA_SHAPES[name]
        L = grid[0] * grid[1] * grid[2]
        q, k, v = random_qkv(L, H, D, torch.bfloat16, seed=L + 1)
        t_dense = bench_ms(lambda: cudnn_sdpa(q, k, v), rep_ms)
        mem_dense = peak_extra_mb(lambda: cudnn_sdpa(q, k, v))
        print(f"PSA {name} grid={grid} tile={tile} L={L}: cuDNN {t_dense:.2f} ms", flush=True)
        for rho in densities:
            params, dens = psa_params_for_density(grid, tile, H, rho)
            kw = dict(grid=grid, params=params, tile=tile)
            t0 = time.perf_counter()
            kernels.psa_attention(q, k, v, **kw)
            torch.cuda.synchronize()
            first_call_s = time.perf_counter() - t0
            t_psa = bench_ms(lambda: kernels.psa_attention(q, k, v, **kw), rep_ms)
            mem = peak_extra_mb(lambda: kernels.psa_attention(q, k, v, **kw))
            n_keep = max(64, int(round(dens * L)))
            t_ideal = bench_ms(lambda: cudnn_sdpa(q, k[:, :n_keep], v[:, :n_keep]), rep_ms)
            row = dict(shape=name, grid=grid, tile=tile, L=L, heads=H, head_dim=D, target_density=rho,
                       density=dens, cudnn_ms=t_dense, psa_ms=t_psa, speedup=t_dense / t_psa,
                       ideal_ms=t_ideal, ideal_speedup=t_dense / t_ideal, share_of_ideal=t_ideal / t_psa,
                       first_call_s=first_call_s, peak_extra_mb_psa=mem, peak_extra_mb_cudnn=mem_dense)
            if flex is not None:
                try:
                    lay = tile_layout(grid, tile, pad=True, device="cuda")
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
            print(f"  ρ={rho:.2f} density={dens:.3f} psa {t_psa:.2f} ms ({t_dense / t_psa:.2f}x, "
                  f"{100 * t_ideal / t_psa:.0f}% of ideal {t_dense / t_ideal:.2f}x) "
                  f"flex {row.get('flex_speedup', float('nan')):.2f}x mem +{mem:.0f}MB vs +{mem_dense:.0f}MB "
                  f"first {first_call_s:.1f}s", flush=True)


def sweep_psa(results, name, rho, H, D, rep_ms, configs):
    """Time PSA launch configurations (block_n:warps:stages:mode[:order]) on one shape."""
    from kernels.layout import tile_layout
    from kernels.psa_triton import launch_psa_kernel

    grid, tile = PSA_SHAPES[name]
    L = grid[0] * grid[1] * grid[2]
    q, k, v = random_qkv(L, H, D, torch.bfloat16, seed=5)
    params, dens = psa_params_for_density(grid, tile, H, rho)
    lay = tile_layout(grid, tile, pad=True, device="cuda")
    blocked = [lay.to_blocks(x, dim=1) for x in (q, k, v)]
    scale = 1 / math.sqrt(D)
    t_dense = bench_ms(lambda: cudnn_sdpa(q, k, v), rep_ms)
    for block_n, warps, stages, mode, *order in configs:
        # mode: 0 pre-permuted inputs, 1 slot map, 2 slot map + TMA boxes for whole tiles;
        # order: 0 heaviest (head, block) first, 1 head by head (kernels/psa_triton.py)
        order = PSA_ORDERS[order[0] if order else 1]
        args = (q, k, v) if mode else blocked
        row = dict(shape=name, target_density=rho, density=dens, block_n=block_n, num_warps=warps,
                   num_stages=stages, mode=["pre-permuted", "slot map", "slot map + TMA"][mode], order=order,
                   cudnn_ms=t_dense)
        try:
            fn = lambda: launch_psa_kernel(*args, grid, params, tile, 0, scale=scale, block_n=block_n,  # noqa: E731
                                           num_warps=warps, num_stages=stages, gather=mode > 0, tma=mode == 2,
                                           order=order)
            row["psa_kernel_ms"] = bench_ms(fn, rep_ms)
            row["speedup"] = t_dense / row["psa_kernel_ms"]
        except Exception as exc:  # a configuration that does not compile or fit is recorded, not fatal
            row["error"] = f"{type(exc).__name__}: {exc}"[:300]
        results["sweep"].append(row)
        save(results)
        print("sweep psa", {k_: (round(v_, 3) if isinstance(v_, float) else v_) for k_, v_ in row.items()}, flush=True)


def bench_dense_ceiling(results, H, D, rep_ms):
    """Per-block efficiency with every block visited (80,640 tokens, 21x48x80, no padding):
    cuDNN; FlexAttention without a mask (Triton's generated dense kernel in this stack); our
    PSA kernel with the full mask; our Sol loop (64-row tiles) fed every block; a plain dense
    Triton loop without and with automatic warp specialization (benchmarks/dense_ws_probe.py).
    The ratio of each to cuDNN bounds what a block-sparse kernel of the same loop can reach per
    block."""
    from benchmarks.dense_ws_probe import VARIANTS as DENSE_PROBES, dense_attention, kernel_facts
    from kernels.psa_triton import launch_psa_kernel
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
    n = -(-L // 64)
    lists = block_lists_from_selection(torch.ones(1, H, n, n, dtype=torch.bool, device="cuda"), L)
    lens = block_lengths(L, q.device)
    unused = torch.zeros(1, device="cuda", dtype=q.dtype)
    variants = {
        "psa_full_mask": lambda: launch_psa_kernel(q, k, v, grid, full, tile, 0, scale=scale),
        "sol_loop_all_blocks": lambda: launch_sol_kernel(
            q, k, v, unused, unused, unused.float(), unused.to(torch.int8), lens, scale=scale, keep_diagonal=False,
            route=False, correction=False, block_lists=lists)[0],
    }
    flex = torch.compile(flex_attention, dynamic=False)
    qt, kt, vt = (x.transpose(1, 2) for x in (q, k, v))
    variants["flex_no_mask"] = lambda: flex(qt, kt, vt).transpose(1, 2)
    probe_kernels = {}  # what this Triton compiled for each probe, kept from its timed launches

    def run_probe(name, ws, block_m):
        out, probe_kernels[name] = dense_attention(q, k, v, ws, block_m)
        return out

    for name, (ws, block_m) in DENSE_PROBES.items():
        variants[name] = lambda name=name, ws=ws, block_m=block_m: run_probe(name, ws, block_m)
    results["ceiling"] = row
    for name, fn in variants.items():
        try:
            err = rel_l2(fn(), ref)
            ms = bench_ms(fn, rep_ms)
            row[name] = dict(ms=ms, share_of_cudnn=t_dense / ms, rel_l2_vs_cudnn=err)
            if name in probe_kernels:  # whether this Triton partitioned the loop, and at what cost in warps
                row[name].update(kernel_facts(probe_kernels[name]))
        except Exception as exc:  # record why a variant could not run, keep the job going
            row[name] = dict(error=f"{type(exc).__name__}: {exc}"[:300])
        print(f"ceiling {name}: {row[name]}", flush=True)
        save(results)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="JSON file to write")
    ap.add_argument("--sol-seqs", default="16384,32768,75600,131072")
    ap.add_argument("--densities", default="0.05,0.10,0.15,0.20")
    ap.add_argument("--flex-seqs", default="75600", help="sequence lengths that also time FlexAttention ('' for none)")
    ap.add_argument("--heads", type=int, default=40)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--rep-ms", type=int, default=400)
    ap.add_argument("--skip-checks", action="store_true")
    ap.add_argument("--psa-shapes", default="wan720p,wan720p_unpadded,hunyuan768p")
    ap.add_argument("--psa-densities", default="0.15,0.40")
    ap.add_argument("--no-flex", action="store_true")
    ap.add_argument("--psa-sweep", default="", help="PSA configs block_n:warps:stages:mode[:order],... on wan720p "
                    "(mode 0 pre-permuted, 1 slot map, 2 slot map + TMA; order 0 heaviest first, 1 head by head)")
    ap.add_argument("--ceiling", action="store_true", help="also time the kernels with every block visited")
    ap.add_argument("--sweep", default="", help="Sol launch configs warps:stages:per_sm:tma[:chunk],... timed at "
                    "75,600 tokens (chunk: pooled keys per routing step)")
    args = ap.parse_args()
    ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
    global OUT_PATH
    OUT_PATH = args.out
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    results = dict(command="python " + " ".join(sys.argv), started=time.strftime("%Y-%m-%d %H:%M:%S"),
                   device=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
                   python=platform.python_version(), checks=[], sol=[], sweep=[], psa=[])
    if not args.skip_checks:
        check_sol(results)
        check_psa(results)
    if args.ceiling:
        bench_dense_ceiling(results, args.heads, args.head_dim, args.rep_ms)
    if args.psa_sweep:
        configs = [tuple(int(x) for x in c.split(":")) for c in args.psa_sweep.split(",")]
        for rho in (0.15, 0.40):
            sweep_psa(results, "wan720p", rho, args.heads, args.head_dim, args.rep_ms, configs)
    if args.sweep:
        configs = [tuple(int(x) for x in c.split(":")) for c in args.sweep.split(",")]
        for rho in (0.10, 0.15):
            sweep_sol(results, 75600, rho, args.heads, args.head_dim, args.rep_ms, configs)
    bench_sol(results, ints(args.sol_seqs), [float(x) for x in args.densities.split(",")], args.heads,
              args.head_dim, args.rep_ms, [] if args.no_flex else ints(args.flex_seqs))
    bench_psa(results, [x for x in args.psa_shapes.split(",") if x], [float(x) for x in args.psa_densities.split(",")],
              args.heads, args.head_dim, args.rep_ms, not args.no_flex)
    save(results)
    print("wrote", args.out)


if __name__ == "__main__":
    main()
