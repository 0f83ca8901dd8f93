"""Public Sol-Attn entry point (Triton). The float specification is ``sol_reference``."""
from __future__ import annotations

import torch

from ._checks import (
    check_estimator,
    check_qkv,
    check_token_ranges,
    per_head_beta,
    resolve_scale,
    unit_stride_last_dim,
)
from .sol_routing import block_thresholds, forced_key_blocks, pooled_blocks, with_reorder
from .sol_triton import launch_sol_kernel


def _sol_attention_kernel(
    q,
    k,
    v,
    *,
    beta,
    estimator="exact",
    sinks=None,
    keep_diagonal=False,
    scale=None,
    return_stats=False,
):
    """Sol-Attn self-attention of q, k, v (B, L, H, D) on CUDA, fp16/bf16, D in {64, 128}.

    beta: float or (H,) tensor, the threshold τ_i = μ_i + β·σ_i in standard deviations of the
    proxy scores (``beta_for_density`` converts a target density). estimator: "exact" (d×d
    covariance) or "diag". sinks: (start, end) token ranges whose key blocks are always exact.
    keep_diagonal: also force key blocks within ±1 of the query block exact.
    Returns (B, L, H, D) in the input dtype; with ``return_stats`` also
    ``{"density": (B, H) float32}``, the share of exact (query block, key block) pairs counted
    by the kernel itself.
    """
    B, L, H, D = check_qkv(q, k, v, for_kernel=True)
    scale = resolve_scale(scale, D)
    check_estimator(estimator)
    sinks = check_token_ranges(sinks, L)
    beta = per_head_beta(beta, H, q.device)
    q, k, v = (unit_stride_last_dim(t) for t in (q, k, v))
    q_mean, k_mean32, k_mean, v_mean, lens = pooled_blocks(q, k, v)
    tau = block_thresholds(q_mean, k_mean32, beta, estimator, scale).contiguous()
    forced = forced_key_blocks(sinks, L, q.device).to(torch.int8)
    out, counts = launch_sol_kernel(
        q, k, v, k_mean.contiguous(), v_mean.contiguous(), tau, forced, lens,
        scale=scale, keep_diagonal=keep_diagonal,
    )
    if return_stats:
        return out, {"density": counts.float().mean(dim=-1) / lens.shape[0]}
    return out


sol_attention = with_reorder(_sol_attention_kernel, "sol_attention")
