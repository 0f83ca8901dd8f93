"""Launch configurations of the engine kernel, one row per GPU architecture.

Triton launches fail when a kernel asks for more shared memory per block than the GPU has
(sm_86/89/120: 99 KB; sm_80: 163 KB; sm_90/100: 227 KB), so the software-pipelining depth and
the key sub-tile are chosen per architecture, and TMA boxes only where the copy engine exists
(capability 9 and later). ``tools/compile_kernels.py`` compiles every launch the pack makes
with each row below for its architecture and fails if one does not fit; the shared memory
each launch asked for is in the table of docs/KERNELS.md, "GPU support".

The configuration of a device is chosen once, logged once with its reason
(``describe``), and shown in the run summary of the ComfyUI nodes. A benchmark forces another
architecture's row with ``config=config_for_capability((8, 6))`` to time it where it runs.
"""
from __future__ import annotations

import functools
import logging
from dataclasses import dataclass, replace

import torch

from .._device import triton_interpreting

log = logging.getLogger("sparse_video_attention.kernels")

__all__ = ["LaunchConfig", "config_for_capability", "config_for_device", "row_capability", "ARCHITECTURES"]


@dataclass(frozen=True)
class LaunchConfig:
    """How the engine kernel is launched on one architecture.

    ``tma``: grid blocks through TMA boxes (else the pointer loop); ``warp_specialized``: the
    Hopper loop of ``hopper_loop`` (a TMA producer warp, two consumer warpgroups) wherever a
    call allows it; ``num_stages``: the ring's slots there (as many as fit, at most this), else the
    software-pipelining depth of the key loop; ``sol_stages``: that depth for Sol's 64-row query
    tiles on the pointer loop; ``psa_quantized_stages``: that depth for PSA's longer tiles with
    quantized (int8, fp8) keys there; ``sol_warps``/``psa_warps``: warps per program
    (Sol: 64-row query tiles, PSA: up to 128-row tiles); ``psa_block_n``: PSA key rows per
    inner step of the pointer loop; ``pool_chunk``: pooled blocks per step of Sol's pooled
    term; ``reason``: why, in a sentence (logged); ``shared_memory_per_sm``: the bytes of shared
    memory one SM of the architecture holds, which with a launch's own shared memory (plus the
    1 KB the GPU reserves a block) sets how many programs run on an SM at once.
    """

    name: str
    capability: tuple
    tma: bool
    num_stages: int
    sol_stages: int
    psa_quantized_stages: int
    sol_warps: int
    psa_warps: int
    psa_block_n: int
    reason: str
    shared_memory_per_sm: int
    pool_chunk: int = 64
    warp_specialized: bool = False

    def describe(self) -> str:
        loop = "warp-specialised TMA loop" if self.warp_specialized else "TMA boxes" if self.tma else "pointer loop"
        own_depths = [f"{calls} {stages}" for calls, stages in (("Sol", self.sol_stages),
                                                                 ("PSA int8/fp8", self.psa_quantized_stages))
                      if stages != self.num_stages]
        depths = f" ({', '.join(own_depths)})" if own_depths else ""
        return (f"{self.name} (sm_{self.capability[0]}{self.capability[1]}): "
                f"{loop}, {self.num_stages} stages{depths}, "
                f"Sol {self.sol_warps} warps, PSA {self.psa_warps} warps / {self.psa_block_n}-row key steps; "
                f"{self.reason}")


# The rows with 100 KB of shared memory an SM (sm_86, sm_89, sm_120; 99 KB a block): 64-row PSA
# key steps let 3 stages fit (at most 98,304 bytes a launch, Triton 3.8 and 3.6). Sol's 64-row
# programs take 2: 49,664 bytes let two of them share an SM, where 3 stages (81,920)
# leave one; with the sm_89 row forced on an H100 whose SM was held to 100 KB
# (benchmarks/sm_shared_memory.py), 2 stages ran Sol 1.22x (bf16) and 1.14x (int8) faster.
# PSA's int8/fp8 launches take 2: with 2 int8 beat bf16 on Wan 720p's and HunyuanVideo 768p's
# grids, with 3 on Hunyuan's only (kernels/DESIGN.md, "On the 100 KB rows").
_POINTER_99KB = ("no TMA before Hopper; 100 KB of shared memory an SM: 3 stages with 64-row PSA key steps, "
                 "Sol 2 stages so that two of its programs share an SM, PSA's int8/fp8 2 (int8 ran faster with 2)")

