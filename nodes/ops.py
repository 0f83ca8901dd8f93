"""The kernels as ``torch.library`` custom ops, so ``torch.compile`` traces a patched model
without a graph break at the attention call.

The pack can be imported twice under different module names (ComfyUI imports it by folder
name; tests may import ``nodes`` top-level), so the ops are defined only when the namespace
does not hold them yet; a second import reuses the first definition.
"""
from __future__ import annotations

from typing import Optional

import torch

from ._kernels import kernels

NAMESPACE = "sparse_video_attn"


def _defined(name: str) -> bool:
    try:
        getattr(getattr(torch.ops, NAMESPACE), name)
        return True
    except (AttributeError, RuntimeError):
        return False


def _ranges(flat: list[int]):
    return [(flat[i], flat[i + 1]) for i in range(0, len(flat), 2)] or None


def precision_for(backend: str, precision: str) -> str:
    """The ``precision`` a backend's function takes: the float references have no GPU
    architecture for ``auto`` to choose for, so ``auto`` there is the reference of the bf16
    path."""
    return "bf16" if backend == "reference" and precision == "auto" else precision


def _sol_impl(q, k, v, beta: float, beta_heads: Optional[torch.Tensor], estimator: str,
              sinks: list[int], scale: float, grid: list[int], tile: list[int], backend: str, precision: str):
    fn = kernels.sol_attention_reference if backend == "reference" else kernels.sol_attention
    out, stats = fn(
        q, k, v,
        beta=beta_heads if beta_heads is not None else beta,
        estimator=estimator,
        sinks=_ranges(sinks),
        scale=None if scale <= 0 else scale,
        return_stats=True,
        grid=tuple(grid) or None,
        tile=tuple(tile) or None,
        precision=precision_for(backend, precision),
    )
    return out.to(q.dtype).contiguous(), stats["density"].to(torch.float32).contiguous()


def _psa_impl(q, k, v, grid: list[int], params: torch.Tensor, tile: list[int],
              extra_tokens: int, scale: float, backend: str, precision: str):
    fn = kernels.psa_attention_reference if backend == "reference" else kernels.psa_attention
    out = fn(q, k, v, grid=tuple(grid), params=params, tile=tuple(tile),
             extra_tokens=extra_tokens, scale=None if scale <= 0 else scale,
             precision=precision_for(backend, precision))
    return out.to(q.dtype).contiguous()


if not _defined("sol_attention"):
    @torch.library.custom_op(f"{NAMESPACE}::sol_attention", mutates_args=())
    def _sol_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: float,
                beta_heads: Optional[torch.Tensor], estimator: str, sinks: list[int],
                scale: float, grid: list[int], tile: list[int],
                backend: str, precision: str) -> tuple[torch.Tensor, torch.Tensor]:
        return _sol_impl(q, k, v, beta, beta_heads, estimator, sinks, scale, grid, tile, backend, precision)

    @_sol_op.register_fake
    def _(q, k, v, beta, beta_heads, estimator, sinks, scale, grid, tile, backend, precision):
        b, _, h, _ = q.shape
        return (q.new_empty(q.shape), q.new_empty((b, h), dtype=torch.float32))

if not _defined("psa_attention"):
    @torch.library.custom_op(f"{NAMESPACE}::psa_attention", mutates_args=())
    def _psa_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grid: list[int],
                params: torch.Tensor, tile: list[int], extra_tokens: int, scale: float,
                backend: str, precision: str) -> torch.Tensor:
        return _psa_impl(q, k, v, grid, params, tile, extra_tokens, scale, backend, precision)

    @_psa_op.register_fake
    def _(q, k, v, grid, params, tile, extra_tokens, scale, backend, precision):
        return q.new_empty(q.shape)


def sol_attention(q, k, v, *, beta, estimator="exact", sinks=None, scale=None, grid=None,
                  tile=None, backend="triton", precision="auto"):
    """Sol-Attn through the custom op; returns ``(out (B,L,H,D), density (B,H))``;
    ``precision`` as :func:`precision_for` passes it on."""
    beta_heads = beta if torch.is_tensor(beta) else None
    beta_f = 0.0 if beta_heads is not None else float(beta)
    flat = [int(x) for r in (sinks or ()) for x in r]
    op = getattr(torch.ops, NAMESPACE).sol_attention
    return op(q, k, v, beta_f, beta_heads, estimator, flat, -1.0 if scale is None else float(scale),
              list(grid or ()), list(tile or ()), backend, precision)


def psa_attention(q, k, v, *, grid, params, tile, extra_tokens=0, scale=None, backend="triton", precision="auto"):
    op = getattr(torch.ops, NAMESPACE).psa_attention
    return op(q, k, v, list(grid), params, list(tile), int(extra_tokens),
              -1.0 if scale is None else float(scale), backend, precision)
