"""Triton helpers of every kernel of the library: the dot operands' dtype and head offsets."""
import torch
import triton
import triton.language as tl

from ._device import triton_interpreting


def dot_dtype_for(dtype: torch.dtype):
    """Operand dtype of the kernels' dots. Triton's CPU interpreter computes bf16 dots wrongly,
    so interpreted bf16 runs in float32 (CUDA always uses the input dtype)."""
    if dtype == torch.float16:
        return tl.float16
    return tl.float32 if triton_interpreting() else tl.bfloat16


@triton.jit
def head_offset(b, h, stride_b, stride_h):
    """Element offset of (batch ``b``, head ``h``) in a (B, L, H, D) tensor, in 64 bits. With
    heads-first storage (HunyuanVideo hands q/k/v over as (B, H, L, D)) ``h * stride_h``
    passes 2**31 once (H - 1)·L·D does (64 heads of 270,336 tokens × 128), and a 32-bit
    product would silently address another head's memory."""
    return b.to(tl.int64) * stride_b + h.to(tl.int64) * stride_h