# capability -> configuration. Shared memory per launch (bytes, Triton 3.8 and 3.6) is printed
# by tools/compile_kernels.py.
ARCHITECTURES = {
    (8, 0): LaunchConfig("A100", (8, 0), tma=False, num_stages=3, sol_warps=4, psa_warps=8, psa_block_n=128,
                         sol_stages=3, psa_quantized_stages=3, shared_memory_per_sm=164 * 1024,
                         reason="no TMA before Hopper; 164 KB of shared memory an SM hold 3 stages "
                                "(two of Sol's programs)"),
    (8, 6): LaunchConfig("RTX 30", (8, 6), tma=False, num_stages=3, sol_warps=4, psa_warps=8, psa_block_n=64,
                         sol_stages=2, psa_quantized_stages=2, shared_memory_per_sm=100 * 1024,
                         reason=_POINTER_99KB),
    (8, 9): LaunchConfig("RTX 40", (8, 9), tma=False, num_stages=3, sol_warps=4, psa_warps=8, psa_block_n=64,
                         sol_stages=2, psa_quantized_stages=2, shared_memory_per_sm=100 * 1024,
                         reason=_POINTER_99KB),
    (9, 0): LaunchConfig("H100/H200", (9, 0), tma=True, num_stages=3, sol_warps=4, psa_warps=8, psa_block_n=128,
                         warp_specialized=True, sol_stages=3, psa_quantized_stages=3,
                         shared_memory_per_sm=228 * 1024,
                         reason="warp-specialised TMA loop (hopper_loop); else TMA boxes, 227 KB of shared memory "
                                "hold 3 stages (measured best on the H200)"),
    (10, 0): LaunchConfig("B200", (10, 0), tma=True, num_stages=3, sol_warps=4, psa_warps=8, psa_block_n=128,
                          sol_stages=3, psa_quantized_stages=3, shared_memory_per_sm=228 * 1024,
                          reason="TMA boxes; 227 KB of shared memory as on Hopper"),
    (12, 0): LaunchConfig("RTX 50", (12, 0), tma=False, num_stages=3, sol_warps=4, psa_warps=8, psa_block_n=64,
                          sol_stages=2, psa_quantized_stages=2, shared_memory_per_sm=100 * 1024,
                          reason=f"{_POINTER_99KB}; the pointer loop, since PSA's 128-row TMA boxes spill 656-704 "
                                 f"bytes per thread there (Triton 3.6)"),
}


def row_capability(capability) -> tuple:
    """The capability whose row a GPU takes: its own, else the nearest older one of the same
    family (sm_87 → sm_86, sm_103 → sm_100, sm_121 → sm_120), else the nearest older known.
    The precision table (``precision``) is keyed the same way."""
    cap = tuple(int(x) for x in capability)
    if cap in ARCHITECTURES:
        return cap
    older = [c for c in ARCHITECTURES if c <= cap]
    if not older:
        raise ValueError(f"compute capability {cap} is older than the oldest supported (sm_80)")
    same_major = [c for c in older if c[0] == cap[0]]
    return max(same_major or older)


def config_for_capability(capability) -> LaunchConfig:
    """The row for a compute capability (``row_capability``): its own, or a copy of the row it
    takes, renamed and with the reason."""
    cap = tuple(int(x) for x in capability)
    base = ARCHITECTURES[row_capability(cap)]
    if base.capability == cap:
        return base
    return replace(base, name=f"{base.name}-like", capability=cap,
                   reason=f"no row for sm_{cap[0]}{cap[1]}: using sm_{base.capability[0]}{base.capability[1]}'s "
                          f"({base.reason})")


@functools.lru_cache(maxsize=16)
def _logged_config(capability) -> LaunchConfig:
    config = config_for_capability(capability)
    log.info("[sparse-video-attention] kernel configuration %s", config.describe())
    return config


def config_for_device(device) -> LaunchConfig:
    """The configuration of a CUDA device (logged once per architecture). Under Triton's CPU
    interpreter: the Hopper row with its TMA boxes (the interpreter runs them too, but not the
    warp-specialised Gluon loop: ``hopper_loop.ws_supported`` says no there)."""
    device = torch.device(device)
    if device.type != "cuda":
        if triton_interpreting():
            return ARCHITECTURES[(9, 0)]
        raise ValueError(f"the Triton kernels need a CUDA device, got {device}")
    return _logged_config(torch.cuda.get_device_capability(device))
