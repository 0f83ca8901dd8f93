"""Sol-Attn and PSA from the ``kernels`` library, without ComfyUI, on random q/k/v.

    python docs/kernels_example.py

On CUDA it runs the Triton kernels (bf16) and checks them against the float32 references; on
the CPU it runs the float32 references (the kernels need CUDA, or Triton's interpreter with
TRITON_INTERPRET=1). Either way it prints each method's density and its rel-L2 distance from
dense attention. q and k share a smooth random function of each token's (t, h, w) position, so
attention is local as in a video model; with plain random q/k/v every token attends to all
others about equally and no sparse method comes near dense. This is a toy: BENCHMARKS.md has
the synthetic video-like workload the pack was measured on.
"""
from __future__ import annotations

import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root holds `kernels`

import kernels  # noqa: E402
from kernels.psa_mask import psa_mask  # noqa: E402

GRID = (8, 16, 16)   # video tokens (T, H, W), row-major in the sequence: L = 2048
HEADS, HEAD_DIM = 4, 64


def rel_l2(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


def local_qkv(gen: torch.Generator):
    """q, k, v (1, L, HEADS, HEAD_DIM), float32: q and k are the same sin/cos features of the
    token position (random frequencies) plus noise, v is noise."""
    t, h, w = torch.meshgrid(*(torch.arange(n) for n in GRID), indexing="ij")
    angles = torch.stack([t, h, w], -1).reshape(-1, 3).float() @ (0.5 * torch.randn(3, HEAD_DIM // 2, generator=gen))
    position = torch.cat([angles.sin(), angles.cos()], -1)[None, :, None, :]
    q, k = (3.0 * position + 0.3 * torch.randn(1, position.shape[1], HEADS, HEAD_DIM, generator=gen) for _ in range(2))
    return q, k, torch.randn(q.shape, generator=gen)


def main() -> None:
    cuda = torch.cuda.is_available()
    device, dtype = ("cuda", torch.bfloat16) if cuda else ("cpu", torch.float32)
    q, k, v = (t.to(device, dtype) for t in local_qkv(torch.Generator().manual_seed(0)))
    dense = torch.nn.functional.scaled_dot_product_attention(
        *(t.transpose(1, 2).float() for t in (q, k, v))).transpose(1, 2)

    # Sol-Attn: β from a target density of 15 % of the 64-token key blocks computed exactly
    # (1 − Φ(β) assumes Gaussian proxy scores; the achieved density is printed).
    beta = kernels.beta_for_density(0.15)
    sol_ref = kernels.sol_attention_reference(q, k, v, beta=beta)
    density = kernels.sol_block_selection(q, k, v, beta=beta).float().mean().item()
    print(f"Sol-Attn  beta {beta:.3f}: {density:.1%} of key blocks exact, rel-L2 vs dense {rel_l2(sol_ref, dense):.3f}")
    if cuda:
        sol = kernels.sol_attention(q, k, v, beta=beta)
        print(f"  Triton kernel vs float32 reference: rel-L2 {rel_l2(sol, sol_ref):.4f}")

    # PSA: one row (Tw, To, Ts, Sw, So, Ss) per head, counted in tiles of (2, 4, 8) tokens
    # (kernels/psa_mask.py explains them): heads 0-1 keep the neighbouring frames and the same
    # row of tiles, heads 2-3 all frames two tiles apart and a narrower band.
    tile = (2, 4, 8)
    params = torch.tensor([[2, 0, 0, 2, 0, 0]] * 2 + [[1, 0, 2, 1, 0, 0]] * 2)
    mask = psa_mask(GRID, params, tile)
    psa_ref = kernels.psa_attention_reference(q, k, v, grid=GRID, params=params, tile=tile)
    print(f"PSA       block grid {mask.block_grid}: densities {[round(float(d), 3) for d in mask.density()]}, "
          f"rel-L2 vs dense {rel_l2(psa_ref, dense):.3f}")
    if cuda:
        psa = kernels.psa_attention(q, k, v, grid=GRID, params=params, tile=tile)
        print(f"  Triton kernel vs float32 reference: rel-L2 {rel_l2(psa, psa_ref):.4f}")


if __name__ == "__main__":
    main()
