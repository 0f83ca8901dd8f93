"""The one block-sparse engine: the backends that run a ``BlockMask``, and the choice of one.

A method (Sol-Attn's router, PSA's stripe mask) hands the engine a ``block_mask.BlockMask``
(and Sol its ``PooledBlocks``); the engine picks the backend for the call and the device and
lowers the mask to that backend's work form:

- the portable kernel (``portable``, every architecture): id lists and a launch order of
  query tiles (``id_lists``);
- the warp-specialised Hopper loop (``hopper_loop``, sm_90 with Triton >= 3.6): the same id
  lists for 128-row tiles (PSA), pair streams for 64-row tiles (Sol-Attn, ``pair_streams``).

``launch_config`` holds the per-architecture launch configurations; ``launch_order`` the
order programs run in; ``precision`` the precision of the exact blocks' QKᵀ ("bf16", "int8",
"fp8", or "auto": per architecture), with ``quantize`` the int8 and fp8 operands. A quantized
call on the sm_90 row runs the Hopper loop with its exact blocks' QKᵀ on the codes (Sol's
pooled chunks stay in the input dtype).

Scratch memory: a caller that allocates work memory per head (Sol's pooled means, its mask
and the engine's work form of it; quantized keys, for both methods) runs its heads in groups whose
scratch stays within ``SCRATCH_SHARE`` of the output's bytes (:func:`head_groups`), each group
freed before the next is allocated. The key codes of quantized calls, one byte per element of k,
are most of that: a group whose codes fit in the output heads after its own, which a caller
running its groups in head order has not written yet, lays them there
(``quantize.codes_in_free_heads``) and needs no scratch for them. Sol's int8 call at Wan 720p (40
heads) so runs 6 groups instead of 20, PSA's 4 instead of 14.
"""
from __future__ import annotations

import functools
import logging
import re
from typing import Optional

import torch
import triton

from .._device import device_guard
from ..block_mask import BlockLayout, BlockMask, PooledBlocks
from .id_lists import id_list_bytes
from .launch_config import LaunchConfig, config_for_device
from .pair_streams import pair_stream_bytes
from .portable import portable_attention
from .precision import QUANTIZED_PRECISIONS, resolve_precision
from .quantize import codes_in_free_heads, key_code_bytes, quantize_keys, quantized_key_bytes, shifted
from .tile_loop import tma_sub_frames

__all__ = ["block_sparse_attention", "load_hopper_loop", "query_tile_rows", "work_bytes_per_head",
           "code_bytes_per_head", "head_groups", "SCRATCH_SHARE", "SCRATCH_FLOOR"]

log = logging.getLogger("sparse_video_attention.kernels")

# The Hopper loop is Gluon as Triton 3.6 has it. Older Tritons (the pack takes >= 3.2) have no
# Gluon, or a warp_specialize of another signature: they run the portable kernel everywhere.
HOPPER_LOOP_MIN_TRITON = (3, 6)
MAX_TILE_ROWS = 128  # query rows of a program: a PSABlock (384 tokens at Wan 720p) is walked in tiles
# Scratch memory per call, as a share of the output (dense attention allocates the output
# too): the benchmark's target is "peak extra memory <= dense + 5 %". Small calls may use
# SCRATCH_FLOOR bytes regardless.
SCRATCH_SHARE = 0.04
SCRATCH_FLOOR = 32 * 2**20


