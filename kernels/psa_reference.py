"""PSA attention in plain PyTorch float32: the specification the Triton kernel is tested against.

Token i (grid order, row-major (t, h, w)) lies in PSABlock ``((t//bt)*nH + h//bh)*nW + w//bw``
of the padded block grid; query token i may attend key token j iff
``psa_block_mask(grid, params, tile)[head, block(i), block(j)]``. Tokens after the grid
(``extra_tokens``, e.g. HunyuanVideo's text) attend to every token and every token attends
to them. Padding never exists here: the 3D padding is a layout device of the kernel, and
"padded tokens never change the result" means the kernel must agree with this function.
``precision="int8"`` or ``"fp8"`` states the kernels' quantized exact blocks
(``quantized_reference``, on the blocks of the kernel's ``BlockLayout``).
"""
from __future__ import annotations

import torch

from ._checks import check_int, check_qkv, resolve_scale
from .block_mask import block_layout
from .engine.precision import KERNEL_PRECISIONS, QUANTIZED_PRECISIONS, check_precision
from .layout import check_grid, check_tile, tile_layout
from .psa_mask import check_params, psa_block_mask
from .quantized_reference import QuantizedOperands

__all__ = ["psa_attention_reference", "check_extra_tokens", "psa_token_blocks"]


def check_extra_tokens(extra_tokens, seq_len: int, grid) -> int:
    """Validate ``extra_tokens`` against L = T*H*W + extra_tokens; return it as an int."""
    extra = check_int(extra_tokens, "extra_tokens", 0)
    T, H, W = grid
    n = T * H * W
    if seq_len != n + extra:
        raise ValueError(
            f"sequence length L = {seq_len} does not match grid {tuple(grid)}: "
            f"T*H*W = {n} + extra_tokens {extra} = {n + extra}"
        )
    return extra


def psa_token_blocks(grid, tile, extra_tokens: int, device) -> torch.Tensor:
    """Block id (int64, L) of every token in sequence order; extra tokens get ``n_blocks``."""
    lay = tile_layout(grid, tile, device="cpu")
    blk = torch.cat([lay.block_of_token(), torch.full((extra_tokens,), lay.n_blocks, dtype=torch.int64)])
    return blk.to(device)


def psa_attention_reference(q, k, v, *, grid, params, tile, extra_tokens=0, scale=None, query_chunk=None,
                            precision="bf16"):
    """PSA self-attention of q, k, v (B, L, H, D), any float dtype and device.

    Computed in float32, returned in the input dtype. ``grid`` = (T, H, W) of the video
    tokens, which come first in the sequence in row-major order; ``params`` the int (H, 6)
    stripe parameters (Tw, To, Ts, Sw, So, Ss); ``tile`` the PSABlock (bt, bh, bw);
    ``extra_tokens`` the non-grid tokens at the end of the sequence. ``query_chunk`` bounds
    memory (query rows per step; default keeps the score tile near 128 MiB). ``precision``:
    "bf16" (the exact QKᵀ of the inputs, in float32), "int8" or "fp8" (the kernels' codes).
    """
    precision = check_precision(precision, choices=KERNEL_PRECISIONS)
    B, L, H, D = check_qkv(q, k, v, for_kernel=False)
    grid, tile = check_grid(grid), check_tile(tile)
    extra = check_extra_tokens(extra_tokens, L, grid)
    p = check_params(params, num_heads=H)
    scale = resolve_scale(scale, D)
    if query_chunk is None:
        query_chunk = max(1, (1 << 25) // (B * H * L))
    query_chunk = check_int(query_chunk, "query_chunk", 1)
    dev = q.device

    bmask = psa_block_mask(grid, p, tile)
    nb = bmask.shape[1]
    # One extra "block" for the non-grid tokens: all rows and columns kept.
    ext = torch.ones(H, nb + 1, nb + 1, dtype=torch.bool)
    ext[:, :nb, :nb] = bmask
    ext = ext.to(dev)
    blk = psa_token_blocks(grid, tile, extra, dev)

    qf = q.float().permute(0, 2, 1, 3)  # (B, H, L, D)
    kf = k.float().permute(0, 2, 3, 1)  # (B, H, D, L)
    vf = v.float().permute(0, 2, 1, 3)  # (B, H, L, D)
    codes = (QuantizedOperands.of(q, k, block_layout(grid, tile, extra, dev), precision)
             if precision in QUANTIZED_PRECISIONS else None)
    out = torch.empty(B, H, L, D, dtype=torch.float32, device=dev)
    for i0 in range(0, L, query_chunk):
        i1 = min(L, i0 + query_chunk)
        s = torch.matmul(qf[:, :, i0:i1], kf) * scale if codes is None else codes.logits(i0, i1, scale)  # (B, H, c, L)
        allowed = ext[:, blk[i0:i1]][:, :, blk]  # (H, c, L)
        s = s.masked_fill(~allowed[None], float("-inf"))
        out[:, :, i0:i1] = torch.matmul(torch.softmax(s, dim=-1), vf)
    return out.permute(0, 2, 1, 3).to(q.dtype)
