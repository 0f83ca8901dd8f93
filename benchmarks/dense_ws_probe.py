"""Dense flash-attention forward with and without Triton's automatic warp specialization.

A measuring instrument for ``bench_kernels.py --ceiling``, not a product kernel. Our block-sparse
loops reach about 85 % of cuDNN with every block visited; the question is whether
``tl.range(..., warp_specialize=True)`` (on Hopper the ``add_hopper_warpspec`` pass: one TMA
producer warp group feeding two MMA/softmax consumer groups) lifts a plain dense Triton loop
above that, which would make porting the sparse loops to it worth the effort.

What the Hopper pass accepts (compiled for sm_90 on the CPU with Triton 3.8 and 3.6, the
device's; run this file to see it again):
* every load it moves to the producer must be a tensor-descriptor load: a pointer ``tl.load``
  of q fails ("unsupported load type for producer commit"), so does a scalar pointer load per
  step such as a block id ("Unexpected result type"); hence no block list here;
* num_warps is the size of one group: 4 gives 12 warps in all, 8 gives no partition;
* the two consumer groups split the query tile by rows. With BLOCK_M=128 each takes 64 rows and
  the q load and o store are cut in halves, which needs descriptors made in the kernel
  (``tl.make_tensor_descriptor``; k and v use them too, for one mechanism): a host
  descriptor's 128-row box cannot be retyped, and loading two 64-row boxes and joining them
  fails in the pass. With BLOCK_M=64 there is nothing
  to split and both groups compute the same tile: twice the MMA work for the same output;
* with 3 stages the partitioned kernels need 241 KB (BLOCK_M=64) and 257 KB (128) of shared
  memory, over the H200's 227 KB, so they run 2 stages. The compiler does not check this limit;
  only the launch would fail.

q, k, v, out are (B, L, H, D) contiguous, seen as 2D (B·L, H·D): a box is BLOCK rows of one
head's D columns. No masking: L must be a multiple of BLOCK_M and BLOCK_N (the ceiling runs
80,640 = 630·128 tokens).
"""
import math
import os
import sys

import torch
import triton
import triton.language as tl

BLOCK_N = 128

# bench_kernels.py row name: (warp_specialize, BLOCK_M)
VARIANTS = {
    "triton_dense_ws_off": (False, 64),
    "triton_dense_ws_on": (True, 64),
    "triton_dense_ws_on_m128": (True, 128),
}


@triton.jit
def _dense_attention_kernel(q_ptr, k_ptr, v_ptr, o_ptr, rows, L, H, qk_scale_log2,
                            HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                            WARP_SPECIALIZE: tl.constexpr):
    q_desc = tl.make_tensor_descriptor(q_ptr, [rows, H * HEAD_DIM], [H * HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
    k_desc = tl.make_tensor_descriptor(k_ptr, [rows, H * HEAD_DIM], [H * HEAD_DIM, 1], [BLOCK_N, HEAD_DIM])
    v_desc = tl.make_tensor_descriptor(v_ptr, [rows, H * HEAD_DIM], [H * HEAD_DIM, 1], [BLOCK_N, HEAD_DIM])
    o_desc = tl.make_tensor_descriptor(o_ptr, [rows, H * HEAD_DIM], [H * HEAD_DIM, 1], [BLOCK_M, HEAD_DIM])
    bh = tl.program_id(1)
    row0 = (bh // H) * L
    col = (bh % H) * HEAD_DIM
    q_row = row0 + tl.program_id(0) * BLOCK_M
    q = q_desc.load([q_row, col])
    m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for j in tl.range(0, L, BLOCK_N, warp_specialize=WARP_SPECIALIZE):
        k = k_desc.load([row0 + j, col])
        v = v_desc.load([row0 + j, col])
        s = tl.dot(q, tl.trans(k)) * qk_scale_log2
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.math.exp2(m_i - m_new)
        p = tl.math.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = tl.dot(p.to(v.dtype), v, acc * alpha[:, None])
        m_i = m_new
    o_desc.store([q_row, col], (acc / l_i[:, None]).to(q.dtype))


def dense_attention(q, k, v, warp_specialize: bool, block_m: int = 64):
    """softmax(q kᵀ/√D) v for (B, L, H, D) contiguous q, k, v. Returns (out (B, L, H, D), the
    compiled kernel: None under the interpreter)."""
    B, L, H, D = q.shape
    assert all(x.is_contiguous() and x.shape == q.shape and x.dtype == q.dtype for x in (q, k, v))
    assert L % block_m == 0 and L % BLOCK_N == 0, "no masking: L must be a multiple of both blocks"
    out = torch.empty_like(q)
    # Descriptors made in the kernel are written to global scratch memory taken from this allocator.
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device=q.device))
    compiled = _dense_attention_kernel[(L // block_m, B * H)](
        q, k, v, out, B * L, L, H, D ** -0.5 * math.log2(math.e),
        HEAD_DIM=D, BLOCK_M=block_m, BLOCK_N=BLOCK_N, WARP_SPECIALIZE=warp_specialize,
        num_warps=4, num_stages=2 if warp_specialize else 3)  # 2: shared memory, see the docstring
    return out, compiled


def kernel_facts(compiled):
    """What the compiler made of a launch: warps in total (each partition adds a group), shared
    memory, and whether the loop was partitioned."""
    return dict(num_warps=compiled.metadata.num_warps, shared_bytes=compiled.metadata.shared,
                warp_specialized="ttg.warp_specialize" in compiled.asm["ttgir"])


def main() -> int:
    """Compile every variant for sm_90 (bf16, D=128) without a GPU and print what came out."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
    from compile_kernels import CapturedLaunch, compile_call

    global _dense_attention_kernel
    launch = CapturedLaunch(_dense_attention_kernel)
    _dense_attention_kernel = launch
    q, k, v = (torch.randn(1, 256, 2, 128, dtype=torch.bfloat16) for _ in range(3))
    failures = 0
    for name, (ws, block_m) in VARIANTS.items():
        dense_attention(q, k, v, ws, block_m)
        try:
            print(f"ok   {name}: {kernel_facts(compile_call(launch.fn, *launch.calls.pop()))}", flush=True)
        except Exception as exc:  # report every variant, fail at the end
            failures += 1
            print(f"FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
