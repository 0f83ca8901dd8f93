"""Where a benchmark's Triton kernels run: on the GPU, or without one through Triton's interpreter."""
from __future__ import annotations

import os

import torch


def kernel_device(ap) -> str:
    """"cuda" when there is a GPU, "cpu" under TRITON_INTERPRET=1; else a usage error of ``ap``."""
    if torch.cuda.is_available():
        return "cuda"
    if os.environ.get("TRITON_INTERPRET") != "1":
        ap.error("without CUDA, run through Triton's interpreter: TRITON_INTERPRET=1")
    return "cpu"
