"""Public Sol-Attn entry point (Triton). The float specification is ``sol_reference``.

Per group of heads: pool the blocks (``sol_router.pool_blocks``), route (``sol_router.route``:
the thresholds, whose reference is ``sol_routing.block_thresholds``, then a compact block mask
and its bitmap), then the engine (``block_sparse``) writes those heads of the output in place,
pooled term first (on Hopper one launch per head where a head's K and V exceed the L2 cache:
``hopper_loop.ws_block_sparse_attention``). Heads run in groups so that the per-call scratch
(pooled means, bitmaps, and the id lists of the portable loop or the pair streams of the
Hopper loop: ``sol_router.scratch_bytes_per_head``) stays within ``SCRATCH_SHARE`` of the
output's size; no step reads anything back to the host, so the call never synchronises the
device and can be captured in a CUDA graph.
"""
from __future__ import annotations

import torch

from ._checks import unit_stride_last_dim
from .block_sparse import block_sparse_attention, uses_hopper_loop
from .launch_config import config_for_device
from .sol_reference import check_sol_call
from .sol_router import pool_blocks, pooled_term, route, scratch_bytes_per_head

# Scratch memory per call, as a share of the output (dense attention allocates the output
# too): the benchmark's target is "peak extra memory <= dense + 5 %". Small calls may use
# SCRATCH_FLOOR bytes regardless.
SCRATCH_SHARE = 0.04
SCRATCH_FLOOR = 32 * 2**20


def head_groups(num_heads: int, per_head_bytes: int, output_bytes: int) -> list[tuple[int, int]]:
    """[(first, end), ...] contiguous head ranges whose scratch fits the budget (>= 1 head), as
    few as fit and as even as they can be: each group is one launch of the loop, whose last
    wave leaves SMs idle, so 40 heads by 12 run as 10, 10, 10, 10 rather than 12, 12, 12, 4."""
    budget = max(SCRATCH_SHARE * output_bytes, SCRATCH_FLOOR)
    most = max(1, min(num_heads, int(budget // max(1, per_head_bytes))))
    n_groups = -(-num_heads // most)
    bounds = [num_heads * g // n_groups for g in range(n_groups + 1)]
    return list(zip(bounds[:-1], bounds[1:]))


def sol_attention(q, k, v, *, beta, estimator="exact", grid=None, tile=None, sinks=None, keep_diagonal=False,
                  correction=True, scale=None, return_stats=False, config=None):
    """Sol-Attn self-attention of q, k, v (B, L, H, D) on CUDA, fp16/bf16, D in {64, 128}.

    beta: float or (H,) tensor, the threshold τ_i = μ_i + β·σ_i in standard deviations of the
    proxy scores (``beta_for_density`` converts a target density). estimator: "exact" (d×d
    covariance) or "diag". grid: (T, H, W) of the video tokens, which come first in row-major
    order; blocks are then 3D tiles of 64 tokens (``tile``, default ``sol_tile_for_grid``) and
    the tokens after the grid are always-exact sinks. Without a grid: row-major blocks of 64,
    and ``sinks`` (start, end) token ranges whose key blocks are always exact.
    keep_diagonal: also force key blocks within ±1 of the query block (block index) exact.
    correction: the paper's pooled term for the blocks not computed exactly (False: plain
    block-sparse). config: a ``launch_config.LaunchConfig`` to force (default: the device's).
    Returns (B, L, H, D) in the input dtype; with ``return_stats`` also
    ``{"density": (B, H) float32, "exact_blocks": (B, H, N) int32}``: the share of exact
    (query block, key block) pairs and the number of exact key blocks per query block.
    """
    layout, forced, beta, scale = check_sol_call(q, k, v, beta=beta, estimator=estimator, grid=grid, tile=tile,
                                                 sinks=sinks, scale=scale, for_kernel=True)
    q, k, v = (unit_stride_last_dim(t) for t in (q, k, v))
    B, L, H, D = q.shape
    out = torch.empty((B, L, H, D), device=q.device, dtype=q.dtype)
    config = config or config_for_device(q.device)
    # The Hopper loop reads pair streams made from the bitmap, the portable one id lists.
    lists = not uses_hopper_loop(q, k, v, layout, layout.block_tokens, pooled=correction, config=config)
    per_head = scratch_bytes_per_head(B, layout, D, q.element_size(), lists=lists)
    exact_blocks = []
    for h0, h1 in head_groups(H, per_head, out.numel() * out.element_size()):
        # One group's scratch is freed before the next group's is allocated.
        counts = _sol_heads(q, k, v, out, layout, forced, beta, h0, h1, estimator=estimator, scale=scale,
                            keep_diagonal=keep_diagonal, correction=correction, config=config, lists=lists)
        if return_stats:
            exact_blocks.append(counts.sum(-1))
    if return_stats:
        exact = torch.cat(exact_blocks, dim=1)
        return out, {"density": exact.float().mean(-1) / layout.n_blocks, "exact_blocks": exact}
    return out


def _sol_heads(q, k, v, out, layout, forced, beta, h0, h1, *, estimator, scale, keep_diagonal, correction, config,
               lists):
    """Heads h0 .. h1 of the output; returns their exact-block counts (B, h1 - h0, N, 2)."""
    q_mean, k_mean, v_mean = pool_blocks(q, k, v, layout, h0, h1 - h0)
    mask = route(q_mean, k_mean, beta[h0:h1], forced, layout, estimator=estimator, scale=scale,
                 keep_diagonal=keep_diagonal, lists=lists)
    del q_mean
    block_sparse_attention(q, k, v, mask, scale=scale, out=out, head_base=h0, config=config,
                           pooled=pooled_term(k_mean, v_mean, layout) if correction else None)
    return mask.counts
