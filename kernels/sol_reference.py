"""Sol-Attn in plain PyTorch float32: the specification the Triton path is tested against.

Blocks and routing are those of ``sol_rules`` (3D tiles of the grid, extra blocks as sinks,
or row-major blocks). Query row r of block i attends, in one softmax,
- to every token of every exact block with its true score s·q_r·k_tᵀ, and
- to every other block j through one pooled entry: logit s·q_r·K̄_jᵀ + log(len_j) and value
  V̄_j, i.e. exp(s·q_r·K̄_jᵀ)·len_j in the denominator and the same times V̄_j in the numerator
  (the paper's zero-order Taylor term, counted with the block's true length).
Nothing is zeroed: a NaN in q, k or v gives NaN where dense attention does (a query block
whose routing is NaN is all exact, see ``sol_rules``).

``precision="int8"`` or ``"fp8"`` states the kernels' quantized exact blocks
(``quantized_reference``): the exact logits come from the codes, and the pooled keys are K̄_j minus the keys' smoothing
mean, rounded to the input dtype, so both kinds of column move by the same q·m; the routing is
unchanged.
"""
from __future__ import annotations

import torch

from ._checks import check_estimator, check_qkv, check_token_ranges, resolve_scale
from .engine.precision import KERNEL_PRECISIONS, QUANTIZED_PRECISIONS, check_precision
from .quantized_reference import QuantizedOperands, shifted_pooled_keys
from .sol_rules import block_thresholds, exact_blocks, forced_key_blocks, per_head_beta, sol_layout

# Query rows per step of the reference; bounds its memory to rows · L floats per (batch, head).
_REFERENCE_ROWS_PER_CHUNK = 1024


def check_sol_call(q, k, v, *, beta, estimator, grid, tile, sinks, scale, for_kernel):
    """Validate a Sol-Attn call; returns (layout, forced key blocks, β (H,), scale)."""
    B, L, H, D = check_qkv(q, k, v, for_kernel=for_kernel)
    scale = resolve_scale(scale, D)
    check_estimator(estimator)
    sinks = check_token_ranges(sinks, L)
    if grid is not None and sinks:
        raise ValueError("sinks: with grid=(T, H, W) the tokens after the grid are the sinks; "
                         "give sinks only without a grid")
    layout = sol_layout(L, grid, tile, q.device)
    return layout, forced_key_blocks(layout, sinks), per_head_beta(beta, H, q.device), scale


def pooled_means(x: torch.Tensor, layout) -> torch.Tensor:
    """Block means of x (B, L, H, D) over the layout's blocks, rounded to x's dtype: (B, H, N, D)."""
    blocks = layout.token_blocks()
    sums = torch.zeros(x.shape[0], layout.n_blocks, x.shape[2], x.shape[3], dtype=torch.float32, device=x.device)
    sums.index_add_(1, blocks, x.float())
    means = sums / layout.lengths.float()[None, :, None, None]
    return means.to(x.dtype).transpose(1, 2)


def selection_from_means(q_mean, k_mean, tau, forced, scale):
    """The exact blocks (B, H, Nq, N) of query means against key means (any float dtype, (B, H,
    Nq, D) and (B, H, N, D)) at thresholds ``tau`` (B, H, Nq), with the ``forced`` key blocks."""
    proxy = scale * (q_mean.float() @ k_mean.float().transpose(-1, -2))  # (B, H, N, N)
    return exact_blocks(proxy, tau[..., None]) | forced


def sol_block_selection(q, k, v, *, beta, estimator="exact", grid=None, tile=None, sinks=None, scale=None):
    """Exact-block selection of Sol-Attn as a bool tensor (B, H, N, N) over the call's blocks
    (``sol_rules.sol_layout``), for tests and tools. This materialises the N×N map that the
    kernel path never writes; use it on small inputs."""
    layout, forced, beta, scale = check_sol_call(q, k, v, beta=beta, estimator=estimator, grid=grid, tile=tile,
                                                 sinks=sinks, scale=scale, for_kernel=False)
    q_mean, k_mean = pooled_means(q, layout), pooled_means(k, layout)
    tau = block_thresholds(q_mean, k_mean, beta, estimator, scale)
    return selection_from_means(q_mean, k_mean, tau, forced, scale)


