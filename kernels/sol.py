"""Public Sol-Attn entry point (Triton). The float specification is ``sol_reference``.

Per group of heads: pool the blocks (``sol_gpu_routing.pool_blocks``), route
(``sol_gpu_routing.route``: the thresholds, whose reference is ``sol_rules.block_thresholds``,
then the block mask), then the engine (``engine``) lowers the mask for its backend and writes
those heads of the output in place, pooled term first. Heads run in groups
(``engine.head_groups``) so that the per-call scratch (pooled means, the mask, the engine's
work form of it and, with quantized (int8, fp8) exact blocks, the quantized keys:
``engine.work_bytes_per_head``) stays within ``engine.SCRATCH_SHARE`` of the output's size (the
key codes in the output's unwritten heads where they fit: the groups run in head order); no
step reads anything back to the host, so the call never synchronises the device and can be
captured in a CUDA graph. With quantized exact blocks the engine sums the group's keys for
their smoothing mean and quantizes them (``engine.quantize``).
"""
from __future__ import annotations

import torch

from ._checks import unit_stride_last_dim
from .engine import block_sparse_attention, code_bytes_per_head, head_groups, work_bytes_per_head
from .engine.launch_config import config_for_device
from .engine.precision import resolve_precision
from .sol_gpu_routing import pool_blocks, pooled_term, route, routing_bytes_per_head
from .sol_reference import check_sol_call


def sol_attention(q, k, v, *, beta, estimator="exact", grid=None, tile=None, sinks=None, scale=None,
                  return_stats=False, config=None, precision="auto"):
    """Sol-Attn self-attention of q, k, v (B, L, H, D) on CUDA, fp16/bf16, D in {64, 128}.

    beta: float or (H,) tensor, the threshold τ_i = μ_i + β·σ_i in standard deviations of the
    proxy scores (``beta_for_density`` converts a target density). estimator: "exact" (d×d
    covariance) or "diag". grid: (T, H, W) of the video tokens, which come first in row-major
    order; blocks are then 3D tiles of 64 tokens (``tile``, default ``sol_tile_for_grid``) and
    the tokens after the grid are always-exact sinks. Without a grid: row-major blocks of 64,
    and ``sinks`` (start, end) token ranges whose key blocks are always exact. config: a
    ``engine.launch_config.LaunchConfig`` to force (default: the device's). precision: of the
    exact blocks' QKᵀ, "auto" (per architecture, ``engine.precision``), "bf16" (the input
    dtype), "int8" or "fp8" (``engine.quantize``; fp8 from sm_89 on); the routing and the
    pooled term stay in the input dtype.
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
    precision = resolve_precision(precision, config, "sol").precision
    pooling, routing = routing_bytes_per_head(layout, D, q.element_size())
    work = work_bytes_per_head(q, k, v, layout, pooled=True, config=config, precision=precision)
    per_head = B * max(pooling, routing + work)
    codes = B * code_bytes_per_head(layout, D, precision)
    exact_blocks = []
    for h0, h1, codes_in_output in head_groups(H, per_head, out.numel() * out.element_size(), codes):
        # One group's scratch is freed before the next group's is allocated.
        counts = _sol_heads(q, k, v, out, layout, forced, beta, h0, h1, estimator=estimator, scale=scale,
                            config=config, precision=precision, codes_in_output=codes_in_output)
        if return_stats:
            exact_blocks.append(counts.sum(-1))
    if return_stats:
        exact = torch.cat(exact_blocks, dim=1)
        return out, {"density": exact.float().mean(-1) / layout.n_blocks, "exact_blocks": exact}
    return out


def _sol_heads(q, k, v, out, layout, forced, beta, h0, h1, *, estimator, scale, config, precision,
               codes_in_output):
    """Heads h0 .. h1 of the output (quantized keys' codes in its heads from h1 on with
    ``codes_in_output``); returns their exact-block counts (B, h1 - h0, N, 2)."""
    q_mean, k_mean, v_mean = pool_blocks(q, k, v, layout, h0, h1 - h0)
    mask = route(q_mean, k_mean, beta[h0:h1], forced, layout, estimator=estimator, scale=scale)
    del q_mean
    block_sparse_attention(q, k, v, mask, scale=scale, out=out, head_base=h0, config=config,
                           pooled=pooled_term(k_mean, v_mean, layout), precision=precision,
                           codes_in_output=codes_in_output)
    return mask.counts
