"""Public Sol-Attn entry point (Triton). The float specification is ``sol_reference``.

Per group of heads: pool the blocks (``sol_gpu_routing.pool_blocks``), route
(``sol_gpu_routing.route``: the thresholds, whose reference is ``sol_rules.block_thresholds``,
then the block mask), then the engine (``engine``) lowers the mask for its backend and writes
those heads of the output in place, pooled term first. Heads run in groups so that the
per-call scratch (pooled means, the mask, and the engine's work form of it:
``engine.work_bytes_per_head``) stays within ``SCRATCH_SHARE`` of the output's size; no step
reads anything back to the host, so the call never synchronises the device and can be
captured in a CUDA graph.
"""
from __future__ import annotations

import torch

from ._checks import unit_stride_last_dim
from .engine import block_sparse_attention, work_bytes_per_head
from .engine.launch_config import config_for_device
from .sol_gpu_routing import pool_blocks, pooled_term, route, routing_bytes_per_head
from .sol_reference import check_sol_call

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


def sol_attention(q, k, v, *, beta, estimator="exact", grid=None, tile=None, sinks=None, scale=None,
                  return_stats=False, config=None):
    """Sol-Attn self-attention of q, k, v (B, L, H, D) on CUDA, fp16/bf16, D in {64, 128}.

    beta: float or (H,) tensor, the threshold τ_i = μ_i + β·σ_i in standard deviations of the
    proxy scores (``beta_for_density`` converts a target density). estimator: "exact" (d×d
    covariance) or "diag". grid: (T, H, W) of the video tokens, which come first in row-major
    order; blocks are then 3D tiles of 64 tokens (``tile``, default ``sol_tile_for_grid``) and
    the tokens after the grid are always-exact sinks. Without a grid: row-major blocks of 64,
    and ``sinks`` (start, end) token ranges whose key blocks are always exact. config: a
    ``engine.launch_config.LaunchConfig`` to force (default: the device's).
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
    pooling, routing = routing_bytes_per_head(layout, D, q.element_size())
    per_head = B * max(pooling, routing + work_bytes_per_head(q, k, v, layout, pooled=True, config=config))
    exact_blocks = []
    for h0, h1 in head_groups(H, per_head, out.numel() * out.element_size()):
        # One group's scratch is freed before the next group's is allocated.
        counts = _sol_heads(q, k, v, out, layout, forced, beta, h0, h1, estimator=estimator, scale=scale,
                            config=config)
        if return_stats:
            exact_blocks.append(counts.sum(-1))
    if return_stats:
        exact = torch.cat(exact_blocks, dim=1)
        return out, {"density": exact.float().mean(-1) / layout.n_blocks, "exact_blocks": exact}
    return out


def _sol_heads(q, k, v, out, layout, forced, beta, h0, h1, *, estimator, scale, config):
    """Heads h0 .. h1 of the output; returns their exact-block counts (B, h1 - h0, N, 2)."""
    q_mean, k_mean, v_mean = pool_blocks(q, k, v, layout, h0, h1 - h0)
    mask = route(q_mean, k_mean, beta[h0:h1], forced, layout, estimator=estimator, scale=scale)
    del q_mean
    block_sparse_attention(q, k, v, mask, scale=scale, out=out, head_base=h0, config=config,
                           pooled=pooled_term(k_mean, v_mean, layout))
    return mask.counts
