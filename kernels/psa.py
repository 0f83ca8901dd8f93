"""Public PSA entry point (Triton). The float specification is ``psa_reference``.

The stripe masks give a reused ``BlockMask`` (``psa_mask.psa_kernel_mask``, cached); the
engine runs it for every head at once. With quantized (int8, fp8) exact blocks (``precision``)
the engine quantizes the keys of the heads it runs (``engine.quantize``): the heads then run in
groups, in head order, each its own launch over its heads' part of the mask, whose codes lie
in the output's heads after the group's (not yet written) where they fit there, else in scratch
within the engine's budget (``engine.head_groups``).
"""
from __future__ import annotations

import torch

from ._checks import check_qkv, resolve_scale, unit_stride_last_dim
from .engine import block_sparse_attention, code_bytes_per_head, head_groups
from .engine.launch_config import config_for_device
from .engine.precision import QUANTIZED_PRECISIONS, resolve_precision
from .engine.quantize import quantized_key_bytes
from .layout import check_grid, check_tile
from .psa_mask import check_params, psa_kernel_mask
from .psa_reference import check_extra_tokens


def psa_attention(q, k, v, *, grid, params, tile, extra_tokens=0, scale=None, config=None, precision="auto"):
    """PSA self-attention of q, k, v (B, L, H, D) on CUDA, fp16/bf16, D in {64, 128}.

    ``grid`` = (T, H, W) of the video tokens, which come first in row-major order;
    ``params`` the integer (H, 6) stripe parameters (Tw, To, Ts, Sw, So, Ss) of
    ``psa_mask``; ``tile`` the PSABlock (bt, bh, bw); ``extra_tokens`` the non-grid tokens
    at the end of the sequence (HunyuanVideo's text), which attend to and are attended by
    every token. ``config``: a ``engine.launch_config.LaunchConfig`` to force (default: the
    device's). ``precision``: of the exact blocks' QKᵀ, "auto" (per architecture,
    ``engine.precision``), "bf16" (the input dtype), "int8" or "fp8" (``engine.quantize``;
    fp8 from sm_89 on). Returns (B, L, H, D) in the input dtype.
    """
    B, L, H, D = check_qkv(q, k, v, for_kernel=True)
    grid, tile = check_grid(grid), check_tile(tile)
    extra = check_extra_tokens(extra_tokens, L, grid)
    params = check_params(params, num_heads=H)
    scale = resolve_scale(scale, D)
    q, k, v = (unit_stride_last_dim(t) for t in (q, k, v))
    config = config or config_for_device(q.device)
    precision = resolve_precision(precision, config, "psa").precision
    mask = psa_kernel_mask(grid, params, tile, extra, q.device)
    if precision not in QUANTIZED_PRECISIONS:
        return block_sparse_attention(q, k, v, mask, scale=scale, config=config, precision=precision)
    out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    # The reused mask's work form is kept with it, not per call: the quantized keys are the scratch.
    per_head = B * quantized_key_bytes(mask.layout, D, q.element_size(), pooled=False)
    codes = B * code_bytes_per_head(mask.layout, D, precision)
    for h0, h1, codes_in_output in head_groups(H, per_head, out.numel() * out.element_size(), codes):
        block_sparse_attention(q, k, v, mask.heads(h0, h1), scale=scale, out=out, head_base=h0, config=config,
                               precision=precision, codes_in_output=codes_in_output)
    return out
