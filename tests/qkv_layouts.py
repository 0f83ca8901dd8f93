"""Memory layouts in which models hand q, k, v (B, L, H, D) to attention, for kernel tests."""
import torch


def heads_first(*tensors):
    """As HunyuanVideo's double blocks hand them over: (B, H, L, D) storage seen as (B, L, H, D)."""
    return tuple(x.transpose(1, 2).contiguous().transpose(1, 2) for x in tensors)


def hunyuan_single_block(q, k, v):
    """As HunyuanVideo's single blocks hand them over: q and k heads first (made by RoPE), v a
    view into the fused qkv projection (B, L, 3, H, D), so K and V rows have different strides."""
    fused = torch.stack([q, k, v], dim=2)
    q, k = heads_first(q, k)
    return q, k, fused[:, :, 2]