def head_groups(num_heads: int, per_head_bytes: int, output_bytes: int,
                code_bytes_per_head: int = 0) -> list[tuple[int, int, bool]]:
    """[(first, end, codes_in_output), ...]: contiguous head ranges in head order whose scratch
    fits the budget (>= 1 head), each one launch of the loop. ``per_head_bytes``: a head's
    scratch besides its key codes; ``code_bytes_per_head``: its key codes (quantized calls),
    which a group lays in the output's heads after its own where they fit there
    (``codes_in_output`` True: the caller writes the groups in this order, so those heads are
    not written yet), else in scratch.

    Without codes the groups are as few as fit and as even as they can be: a launch's last wave
    leaves SMs idle, so 40 heads by 12 run as 10, 10, 10, 10 rather than 12, 12, 12, 4. With
    codes each group is the largest that fits, its codes in the output when they fit there:
    the output's room shrinks towards the last heads, so even groups would need more of them."""
    budget = max(SCRATCH_SHARE * output_bytes, SCRATCH_FLOOR)
    if not code_bytes_per_head:
        most = max(1, min(num_heads, int(budget // max(1, per_head_bytes))))
        n_groups = -(-num_heads // most)
        bounds = [num_heads * g // n_groups for g in range(n_groups + 1)]
        return [(first, end, False) for first, end in zip(bounds[:-1], bounds[1:])]
    head_bytes = output_bytes / num_heads

    def codes_place(first: int, n: int) -> Optional[bool]:
        """Whether heads first .. + n lay their codes in the output (True), in scratch (False),
        or do not fit (None)."""
        if n * per_head_bytes > budget:
            return None
        if n * code_bytes_per_head <= (num_heads - first - n) * head_bytes:
            return True
        return False if n * (per_head_bytes + code_bytes_per_head) <= budget else None

    groups, first = [], 0
    while first < num_heads:
        n = next((n for n in range(num_heads - first, 0, -1) if codes_place(first, n) is not None), 1)
        groups.append((first, first + n, bool(codes_place(first, n))))
        first += n
    return groups


@functools.lru_cache(maxsize=1)
def load_hopper_loop():
    """The module ``hopper_loop``, or None where this Triton cannot build it (logged once)."""
    version = tuple(int(x) for x in re.findall(r"\d+", triton.__version__)[:2])
    if version < HOPPER_LOOP_MIN_TRITON:
        log.info("[sparse-video-attention] Triton %s: the warp-specialised Hopper loop needs Triton >= %d.%d; "
                 "the portable kernel runs", triton.__version__, *HOPPER_LOOP_MIN_TRITON)
        return None
    try:
        from . import hopper_loop as module
    except Exception as exc:  # a build of Triton without the Gluon pieces the loop uses
        log.warning("[sparse-video-attention] the warp-specialised Hopper loop does not load with Triton %s "
                    "(%s: %s); the portable kernel runs", triton.__version__, type(exc).__name__, exc)
        return None
    return module


def query_tile_rows(layout: BlockLayout) -> int:
    """Query rows of a program: the block, as a power of two of at least 16 (a dot operand), at
    most ``MAX_TILE_ROWS``."""
    return min(MAX_TILE_ROWS, max(16, triton.next_power_of_2(layout.block_tokens)))


def _hopper_loop_runs(q, k, v, layout: BlockLayout, *, pooled: bool, config: LaunchConfig,
                      precision: str) -> bool:
    """Whether a call runs the warp-specialised Hopper loop (else the portable kernel); with
    quantized (int8, fp8) exact blocks only where it has that path (``ws_supported``)."""
    if not config.warp_specialized:
        return False
    hopper = load_hopper_loop()
    sub_frames = tma_sub_frames(layout.tile) if config.tma else None
    return hopper is not None and hopper.ws_supported(q, k, v, layout, query_tile_rows(layout), sub_frames,
                                                      config.num_stages, pooled,
                                                      quantized=precision in QUANTIZED_PRECISIONS)


def work_bytes_per_head(q, k, v, layout: BlockLayout, *, pooled: bool, config: Optional[LaunchConfig] = None,
                        precision: str = "bf16") -> int:
    """Device memory the backend that runs a call needs for one head of one batch entry of a
    mask of one call: its work form (id lists or pair streams) and, with ``precision``
    "int8" or "fp8" (resolved: not "auto"), the quantized keys besides their codes
    (``quantize.quantized_key_bytes``; the codes: :func:`code_bytes_per_head`)."""
    config = config or config_for_device(q.device)
    keys = quantized_key_bytes(layout, q.shape[3], q.element_size(), pooled) \
        if precision in QUANTIZED_PRECISIONS else 0
    if _hopper_loop_runs(q, k, v, layout, pooled=pooled, config=config, precision=precision) \
            and query_tile_rows(layout) == 64:
        return pair_stream_bytes(layout.n_blocks) + keys
    return id_list_bytes(layout.n_blocks) + keys


def code_bytes_per_head(layout: BlockLayout, head_dim: int, precision: str) -> int:
    """Device memory of one head of one batch entry's key codes with ``precision`` (resolved):
    0 unless "int8" or "fp8" (:func:`head_groups` places them)."""
    return key_code_bytes(layout, head_dim) if precision in QUANTIZED_PRECISIONS else 0


def block_sparse_attention(q, k, v, mask: BlockMask, *, scale: float, out: Optional[torch.Tensor] = None,
                           head_base: int = 0, pooled: Optional[PooledBlocks] = None,
                           config: Optional[LaunchConfig] = None, precision: str = "auto",
                           codes_in_output: bool = False) -> torch.Tensor:
    """Run the engine on q/k/v (B, L, H, D) in sequence order (any strides with unit last
    stride) for heads ``head_base .. head_base + mask.num_heads``; writes and returns ``out``
    (allocated (B, L, H, D) when None). ``config``: the architecture's launch configuration
    (``launch_config``; default: the device's). ``precision``: of the exact blocks' QKᵀ,
    "auto" (``precision.AUTO_PRECISION``'s row of ``config``: Sol's with ``pooled``, else PSA's),
    "bf16" (the input dtype), "int8" or "fp8" (``quantize``: the keys of these heads are
    quantized here, smoothed by their mean, ``quantize.key_means``; "fp8" needs sm_89 or
    later). ``codes_in_output``: the caller has not written ``out``'s heads after these yet,
    and the codes of a quantized call go there (:func:`head_groups` says where they fit)."""
    lay = mask.layout
    config = config or config_for_device(q.device)
    precision = resolve_precision(precision, config, "psa" if pooled is None else "sol").precision
    if out is None:
        out = torch.empty(q.shape, device=q.device, dtype=q.dtype)
    sub_frames = tma_sub_frames(lay.tile) if config.tma else None
    block_m = query_tile_rows(lay)
    keys = None
    if precision in QUANTIZED_PRECISIONS:
        codes = codes_in_free_heads(out, head_base + mask.num_heads, mask.num_heads, precision) \
            if codes_in_output else None
        keys = quantize_keys(k, lay, head_base, mask.num_heads, precision, codes)
        pooled = None if pooled is None else shifted(pooled, keys.mean)
    if _hopper_loop_runs(q, k, v, lay, pooled=pooled is not None, config=config, precision=precision):
        with device_guard(q):
            return load_hopper_loop().ws_block_sparse_attention(
                q, k, v, mask, scale=scale, out=out, head_base=head_base, pooled=pooled, block_m=block_m,
                sub_frames=sub_frames, num_stages=config.num_stages, keys=keys)
    return portable_attention(q, k, v, mask, scale=scale, out=out, head_base=head_base, pooled=pooled,
                              config=config, block_m=block_m, sub_frames=sub_frames, keys=keys)
