"""The rules of Sol-Attn's routing, shared by the float reference and the GPU kernels: the
blocks, the forced blocks, the thresholds and β (its range, and its conversion to a density).

Blocks are those of a ``block_mask.BlockLayout``: 3D tiles of 64 tokens of the video grid
(:func:`sol_tile_for_grid` picks the tile), then the tokens after the grid (HunyuanVideo's
text) in blocks of 64 that are always exact (sinks); a sequence without a grid is cut into
row-major blocks of 64. Everything here is O(L·d + N·d²) per head: the paper's eq. (4)–(5).
Nothing of size N×N is formed.

Definitions (one head, scale s, N blocks, block j holds len_j real tokens):
- Q̄_i, K̄_j, V̄_j: means of the block's real tokens, rounded to the input dtype (the kernel
  multiplies them on the tensor cores in that dtype; the reference rounds the same way).
- proxy score ŝ_ij = s · Q̄_i · K̄_jᵀ, in float32 from the rounded means.
- μ_i = s · Q̄_i · m,  m = (1/N) Σ_j K̄_j  (every block weighs the same).
- exact estimator:    σ_i² = s² · Q̄_i C Q̄_iᵀ,  C = (1/N) Σ_j (K̄_j − m)(K̄_j − m)ᵀ.
- diagonal estimator: σ_i² = s² · (Q̄_i ⊙ Q̄_i) · diag(C).
  (μ_i and the exact σ_i are the mean and standard deviation of row i's proxy scores.)
- τ_i = μ_i + β·σ_i; key block j is exact for query block i iff not ŝ_ij <= τ_i, or it is
  forced (sink tokens, extra blocks). "Not <=" rather
  than ">": a comparison that cannot be decided (ŝ or τ NaN, from a NaN or inf in q or k) makes
  the block exact, so such a query block is plain dense attention, NaN exactly where dense
  attention gives NaN, never a finite pooled guess.
- β = −inf selects every block, β = +inf none (before the forced ones).
- A sequence of a single block is always exact: its one proxy score equals μ and σ = 0, so
  the comparison would be decided by rounding alone.
"""
from __future__ import annotations

import functools
import math
import os
import statistics
import sys
import warnings

import torch

from ._checks import check_beta, check_number
from .block_mask import ROW_MAJOR_BLOCK, BlockLayout, block_layout, row_major_layout
from .layout import check_grid, check_tile

SOL_BLOCK = ROW_MAJOR_BLOCK

# 64-token tiles (bt, bh, bw), most compact first; :func:`sol_tile_for_grid` takes the one that
# pads the grid least, earlier entries winning ties.
SOL_TILES = ((2, 4, 8), (1, 8, 8), (4, 4, 4), (2, 8, 4), (1, 4, 16), (4, 2, 8), (2, 2, 16), (1, 2, 32), (1, 1, 64))

# The documented range of β: expected densities 1 − Φ(β) from ~84 % (β = −1) down to
# ~0.003 % (β = 4). Below it Sol-Attn computes most blocks exactly and saves little; above it
# nearly every block is pooled. Values outside it, ±inf included (every / no block exact,
# used by tests), are accepted with a BetaRangeWarning.
BETA_MIN, BETA_MAX = -1.0, 4.0


class BetaRangeWarning(UserWarning):
    """β outside [BETA_MIN, BETA_MAX]; filter it with ``warnings.filterwarnings``."""


