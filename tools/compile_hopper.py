"""Compile the Sol and PSA kernels for Hopper (sm_90) on a machine without a GPU.

CI has no GPU and runs the kernels through Triton's interpreter, which does not apply the
compiler's type rules, layouts or shared-memory limits. This tool builds each launch the
pack makes (the launchers run on CPU tensors, the kernel call is captured instead of run) and
compiles it to a cubin with Triton's bundled LLVM and ptxas, so a kernel that would not build
on the H200 fails here. It never runs a kernel.

    python tools/compile_hopper.py            # prints one line per case, exit 1 on a failure

Must run without TRITON_INTERPRET (tests/test_compile_hopper.py starts it in a subprocess).
"""
from __future__ import annotations

import os
import sys
import traceback

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
    sys.exit("compile_hopper.py: unset TRITON_INTERPRET (the interpreter compiles nothing)")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton._C.libtriton import native_specialize_impl  # noqa: E402
from triton.backends.compiler import BaseBackend, GPUTarget  # noqa: E402

import kernels.psa_triton as psa_triton  # noqa: E402
import kernels.sol_triton as sol_triton  # noqa: E402
import kernels.tile_loop as tile_loop  # noqa: E402
from kernels.sol_routing import block_thresholds, forced_key_blocks, pooled_blocks  # noqa: E402

HOPPER = GPUTarget("cuda", 90, 32)


class CapturedLaunch:
    """Stands in for a @triton.jit kernel: ``kernel[grid](*args, **kw)`` records the call."""

    def __init__(self, fn):
        self.fn = fn
        self.calls = []

    def __getitem__(self, grid):
        return lambda *args, **kw: self.calls.append((args, kw))


def compile_call(fn, args, kw):
    """Compile one captured launch for sm_90 as the JIT would on the H200; returns the kernel.

    Arguments are specialised the way a launch does it (``native_specialize_impl``): an
    integer or pointer divisible by 16 carries ``tt.divisibility``, an integer 1 becomes a
    constant. That changes the IR (vector widths, and what later passes see), so a kernel
    that builds without it may still fail on the device.
    """
    bound = dict(zip(fn.arg_names, args))
    bound.update({k: v for k, v in kw.items() if k in fn.arg_names})
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constexprs[(i,)] = bound[p.name]
            continue
        kind, key = native_specialize_impl(BaseBackend, bound[p.name], p.is_const, not p.do_not_specialize,
                                           not p.do_not_specialize_on_alignment)
        signature[p.name] = kind
        if kind == "constexpr":
            constexprs[(i,)] = bound[p.name]
        elif isinstance(key, str):
            attrs[(i,)] = BaseBackend.parse_attr(key)
    options = {"num_warps": kw.get("num_warps", 4), "num_stages": kw.get("num_stages", 3)}
    return triton.compile(ASTSource(fn, signature, constexprs, attrs), target=HOPPER, options=options)


def qkv(B, L, H, D, dtype, layout):
    """q, k, v (B, L, H, D) in a model's memory layout: "blhd" (Wan, LTX: (B, L, H·D)),
    "heads_first" (HunyuanVideo double blocks) or "single_block" (HunyuanVideo single
    blocks: q, k heads first, v a view into the fused qkv projection)."""
    q, k, v = (torch.randn(B, L, H, D, dtype=dtype) for _ in range(3))
    if layout == "blhd":
        return q, k, v
    heads_first = [x.transpose(1, 2).contiguous().transpose(1, 2) for x in (q, k, v)]
    if layout == "heads_first":
        return tuple(heads_first)
    return heads_first[0], heads_first[1], torch.stack([q, k, v], dim=2)[:, :, 2]


def psa_cases():
    params = torch.tensor([[2, 0, 0, 3, 0, 0], [1, 1, 2, 2, -1, 4]])
    # (name, grid, tile, extra tokens, dtype, head dim, layout)
    yield "psa wan720p-like tile, bf16, TMA", (6, 16, 32), (3, 8, 16), 0, torch.bfloat16, 128, "blhd", params
    yield "psa hunyuan single block, text tokens", (6, 16, 32), (3, 8, 16), 256, torch.bfloat16, 128, "single_block", params
    yield "psa hunyuan768p-like tile, fp16 d64", (6, 16, 16), (6, 8, 8), 77, torch.float16, 64, "heads_first", params
    yield "psa 15-token planes (pointer loop)", (4, 6, 10), (2, 3, 5), 0, torch.bfloat16, 128, "blhd", params


def sol_cases():
    # (name, L, dtype, head dim, layout, sinks, keep_diagonal, route)
    yield "sol fused, ragged tail, bf16", 4133, torch.bfloat16, 128, "blhd", None, False, True
    yield "sol fused, hunyuan single block, sinks", 4096 + 256, torch.bfloat16, 128, "single_block", True, True, True
    yield "sol fused, fp16 d64", 3000, torch.float16, 64, "heads_first", None, False, True
    yield "sol precomputed lists", 4096, torch.bfloat16, 128, "blhd", None, False, False


def run_psa(launch, name, grid, tile, extra, dtype, D, layout, params):
    L = grid[0] * grid[1] * grid[2] + extra
    q, k, v = qkv(1, L, 2, D, dtype, layout)
    psa_triton.launch_psa_kernel(q, k, v, grid, params, tile, extra, scale=D ** -0.5)
    return launch.calls.pop()


def run_sol(launch, name, L, dtype, D, layout, sinks, keep_diagonal, route):
    H = 2
    q, k, v = qkv(1, L, H, D, dtype, layout)
    q_mean, k_mean32, k_mean, v_mean, lens = pooled_blocks(q, k, v)
    tau = block_thresholds(q_mean, k_mean32, torch.ones(H), "exact", D ** -0.5).contiguous()
    forced = forced_key_blocks([(L - 256, L)] if sinks else [], L, "cpu").to(torch.int8)
    lists = None
    if not route:
        n = lens.shape[0]
        lists = sol_triton.block_lists_from_selection(torch.rand(1, H, n, n) < 0.2, L)
    sol_triton.launch_sol_kernel(q, k, v, k_mean.contiguous(), v_mean.contiguous(), tau, forced, lens,
                                 scale=D ** -0.5, keep_diagonal=keep_diagonal, route=route,
                                 correction=route, block_lists=lists)
    return launch.calls.pop()


def main() -> int:
    # Descriptors are host objects; on a CPU-only machine they are still built for CPU tensors.
    tile_loop._tma_available = lambda: True
    psa_launch = CapturedLaunch(psa_triton._psa_kernel)
    sol_launch = CapturedLaunch(sol_triton._sol_kernel)
    psa_triton._psa_kernel, sol_triton._sol_kernel = psa_launch, sol_launch
    failures = 0
    jobs = [(psa_launch, run_psa, case) for case in psa_cases()] + [(sol_launch, run_sol, case) for case in sol_cases()]
    for launch, run, case in jobs:
        name = case[0]
        try:
            args, kw = run(launch, *case)
            compiled = compile_call(launch.fn, args, kw)
            print(f"ok   {name}: TMA={kw['TMA']} cubin {len(compiled.asm['cubin'])} bytes, "
                  f"shared memory {compiled.metadata.shared} bytes", flush=True)
        except Exception:  # report every case, fail at the end
            failures += 1
            print(f"FAIL {name}:\n{traceback.format_exc()}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
