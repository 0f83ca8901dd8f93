"""Sol-Attn routing quantities shared by the float reference and the Triton path.

Everything here is O(L·d + N·d²) per head: block pooling and the per-query-block threshold
τ_i = μ_i + β·σ_i of the paper's eq. (4)–(5). Nothing of size N×N is formed.

Definitions (one head, scale s, N = ceil(L / 64) blocks, block j holds len_j tokens):
- Q̄_i, K̄_j: means of the block's real tokens; V̂_j: sum of the block's values.
- proxy score ŝ_ij = s · Q̄_i · K̄_jᵀ.
- μ_i = s · Q̄_i · m,  m = (1/N) Σ_j K̄_j  (every block weighs the same, tail block too).
- exact estimator:    σ_i² = s² · Q̄_i C Q̄_iᵀ,  C = (1/N) Σ_j (K̄_j − m)(K̄_j − m)ᵀ.
- diagonal estimator: σ_i² = s² · (Q̄_i ⊙ Q̄_i) · diag(C).
- β = −inf selects every block, β = +inf none (before sinks and the diagonal are forced).
- A sequence of a single block is always exact: its one proxy score equals μ and σ = 0, so
  the comparison would be decided by rounding alone.
The pooled keys and summed values are rounded to the input dtype before use, because the
kernel multiplies them on the tensor cores in that dtype; the reference does the same so
both route identically up to float32 summation order.
"""
from __future__ import annotations

import math
import os
import statistics
import sys
import warnings

import torch

SOL_BLOCK = 64

# The documented range of β: expected densities 1 − Φ(β) from ~84 % (β = −1) down to
# ~0.003 % (β = 4). Below it Sol-Attn computes most blocks exactly and saves little; above it
# nearly every block is pooled. Values outside it, ±inf included (every / no block exact,
# used by tests), are accepted with a BetaRangeWarning.
BETA_MIN, BETA_MAX = -1.0, 4.0


class BetaRangeWarning(UserWarning):
    """β outside [BETA_MIN, BETA_MAX]; filter it with ``warnings.filterwarnings``."""


