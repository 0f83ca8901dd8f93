"""benchmarks/dense_ws_probe.py, the dense kernel that measures Triton's warp specialization on the
H200: correct under the interpreter (which ignores warp_specialize), and every variant builds for
sm_90 (compiled on the CPU in a subprocess: the interpreter compiles nothing), with the loop
partitioned where the variant asks for it and shared memory within the H200's 227 KB."""
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from benchmarks.dense_ws_probe import VARIANTS, dense_attention

ROOT = Path(__file__).resolve().parent.parent
H200_SHARED_BYTES = 227 * 1024


@pytest.mark.parametrize("name", VARIANTS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.float32])  # bf16 dots are wrong in the interpreter
def test_matches_sdpa(name, dtype):
    ws, block_m = VARIANTS[name]
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 256, 2, 64, generator=gen).to(dtype) for _ in range(3))
    out = dense_attention(q, k, v, ws, block_m)[0]
    ref = F.scaled_dot_product_attention(*(x.float().transpose(1, 2) for x in (q, k, v))).transpose(1, 2)
    err = ((out.float() - ref).norm() / ref.norm()).item()
    assert err < (1e-2 if dtype == torch.float16 else 1e-5), err


def test_every_variant_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "dense_ws_probe.py")], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    facts = {}
    for line in run.stdout.splitlines():
        name, _, info = line.removeprefix("ok").strip().partition(": ")
        facts[name] = ast.literal_eval(info)
    assert facts.keys() == VARIANTS.keys(), run.stdout
    for name, (ws, _) in VARIANTS.items():
        assert facts[name]["warp_specialized"] == ws, (name, facts[name])
        assert facts[name]["num_warps"] == (12 if ws else 4), (name, facts[name])
        assert facts[name]["shared_bytes"] <= H200_SHARED_BYTES, (name, facts[name])
