"""Sol-Attn in plain PyTorch float32: the specification the Triton kernel is tested against.

Per query block i, a key block j is *exact* when its proxy score ŝ_ij exceeds τ_i (see
``sol_routing``), or when it is forced (sink tokens, ±1 diagonal). Query row r of block i
then attends, in one softmax,
- to every token of every exact block with its true score s·q_r·k_tᵀ, and
- to every other block j through one pooled entry: logit s·q_r·K̄_jᵀ + log(len_j) and value
  V̄_j (the block's mean value), i.e. exp(s·q_r·K̄_jᵀ)·len_j in the denominator and
  exp(s·q_r·K̄_jᵀ)·len_j·V̄_j = exp(s·q_r·K̄_jᵀ)·V̂_j in the numerator (the paper's zero-order
  Taylor term, counted with the block's true length).
A row with no term at all (only possible with ``correction=False``) outputs zeros. Nothing
else is zeroed: a NaN in q, k or v gives NaN where dense attention does (a query block whose
routing is NaN is all exact, see ``sol_routing``).
"""
from __future__ import annotations

import torch

from ._checks import check_estimator, check_qkv, check_token_ranges, per_head_beta, resolve_scale
from .sol_routing import SOL_BLOCK, block_thresholds, exact_blocks, forced_key_blocks, pooled_blocks, with_reorder

# Query blocks per chunk of the reference; bounds its memory to chunk·64·L floats per head.
_REFERENCE_QUERY_BLOCKS_PER_CHUNK = 16


def sol_block_selection(q, k, v, *, beta, estimator="exact", sinks=None, keep_diagonal=False, scale=None):
    """Exact-block selection of Sol-Attn as a bool tensor (B, H, N, N) (for tests and tools).

    This materialises the N×N map that the kernel never writes; use it on small inputs.
    """
    B, L, H, D = check_qkv(q, k, v, for_kernel=False)
    scale = resolve_scale(scale, D)
    beta = per_head_beta(beta, H, q.device)
    check_estimator(estimator)
    sinks = check_token_ranges(sinks, L)
    q_mean, k_mean32, k_mean, _, _ = pooled_blocks(q, k, v)
    tau = block_thresholds(q_mean, k_mean32, beta, estimator, scale)
    return _selection(q_mean, k_mean, tau, sinks, keep_diagonal, scale, L)


def _selection(q_mean, k_mean, tau, sinks, keep_diagonal, scale, seq_len):
    proxy = scale * (q_mean @ k_mean.float().transpose(-1, -2))  # (B, H, N, N)
    selected = exact_blocks(proxy, tau[..., None])
    selected |= forced_key_blocks(sinks, seq_len, proxy.device)
    if keep_diagonal:
        n = proxy.shape[-1]
        idx = torch.arange(n, device=proxy.device)
        selected |= (idx[:, None] - idx[None, :]).abs() <= 1
    return selected


def _sol_attention_reference(
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
    selection=None,
    correction=True,
):
    """Float32 Sol-Attn on any device; same arguments and result as ``sol_attention``.

    Extra arguments for studies: ``selection`` (bool (B, H, N, N)) replaces the routing with
    a given block mask; ``correction=False`` drops the pooled term (plain block-sparse).
    """
    B, L, H, D = check_qkv(q, k, v, for_kernel=False)
    scale = resolve_scale(scale, D)
    check_estimator(estimator)
    sinks = check_token_ranges(sinks, L)
    q_mean, k_mean32, k_mean, v_mean, lens = pooled_blocks(q, k, v)
    n = lens.shape[0]
    if selection is None:
        tau = block_thresholds(q_mean, k_mean32, per_head_beta(beta, H, q.device), estimator, scale)
        selection = _selection(q_mean, k_mean, tau, sinks, keep_diagonal, scale, L)
    elif selection.shape != (B, H, n, n) or selection.dtype != torch.bool:
        raise ValueError(f"selection must be a bool tensor of shape (B, H, N, N) = {(B, H, n, n)}")

    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))  # (B, H, L, D)
    k_pool = k_mean.float()
    v_pool = v_mean.float()
    log_lens = lens.log()
    out = torch.empty_like(qf)
    rows_per_chunk = _REFERENCE_QUERY_BLOCKS_PER_CHUNK * SOL_BLOCK
    for r0 in range(0, L, rows_per_chunk):
        r1 = min(L, r0 + rows_per_chunk)
        block_of_row = torch.arange(r0, r1, device=q.device) // SOL_BLOCK
        sel_rows = selection[:, :, block_of_row, :]  # (B, H, R, N)
        token_sel = sel_rows.repeat_interleave(SOL_BLOCK, dim=-1)[..., :L]
        exact = (scale * qf[:, :, r0:r1] @ kf.transpose(-1, -2)).masked_fill(~token_sel, float("-inf"))
        pooled = scale * qf[:, :, r0:r1] @ k_pool.transpose(-1, -2) + log_lens
        pooled = pooled.masked_fill(sel_rows | (not correction), float("-inf"))
        logits = torch.cat([exact, pooled], dim=-1)
        p = torch.softmax(logits, dim=-1)
        # A row with no term is all -inf (softmax gives NaN there): zeros by the spec. A NaN
        # from the inputs is kept.
        p = p.masked_fill(torch.isneginf(logits).all(dim=-1, keepdim=True), 0.0)
        out[:, :, r0:r1] = p[..., :L] @ vf + p[..., L:] @ v_pool
    out = out.transpose(1, 2).to(q.dtype)
    if return_stats:
        return out, {"density": selection.float().mean(dim=(-1, -2))}
    return out


sol_attention_reference = with_reorder(_sol_attention_reference, "sol_attention_reference")
