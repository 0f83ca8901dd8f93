"""64-bit head offsets in both kernels, checked on the CPU.

With heads-first storage (HunyuanVideo), (H - 1)·L·D passes 2^31 for long videos: a 32-bit
``h * stride_h`` then wraps and the last heads read another head's memory. Such tensors are
too large for a CPU test, so this checks (1) the shared helper computes the offset exactly
past 2^31 (the interpreter's integer arithmetic wraps at 32 bits like the GPU's), and (2)
every kernel that addresses q/k/v/o takes its batch/head base offsets from that helper. The full-size case runs in
tests/gpu/test_kernels_gpu.py.
"""
import inspect
import re

import torch
import triton
import triton.language as tl

from kernels import _triton_common, sol_gpu_routing
from kernels.engine import portable, quantize

# HunyuanVideo heads-first: stride of one head = L·D elements
L_TOKENS, HEADS, HEAD_DIM = 270_336, 64, 128


@triton.jit
def _offset_probe(OUT, stride_b, stride_h, FIRST_HEAD: tl.constexpr):
    # program ids are 32-bit, as in the kernels
    h = tl.program_id(0) + FIRST_HEAD
    b = tl.program_id(1)
    tl.store(OUT + tl.program_id(1) * tl.num_programs(0) + tl.program_id(0),
             _triton_common.head_offset(b, h, stride_b, stride_h))


def test_head_offset_is_exact_past_2_to_the_31():
    stride_h = L_TOKENS * HEAD_DIM
    stride_b = HEADS * stride_h
    assert (HEADS - 1) * stride_h >= 2**31 and stride_h < 2**31   # the argument itself is 32-bit
    out = torch.zeros(2, 2, dtype=torch.int64)
    _offset_probe[(2, 2)](out, stride_b, stride_h, FIRST_HEAD=HEADS - 2)
    want = [[b * stride_b + h * stride_h for h in (HEADS - 2, HEADS - 1)] for b in (0, 1)]
    assert out.tolist() == want


def test_every_kernel_takes_head_offsets_from_the_64_bit_helper():
    """The engine (PSA and Sol), Sol's pooling kernel and the int8 key quantization: the
    kernels that address q/k/v/o and the key codes (c). A head index may have a suffix (the
    engine's k head ``hk``: the key codes hold a group's heads only)."""
    for kernel, tensors in ((portable._block_sparse_kernel, "qkvo"), (sol_gpu_routing._pool_kernel, "qkv"),
                            (quantize._quantize_keys_kernel, "kc")):
        src, name = inspect.getsource(kernel.fn), kernel.fn.__name__
        # no 32-bit product of a head or batch index with a stride
        assert not re.search(r"\b(b|h\w*) \* stride_", src), name
        for t in tensors:
            assert re.search(rf"head_offset\(b, h\w*, stride_{t}b, stride_{t}h\)", src), (name, t)
