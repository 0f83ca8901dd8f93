"""The quantized exact blocks in plain PyTorch: the specification of ``engine.quantize`` (the
``precision`` "int8" and "fp8" paths of the kernels), used by ``sol_attention_reference`` and
``psa_attention_reference`` with those precisions.

The codes and scales are those of the kernels, bit for bit: the same smoothing mean (float64
sums, one division, rounded to float32), the same blocks (the ``BlockLayout``'s key blocks,
padding slots left out; the portable kernel's query tiles of ``engine.query_tile_rows`` rows),
the same scales (max |x| / 127 for int8, / 448 for fp8, ``quantize.CODE_FORMATS``) and the
same rounding of y = x / scale (IEEE float32 divisions): int8 floor(y + 0.5); fp8 PyTorch's
conversion to float8_e4m3fn (round to nearest, ties to even: what the kernels' e4m3 grid
rounding computes, and the rounding of ``cvt.rn.satfinite``; |y| never reaches 464, so
saturation never acts). The logits are then exact: the dot of the codes (exact in float64:
integers below 2⁵³ for int8, and for fp8 products of 4-bit significands between 2⁻¹⁸ and
448², 128 of them, within 53 bits) times the two scales and the softmax scale, in float64,
handed to the float32 references. The kernels' int8 dot is exact too; their fp8 dot
accumulates in float32 (less on sm_90's wgmma), so its logits round where these do not.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from .block_mask import BlockLayout
from .engine import query_tile_rows
from .engine.quantize import CODE_FORMATS, CodeFormat, mean_of_sums

__all__ = ["QuantizedOperands", "quantize_per_group", "smoothing_mean", "shifted_pooled_keys"]


def smoothing_mean(k: torch.Tensor) -> torch.Tensor:
    """float32 (B, H, D): the mean of k (B, L, H, D) over its L tokens, summed in float64."""
    return mean_of_sums(torch.sum(k, dim=1, dtype=torch.float64), k.shape[1])


def quantize_per_group(x: torch.Tensor, keep: torch.Tensor, code: CodeFormat) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per group: ``x`` float32 (..., R, D), ``keep`` bool (..., R) (the rows that
    count), ``code`` the codes' format. Returns (codes (..., R, D) of ``code.torch_dtype``,
    scale float32 (...)): scale = max |x| / ``code.bound`` over the kept rows, y = x / scale,
    codes int8 floor(y + 0.5) or float8_e4m3fn the nearest value (ties to even); an all-zero
    group has scale 0 and codes 0, a group with a NaN or an infinity scale NaN and codes 0."""
    mag = torch.where(keep[..., None], x.abs(), 0.0)
    finite = mag < float("inf")
    amax = torch.where(finite, mag, 0.0).amax(dim=(-1, -2))
    bad = ~finite.all(dim=-1).all(dim=-1)
    # Tensor divisors: PyTorch on CUDA would multiply by the reciprocal of a Python number.
    scale = torch.div(amax, torch.full_like(amax, code.bound))
    divisor = torch.where((amax > 0) & ~bad, scale, torch.ones_like(scale))
    y = torch.div(torch.where(bad[..., None, None], 0.0, x), divisor[..., None, None].expand_as(x))
    if code.torch_dtype == torch.int8:
        codes = torch.floor(y + 0.5).to(torch.int8)
    else:  # the clamp is the kernels' saturation: PyTorch's conversion gives NaN from 464 on
        codes = y.clamp(-code.bound, code.bound).to(code.torch_dtype)
    return codes, torch.where(bad, torch.full_like(scale, float("nan")), scale)


def _slot_groups(layout: BlockLayout, group_slots: int) -> torch.Tensor:
    """int64 (G, group_slots): the tokens of each group of ``group_slots`` slots of every block
    (its slots cut into groups, the last padded), -1 where a slot holds no token."""
    bt = layout.block_tokens
    per_block = -(-bt // group_slots) * group_slots
    slots = torch.full((layout.n_blocks, per_block), -1, dtype=torch.int64, device=layout.row_map.device)
    slots[:, :bt] = layout.row_map.view(layout.n_blocks, bt).long()
    return slots.view(-1, group_slots)


def _quantize_groups(x: torch.Tensor, groups: torch.Tensor, code: CodeFormat):
    """x float32 (B, H, L, D) quantized per group of tokens (``_slot_groups``): codes
    (B, H, L, D) of ``code`` and each token's scale (B, H, L)."""
    keep = groups >= 0
    codes, scale = quantize_per_group(x[:, :, groups.clamp(min=0)], keep, code)  # (B, H, G, S, D), (B, H, G)
    tokens = groups[keep]
    group_of = torch.arange(groups.shape[0], device=groups.device)[:, None].expand_as(groups)[keep]
    token_codes = torch.zeros(x.shape, dtype=code.torch_dtype, device=x.device)
    token_codes[:, :, tokens] = codes[:, :, keep]
    token_scale = torch.empty(x.shape[:3], dtype=torch.float32, device=x.device)
    token_scale[:, :, tokens] = scale[:, :, group_of]
    return token_codes, token_scale


@dataclass(frozen=True)
class QuantizedOperands:
    """The quantized operands of one call's exact blocks, per token (B, H, L, ...): ``q_codes``
    and ``q_scale`` (its query tile's), ``k_codes`` and ``k_scale`` (its key block's), int8 or
    float8_e4m3fn codes, and the keys' smoothing ``mean`` (B, H, D)."""

    q_codes: torch.Tensor
    q_scale: torch.Tensor
    k_codes: torch.Tensor
    k_scale: torch.Tensor
    mean: torch.Tensor

    @classmethod
    def of(cls, q: torch.Tensor, k: torch.Tensor, layout: BlockLayout, precision: str) -> "QuantizedOperands":
        """q, k (B, L, H, D) of a call on ``layout``'s blocks, in the codes of ``precision``
        ("int8" or "fp8")."""
        code = CODE_FORMATS[precision]
        mean = smoothing_mean(k)
        smoothed = k.float().transpose(1, 2) - mean[:, :, None, :]
        k_codes, k_scale = _quantize_groups(smoothed, _slot_groups(layout, layout.block_tokens), code)
        q_codes, q_scale = _quantize_groups(q.float().transpose(1, 2), _slot_groups(layout, query_tile_rows(layout)),
                                            code)
        return cls(q_codes, q_scale, k_codes, k_scale, mean)

    @functools.cached_property
    def _keys_transposed(self) -> torch.Tensor:
        """The key codes as float64 (B, H, D, L), once for every chunk of query rows."""
        return self.k_codes.double().transpose(-1, -2)

    def logits(self, r0: int, r1: int, scale: float) -> torch.Tensor:
        """float32 (B, H, r1 - r0, L): the exact logits of query rows r0 .. r1 against every
        key, the codes' dot times both scales times ``scale``, computed in float64."""
        dots = self.q_codes[:, :, r0:r1].double() @ self._keys_transposed
        factor = self.q_scale[:, :, r0:r1, None].double() * self.k_scale[:, :, None, :].double() * scale
        return (dots * factor).float()


def shifted_pooled_keys(k_mean: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
    """Sol's pooled keys (B, H, N, D, in the input dtype) minus the keys' smoothing mean,
    rounded back to the input dtype, as the pooled term reads them with quantized exact blocks."""
    return (k_mean.float() - mean[:, :, None, :]).to(k_mean.dtype)