def num_blocks(seq_len: int, block: int = SOL_BLOCK) -> int:
    return -(-seq_len // block)


def block_lengths(seq_len: int, device, block: int = SOL_BLOCK) -> torch.Tensor:
    """Real token count of each block (the last one may be short), float32 (N,)."""
    n = num_blocks(seq_len, block)
    lens = torch.full((n,), float(block), device=device, dtype=torch.float32)
    lens[-1] = seq_len - (n - 1) * block
    return lens


def block_sums(x: torch.Tensor, block: int = SOL_BLOCK) -> torch.Tensor:
    """Sum of each block of tokens of x (B, L, H, D), float32 (B, H, N, D).

    Reduces views of x with a float32 accumulator, so no float32 copy of x is made.
    """
    B, L, H, D = x.shape
    full = L // block
    parts = []
    if full:
        parts.append(x[:, : full * block].unflatten(1, (full, block)).sum(dim=2, dtype=torch.float32))
    if L > full * block:
        parts.append(x[:, full * block :].sum(dim=1, keepdim=True, dtype=torch.float32))
    return torch.cat(parts, dim=1).transpose(1, 2)


def pooled_blocks(q, k, v, block: int = SOL_BLOCK):
    """(q̄ float32, k̄ and v̂ rounded to the input dtype, lens) for q/k/v of shape (B, L, H, D).

    q̄, k̄: block means (B, H, N, D); v̂: block sums (B, H, N, D); lens: float32 (N,).
    k̄ is also returned in float32 (for the threshold moments).
    """
    lens = block_lengths(q.shape[1], q.device, block)
    q_mean = block_sums(q, block) / lens[:, None]
    k_mean32 = block_sums(k, block) / lens[:, None]
    v_sum = block_sums(v, block).to(v.dtype)
    return q_mean, k_mean32, k_mean32.to(k.dtype), v_sum, lens


def block_thresholds(q_mean, k_mean32, beta: torch.Tensor, estimator: str, scale: float) -> torch.Tensor:
    """τ (B, H, N) float32 from block means; beta is float32 (H,)."""
    m = k_mean32.mean(dim=2)  # (B, H, D)
    centered = k_mean32 - m[:, :, None, :]
    mu = scale * torch.einsum("bhnd,bhd->bhn", q_mean, m)
    if estimator == "exact":
        cov = centered.transpose(-1, -2) @ centered / k_mean32.shape[2]  # (B, H, D, D)
        var = torch.einsum("bhnd,bhde,bhne->bhn", q_mean, cov, q_mean)
    else:
        var = (q_mean * q_mean) @ centered.pow(2).mean(dim=2)[..., None]
        var = var[..., 0]
    sigma = scale * var.clamp_min(0).sqrt()
    b = beta.view(1, -1, 1)
    if k_mean32.shape[2] == 1:
        b = torch.full_like(b, float("-inf"))
    tau = mu + b * sigma
    return torch.where(torch.isinf(b), b.expand_as(tau), tau)


def forced_key_blocks(sinks: list[tuple[int, int]], seq_len: int, device, block: int = SOL_BLOCK) -> torch.Tensor:
    """Bool (N,): key blocks that overlap any sink token range, always computed exactly."""
    n = num_blocks(seq_len, block)
    forced = torch.zeros(n, dtype=torch.bool, device=device)
    for start, end in sinks:
        forced[start // block : (end - 1) // block + 1] = True
    return forced


def density_for_beta(beta: float) -> float:
    """Expected share of exact blocks for a β under the Gaussian model: 1 − Φ(β)."""
    beta = float(beta)
    if beta != beta:
        raise ValueError("beta must not be NaN")
    return 0.5 * math.erfc(beta / math.sqrt(2.0))


def beta_range_problem(beta) -> str | None:
    """What a β (float, or tensor of per-head values) outside [BETA_MIN, BETA_MAX] means, or
    None inside it. NaN is not judged here (the callers refuse it)."""
    values = beta.detach().float().cpu().flatten().tolist() if isinstance(beta, torch.Tensor) else [float(beta)]
    outside = sorted({v for v in values if not BETA_MIN <= v <= BETA_MAX})
    if not outside:
        return None
    effects = []
    for v in outside:
        if v == float("-inf"):
            effects.append("-inf computes every key block exactly (dense attention at Sol-Attn's cost)")
        elif v == float("inf"):
            effects.append("inf computes only forced key blocks exactly (sinks, keep_diagonal)")
        else:
            effects.append(f"{v:g} gives an expected density 1 - Phi(beta) of {density_for_beta(v):.3g}")
    return (f"beta outside the documented range [{BETA_MIN:g}, {BETA_MAX:g}] (expected density "
            f"{density_for_beta(BETA_MIN):.2g} to {density_for_beta(BETA_MAX):.2g}): " + "; ".join(effects))


def warn_if_beta_outside_range(beta) -> None:
    """A BetaRangeWarning when ``beta_range_problem(beta)`` finds one, attributed to the first
    caller outside this package (the line that passed β, so Python shows it once per line)."""
    problem = beta_range_problem(beta)
    if problem:
        here = os.path.dirname(os.path.abspath(__file__))
        frame, level = sys._getframe(0), 1
        while frame is not None and os.path.dirname(os.path.abspath(frame.f_code.co_filename)) == here:
            frame, level = frame.f_back, level + 1
        warnings.warn(problem, BetaRangeWarning, stacklevel=level)


def beta_for_density(rho: float) -> float:
    """β whose Gaussian tail 1 − Φ(β) equals rho, for 0 < rho < 1 (inverse of density_for_beta)."""
    rho = float(rho)
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho (target density) must be strictly between 0 and 1, got {rho}")
    return -statistics.NormalDist().inv_cdf(rho)


def with_reorder(attention, name: str):
    """The public form of a Sol attention function: its arguments plus ``grid`` and
    ``reorder`` (see ``run_reordered``)."""

    def entry(q, k, v, *, beta, estimator="exact", sinks=None, keep_diagonal=False, scale=None,
              return_stats=False, grid=None, reorder=None, **study):
        return run_reordered(attention, q, k, v, grid=grid, reorder=reorder, sinks=sinks,
                             return_stats=return_stats, beta=beta, estimator=estimator,
                             keep_diagonal=keep_diagonal, scale=scale, **study)

    entry.__name__ = entry.__qualname__ = name
    entry.__doc__ = (attention.__doc__ or "") + (
        "\n\n    ``reorder`` = (bt, bh, bw) with ``grid`` = (T, H, W): run on the video tokens in\n"
        "    tile-major order (``sol_routing.run_reordered``).\n")
    return entry


def run_reordered(attention, q, k, v, *, grid, reorder, sinks, return_stats, **kwargs):
    """Run a Sol attention function with the video tokens in tile-major order.

    ``reorder`` = (bt, bh, bw) permutes the first T·H·W tokens (``grid`` = (T, H, W)) so that
    each 64-token block is a compact 3D neighbourhood instead of a sliver of one image row;
    tokens after the grid and the output order are unchanged. ``sinks`` must lie after the
    grid (their positions would move otherwise).
    """
    from .layout import tile_layout

    if reorder is None:
        return attention(q, k, v, sinks=sinks, return_stats=return_stats, **kwargs)
    if grid is None:
        raise ValueError("reorder needs grid=(T, H, W) of the video tokens")
    layout = tile_layout(grid, reorder, pad=False, device=q.device)
    extra = q.shape[1] - layout.n_tokens
    if extra < 0:
        raise ValueError(f"grid {tuple(layout.grid)} has {layout.n_tokens} tokens, more than L = {q.shape[1]}")
    for start, _ in sinks or []:
        if start < layout.n_tokens:
            raise ValueError(f"sinks must lie after the {layout.n_tokens} grid tokens when reorder is set, got start {start}")
    blocked = [layout.to_blocks(t, dim=1, extra_tokens=extra) for t in (q, k, v)]
    result = attention(*blocked, sinks=sinks, return_stats=return_stats, **kwargs)
    out, stats = result if return_stats else (result, None)
    out = layout.from_blocks(out, dim=1, extra_tokens=extra)
    return (out, stats) if return_stats else out
