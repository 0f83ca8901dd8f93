"""Sparse attention kernels for video diffusion transformers (no ComfyUI import).

Public API:
- Sol-Attn: ``sol_attention`` (Triton), ``sol_attention_reference`` (float32 spec),
  ``sol_block_selection``, ``beta_for_density``, ``density_for_beta``.
"""
from .sol import sol_attention
from .sol_reference import sol_attention_reference, sol_block_selection
from .sol_routing import beta_for_density, density_for_beta

__all__ = [
    "sol_attention",
    "sol_attention_reference",
    "sol_block_selection",
    "beta_for_density",
    "density_for_beta",
]
