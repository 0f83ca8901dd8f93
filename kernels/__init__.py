"""Sparse attention kernels for video diffusion transformers (no ComfyUI import).

This module is the library's public API; the ComfyUI nodes use nothing else.

- Sol-Attn: ``sol_attention`` (Triton), ``sol_attention_reference`` (float32 spec),
  ``sol_block_selection``, ``sol_tile_for_grid``, ``beta_for_density``, ``density_for_beta``,
  ``BETA_MIN`` / ``BETA_MAX`` (the documented range) and ``beta_range_problem``.
- PSA: ``psa_attention`` (Triton), ``psa_attention_reference`` (float32 spec),
  ``psa_block_mask`` (bool block matrix) and ``psa_mask`` (the inspectable ``PSAMask``).
- Presets (the stripe-mask file format): ``Preset``, ``load_preset``, ``save_preset``,
  ``resolve_preset_path``, ``preset_from_selection``, ``check_preset_name``,
  ``check_bucket_edges``, ``check_preset_text``, ``MAX_AUTHOR``.
- The PSA search: ``candidate_space``, ``PSASearchAccumulator``, ``LossTable``,
  ``save_qkv_sample``, ``estimate_sample_bytes``.
- Blocks: ``block_layout`` (the blocks of a call), ``BlockMask`` (the visited pairs, the one
  mask object both methods hand the engine), ``tile_layout`` (tile-major token order),
  ``tokens_to_front`` / ``tokens_back``, ``check_grid``, ``check_tile``, ``check_padding``.
- Arguments: ``check_beta``, ``check_number``, ``resolve_scale``, ``shown`` (a value as an
  error message echoes it).
- ``config_for_device``: the launch configuration of a GPU.
- Precision of the exact blocks' QKᵀ (the ``precision`` argument of ``sol_attention``,
  ``psa_attention`` and their references): ``PRECISIONS``, ``check_precision``,
  ``precision_for_device`` (what ``auto`` or a given precision runs on a GPU, and why).
"""
from ._checks import check_beta, check_number, resolve_scale, shown
from .block_mask import BlockMask, block_layout
from .engine.launch_config import config_for_device
from .engine.precision import PRECISIONS, check_precision, precision_for_device
from .layout import check_grid, check_padding, check_tile, tile_layout, tokens_back, tokens_to_front
from .preset_file import FieldChecks, MAX_AUTHOR, Preset, check_bucket_edges, load_preset, preset_from_selection
from .preset_file import check_name as check_preset_name
from .preset_file import resolve_preset_path, save_preset
from .psa import psa_attention
from .psa_mask import PSAMask, psa_block_mask, psa_mask
from .psa_reference import psa_attention_reference
from .psa_search import LossTable, PSASearchAccumulator, candidate_space, estimate_sample_bytes, save_qkv_sample
from .sol import sol_attention
from .sol_reference import sol_attention_reference, sol_block_selection
from .sol_rules import (BETA_MAX, BETA_MIN, beta_for_density, beta_range_problem, density_for_beta,
                        sol_tile_for_grid)


def check_preset_text(value, name: str, limit: int) -> str:
    """A free-text preset field (author, notes): a string of at most ``limit`` characters."""
    return FieldChecks.str_(value, name, limit)


__all__ = [
    "sol_attention", "sol_attention_reference", "sol_block_selection", "sol_tile_for_grid",
    "beta_for_density", "density_for_beta", "BETA_MIN", "BETA_MAX", "beta_range_problem",
    "psa_attention", "psa_attention_reference", "psa_block_mask", "psa_mask", "PSAMask",
    "Preset", "load_preset", "save_preset", "resolve_preset_path", "preset_from_selection",
    "check_preset_name", "check_bucket_edges", "check_preset_text", "MAX_AUTHOR",
    "candidate_space", "PSASearchAccumulator", "LossTable", "save_qkv_sample", "estimate_sample_bytes",
    "block_layout", "BlockMask", "tile_layout", "tokens_to_front", "tokens_back",
    "check_grid", "check_tile", "check_padding",
    "check_beta", "check_number", "resolve_scale", "shown",
    "config_for_device", "PRECISIONS", "check_precision", "precision_for_device",
]