def sol_attention_reference(q, k, v, *, beta, estimator="exact", grid=None, tile=None, sinks=None, scale=None,
                            return_stats=False, precision="bf16"):
    """Float32 Sol-Attn on any device; same arguments and result as ``kernels.sol_attention``.
    ``precision``: "bf16" (the exact blocks' QKᵀ of the inputs, in float32), "int8" or "fp8"
    (the kernels' codes, ``quantized_reference``)."""
    precision = check_precision(precision, choices=KERNEL_PRECISIONS)
    layout, forced, beta, scale = check_sol_call(q, k, v, beta=beta, estimator=estimator, grid=grid, tile=tile,
                                                 sinks=sinks, scale=scale, for_kernel=False)
    q_mean, k_mean = pooled_means(q, layout), pooled_means(k, layout)
    tau = block_thresholds(q_mean, k_mean, beta, estimator, scale)
    selection = selection_from_means(q_mean, k_mean, tau, forced, scale)
    out = sol_output_for_selection(q, k, v, selection, layout, scale, precision)
    if return_stats:
        return out, {"density": selection.float().mean(dim=(-1, -2)),
                     "exact_blocks": selection.sum(-1, dtype=torch.int32)}
    return out


def sol_output_for_selection(q, k, v, selection, layout, scale, precision="bf16"):
    """Sol-Attn's output (float32 math, q's dtype) for a given exact-block ``selection`` (B, H,
    N, N) over ``layout``'s blocks: the exact blocks' tokens and every other block's pooled
    entry in one softmax (the module's rule). ``sol_attention_reference`` routes, then calls
    this; a study of another routing rule calls it with its own selection."""
    B, L, H, D = q.shape
    if selection.dtype != torch.bool or tuple(selection.shape) != (B, H, layout.n_blocks, layout.n_blocks):
        raise ValueError(f"sol_output_for_selection: selection must be bool (B, H, N, N) = "
                         f"{(B, H, layout.n_blocks, layout.n_blocks)}, got {selection.dtype} {tuple(selection.shape)}")
    k_mean, v_mean = pooled_means(k, layout), pooled_means(v, layout)
    blocks = layout.token_blocks()
    qf, kf, vf = (t.float().transpose(1, 2) for t in (q, k, v))  # (B, H, L, D)
    codes = QuantizedOperands.of(q, k, layout, precision) if precision in QUANTIZED_PRECISIONS else None
    k_pool = (k_mean if codes is None else shifted_pooled_keys(k_mean, codes.mean)).float()
    v_pool = v_mean.float()
    log_lens = layout.lengths.float().log()
    out = torch.empty_like(qf)
    for r0 in range(0, L, _REFERENCE_ROWS_PER_CHUNK):
        r1 = min(L, r0 + _REFERENCE_ROWS_PER_CHUNK)
        sel_rows = selection[:, :, blocks[r0:r1], :]  # (B, H, R, N)
        token_sel = sel_rows[..., blocks]  # (B, H, R, L)
        exact = scale * qf[:, :, r0:r1] @ kf.transpose(-1, -2) if codes is None else codes.logits(r0, r1, scale)
        exact = exact.masked_fill(~token_sel, float("-inf"))
        pooled = scale * qf[:, :, r0:r1] @ k_pool.transpose(-1, -2) + log_lens
        pooled = pooled.masked_fill(sel_rows, float("-inf"))
        logits = torch.cat([exact, pooled], dim=-1)
        # Rows with no term at all give zeros (not NaN), unless the query row holds a NaN.
        empty = (logits == float("-inf")).all(dim=-1, keepdim=True) & ~qf[:, :, r0:r1].isnan().any(-1, keepdim=True)
        p = torch.softmax(logits.masked_fill(empty, 0.0), dim=-1).masked_fill(empty, 0.0)
        out[:, :, r0:r1] = p[..., :L] @ vf + p[..., L:] @ v_pool
    return out.transpose(1, 2).to(q.dtype)
