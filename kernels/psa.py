"""Public PSA entry point (Triton). The float specification is ``psa_reference``."""
from __future__ import annotations

from ._checks import check_qkv, resolve_scale, unit_stride_last_dim
from .engine import block_sparse_attention
from .layout import check_grid, check_tile
from .psa_mask import check_params, psa_kernel_mask
from .psa_reference import check_extra_tokens

def psa_attention(q, k, v, *, grid, params, tile, extra_tokens=0, scale=None, config=None):
    """PSA self-attention of q, k, v (B, L, H, D) on CUDA, fp16/bf16, D in {64, 128}.

    ``grid`` = (T, H, W) of the video tokens, which come first in row-major order;
    ``params`` the integer (H, 6) stripe parameters (Tw, To, Ts, Sw, So, Ss) of
    ``psa_mask``; ``tile`` the PSABlock (bt, bh, bw); ``extra_tokens`` the non-grid tokens
    at the end of the sequence (HunyuanVideo's text), which attend to and are attended by
    every token. ``config``: a ``engine.launch_config.LaunchConfig`` to force (default: the
    device's). Returns (B, L, H, D) in the input dtype.
    """
    B, L, H, D = check_qkv(q, k, v, for_kernel=True)
    grid, tile = check_grid(grid), check_tile(tile)
    extra = check_extra_tokens(extra_tokens, L, grid)
    params = check_params(params, num_heads=H)
    scale = resolve_scale(scale, D)
    q, k, v = (unit_stride_last_dim(t) for t in (q, k, v))
    mask = psa_kernel_mask(grid, params, tile, extra, q.device)
    return block_sparse_attention(q, k, v, mask, scale=scale, config=config)
