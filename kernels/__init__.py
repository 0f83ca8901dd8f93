"""Sparse attention kernels for video diffusion transformers (no ComfyUI import).

Public API:
- Sol-Attn: ``sol_attention`` (Triton), ``sol_attention_reference`` (float32 spec),
  ``sol_block_selection``, ``sol_tile_for_grid``, ``beta_for_density``, ``density_for_beta``.
- PSA: ``psa_attention`` (Triton), ``psa_attention_reference`` (float32 spec),
  ``psa_block_mask`` (``kernels.psa_mask.psa_mask`` builds the inspectable mask object).
- Blocks: ``block_layout`` (the blocks of a call), ``BlockMask`` (the visited pairs, the one
  mask object both methods hand the engine), ``tile_layout`` (tile-major token order).
- ``launch_config``: the per-architecture launch configurations.
"""
from .block_mask import BlockMask, block_layout
from .layout import tile_layout
from .psa import psa_attention
from .psa_mask import psa_block_mask
from .psa_reference import psa_attention_reference
from .sol import sol_attention
from .sol_reference import sol_attention_reference, sol_block_selection
from .sol_routing import beta_for_density, density_for_beta, sol_tile_for_grid

__all__ = [
    "sol_attention",
    "sol_attention_reference",
    "sol_block_selection",
    "sol_tile_for_grid",
    "beta_for_density",
    "density_for_beta",
    "psa_attention",
    "psa_attention_reference",
    "psa_block_mask",
    "block_layout",
    "BlockMask",
    "tile_layout",
]
