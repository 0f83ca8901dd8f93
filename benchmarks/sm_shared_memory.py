"""Run Triton kernels with the shared memory of a smaller GPU's SM, for forced launch rows.

A forced row (``bench_kernels.py --loops sm89``) compiles the RTX 40 row's kernels for the GPU
at hand. An H100 SM holds 228 KB of shared memory, an RTX 30/40/50 SM 100 KB and an A100 SM
164 KB, so a launch of 81,920 bytes runs two programs an SM on the H100 and one on an RTX 40:
timed without more, the forced row would run at an occupancy its GPU never gives it.

``SharedMemoryPerSM`` hooks every Triton launch (Triton's ``launch_enter_hook``) and sets the
kernel's preferred shared-memory carveout (``CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT``)
to the largest percentage of this GPU's SM that does not exceed the row's
``LaunchConfig.shared_memory_per_sm``; the driver rounds it up to the next capacity the SM
supports (on Hopper 100 and 164 KB are two of them), so as many programs fit an SM as on the
row's GPU. Launches outside such a row get the kernel's own setting back. Other libraries'
kernels (cuDNN, comfy-kitchen) are not Triton launches and keep this GPU's SM.
"""
from __future__ import annotations

import ctypes

import torch

_CARVEOUT = 9  # CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT


def carveout_percent(limit: int | None, device_bytes: int) -> int | None:
    """The preferred carveout (percent of this GPU's shared memory an SM) that gives at most
    ``limit`` bytes before the driver rounds it up to a capacity the SM supports; None when
    there is no limit or it is not below this GPU's."""
    if limit is None or limit >= device_bytes:
        return None
    return 100 * limit // device_bytes


class SharedMemoryPerSM:
    """The launch hook (installed on construction); ``emulate`` picks the row."""

    def __init__(self, device=0):
        from triton import knobs

        self.device_bytes = torch.cuda.get_device_properties(device).shared_memory_per_multiprocessor
        self.percent = None  # None: the kernel's own setting
        self.own = {}  # CUfunction -> its carveout before the first change
        self.applied = {}  # CUfunction -> the carveout it has now
        self.libcuda = ctypes.CDLL("libcuda.so.1")
        knobs.runtime.launch_enter_hook.add(self)

    def emulate(self, config) -> int | None:
        """Launches from now on run with ``config``'s shared memory per SM (None or a row whose
        SM is not smaller than this GPU's: this GPU's own); returns the bytes emulated, or None."""
        limit = None if config is None else config.shared_memory_per_sm
        self.percent = carveout_percent(limit, self.device_bytes)
        return None if self.percent is None else limit

    def _call(self, name, function, *args):
        rc = getattr(self.libcuda, name)(*args)
        if rc != 0:
            raise RuntimeError(f"{name} on CUfunction {function:#x} failed with CUresult {rc}")

    def __call__(self, metadata):
        if metadata is None:
            return
        function = metadata.get()["function"]
        if function not in self.own:
            value = ctypes.c_int()
            self._call("cuFuncGetAttribute", function, ctypes.byref(value), _CARVEOUT, ctypes.c_void_p(function))
            self.own[function] = self.applied[function] = value.value
        want = self.own[function] if self.percent is None else self.percent
        if self.applied[function] != want:
            self._call("cuFuncSetAttribute", function, ctypes.c_void_p(function), _CARVEOUT, want)
            self.applied[function] = want
