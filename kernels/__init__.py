"""Sparse attention kernels for video diffusion transformers (no ComfyUI import).

Public API (see the modules for details):
- Sol-Attn: ``sol_attention``, ``sol_attention_reference``, ``beta_for_density``,
  ``density_for_beta``.
- PSA: ``psa_attention``, ``psa_attention_reference``, ``psa_block_mask``.
"""