def sol_tile_for_grid(grid) -> tuple:
    """The 64-token tile of :data:`SOL_TILES` that leaves the fewest padding slots on ``grid``
    (a video grid within ``kernels.layout``'s limits, else a ValueError)."""
    T, H, W = check_grid(grid)

    def slots(tile):
        return math.prod(-(-g // t) * t for g, t in zip((T, H, W), tile))

    return min(SOL_TILES, key=slots)  # min keeps the first of equal keys


def check_sol_tile(tile) -> tuple:
    tile = check_tile(tile)
    if math.prod(tile) != SOL_BLOCK:
        raise ValueError(f"tile {tile} must hold {SOL_BLOCK} tokens (bt·bh·bw = {SOL_BLOCK}), e.g. (2, 4, 8)")
    return tile


def sol_layout(seq_len: int, grid=None, tile=None, device="cpu") -> BlockLayout:
    """The blocks of a Sol-Attn call: 3D tiles of ``grid`` (``tile`` or :func:`sol_tile_for_grid`)
    and extra blocks for the tokens after it, or row-major blocks when ``grid`` is None."""
    if grid is None:
        if tile is not None:
            raise ValueError("tile needs grid=(T, H, W) of the video tokens")
        return row_major_layout(seq_len, device)
    grid = check_grid(grid)
    n_grid = math.prod(grid)
    if n_grid > seq_len:
        raise ValueError(f"grid {grid} has {n_grid} tokens, more than L = {seq_len}")
    tile = sol_tile_for_grid(grid) if tile is None else check_sol_tile(tile)
    return block_layout(grid, tile, seq_len - n_grid, device)


def forced_key_blocks(layout: BlockLayout, sinks) -> torch.Tensor:
    """Bool (N,) on the layout's device: key blocks always exact, the extra blocks and, for a
    row-major layout, the blocks overlapping any ``sinks`` token range. Cached (and read-only):
    a call makes no host-to-device copy, so it can be captured in a CUDA graph."""
    return _cached_forced(layout, tuple(tuple(r) for r in sinks))


@functools.lru_cache(maxsize=256)
def _cached_forced(layout: BlockLayout, sinks: tuple) -> torch.Tensor:
    forced = torch.zeros(layout.n_blocks, dtype=torch.bool)
    forced[layout.n_grid_blocks:] = True
    for start, end in sinks:
        forced[start // SOL_BLOCK: (end - 1) // SOL_BLOCK + 1] = True
    return forced.to(layout.device)


def exact_blocks(proxy: torch.Tensor, tau: torch.Tensor) -> torch.Tensor:
    """Bool: which proxy scores make their block exact against the thresholds ``tau``
    (broadcast); the kernel's router compares the same way."""
    return ~(proxy <= tau)


def block_thresholds(q_mean, k_mean, beta: torch.Tensor, estimator: str, scale: float) -> torch.Tensor:
    """τ (B, H, N) float32 from the block means (B, H, N, D) (any float dtype); beta float32 (H,).
    The float reference of the router kernel's own thresholds (``sol_gpu_routing._row_thresholds``),
    which agree with it up to rounding."""
    q_mean, k_mean = q_mean.float(), k_mean.float()
    m = k_mean.mean(dim=2)  # (B, H, D)
    centered = k_mean - m[:, :, None, :]
    mu = scale * torch.einsum("bhnd,bhd->bhn", q_mean, m)
    if estimator == "exact":
        cov = centered.transpose(-1, -2) @ centered / k_mean.shape[2]  # (B, H, D, D)
        var = torch.einsum("bhnd,bhde,bhne->bhn", q_mean, cov, q_mean)
    else:
        var = ((q_mean * q_mean) @ centered.pow(2).mean(dim=2)[..., None])[..., 0]
    sigma = scale * var.clamp_min(0).sqrt()
    b = beta.view(1, -1, 1)
    if k_mean.shape[2] == 1:
        b = torch.full_like(b, float("-inf"))
    tau = mu + b * sigma
    return torch.where(torch.isinf(b), b.expand_as(tau), tau)


def density_for_beta(beta: float) -> float:
    """Expected share of exact blocks for a β under the Gaussian model: 1 − Φ(β)."""
    beta = check_number(beta, "beta")
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
            effects.append("inf computes only forced key blocks exactly (the sinks)")
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
    rho = check_number(rho, "rho (target density)")
    if not 0.0 < rho < 1.0:
        raise ValueError(f"rho (target density) must be strictly between 0 and 1, got {rho}")
    return -statistics.NormalDist().inv_cdf(rho)


def per_head_beta(beta, num_heads: int, device) -> torch.Tensor:
    """β as a float32 tensor of shape (H,) on ``device``; ±inf allowed (all exact / none exact).

    A float or a CPU tensor is checked here (:func:`check_beta`), and warned about outside the
    documented range (:data:`BETA_MIN`/:data:`BETA_MAX`); a CUDA tensor is used as it is
    (checking it would synchronise the device on every call): a NaN there makes every block
    exact."""
    if isinstance(beta, torch.Tensor):
        if beta.dim() == 0:
            beta = beta.reshape(1).expand(num_heads)
        if beta.shape != (num_heads,):
            raise ValueError(f"beta must be a float or a tensor of shape (H,) = ({num_heads},), got {tuple(beta.shape)}")
        if beta.is_cuda:
            return beta.detach().to(device=device, dtype=torch.float32)
        for value in beta.detach().double().flatten().tolist():
            check_beta(value)
        warn_if_beta_outside_range(beta)
        return beta.detach().to(device=device, dtype=torch.float32)
    if isinstance(beta, (int, float)) and not isinstance(beta, bool):
        beta = check_beta(beta)
        warn_if_beta_outside_range(beta)
        return torch.full((num_heads,), beta, device=device, dtype=torch.float32)
    raise TypeError(f"beta must be a float or a tensor of shape (H,), got {type(beta).__name__}")
