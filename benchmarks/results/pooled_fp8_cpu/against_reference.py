"""CPU study (session 16, NOTES #49): the FP8 pooled term of ``probe.py`` against the float32
pooled term (not against dense), on gaussian q/k/v as the GPU tests draw them (bf16 values,
2 heads, β 1.04), all four operands rounded and each alone.
    python benchmarks/results/pooled_fp8_cpu/against_reference.py > benchmarks/results/pooled_fp8_cpu/against_reference.txt
"""
import importlib.util
import os

import torch

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("probe", os.path.join(here, "probe.py"))
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)


def rel(a, b):
    return ((a - b).norm() / b.norm()).item()


for grid in ((6, 32, 32), (4, 45, 80)):
    L = grid[0] * grid[1] * grid[2]
    g = torch.Generator().manual_seed(L)
    q, k, v = (torch.randn(1, L, 2, 128, generator=g).to(torch.bfloat16).float() for _ in range(3))
    ref, density = probe.sol_ref(q, k, v, 1.04, grid)
    print(f"grid {grid}, {L} tokens, density {density:.3f}: rel-L2 against the float32 pooled term", flush=True)
    for operands in (("q", "k", "v", "p"), ("q",), ("k",), ("v",), ("p",), ("q", "k")):
        out, _ = probe.sol_ref(q, k, v, 1.04, grid, operands)
        print(f"  e4m3 {'+'.join(operands):<8} {rel(out, ref):.4f}", flush=True)
