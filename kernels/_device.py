"""Where the kernels run: the CUDA device of a launch, the interpreter, cache keys of devices."""
from __future__ import annotations

import contextlib
import os

import torch


def triton_interpreting() -> bool:
    """True when Triton runs kernels through its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def kernel_device_ok(device) -> bool:
    """The Triton kernels run on CUDA devices, or anywhere through the interpreter."""
    return device.type == "cuda" or triton_interpreting()


def cache_device(device) -> torch.device:
    """``device`` as a cache key: "cuda" means the current CUDA device, by its index."""
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    return dev


def device_guard(t: torch.Tensor):
    """Triton launches on the current CUDA device: make it ``t``'s (a model on cuda:1)."""
    return torch.cuda.device(t.device) if t.is_cuda else contextlib.nullcontext()
