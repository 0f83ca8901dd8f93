"""Where a step of Sol's Hopper loop spends its time: the engine fed one routed mask with its
pooled term (Wan 720p, 40 heads, d 128, video-like inputs), timed with parts of the
consumers' step or of the producer's copies cut out of ``kernels/engine/hopper_loop.py``,
each variant built and timed in a process of its own. A cut variant's output is wrong by
design; its time says what the step costs without that part. The baseline runs first and
last, so that a drift of the GPU's clock between processes shows.

    python3 benchmarks/hopper_step_ablation.py --out benchmarks/results/hopper_step_ablation_h100.json

Needs an sm_90 GPU and a Triton that builds the Hopper loop. ``--check`` only checks that
every cut still applies to the loop's source (the CPU tests run it).
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from benchmarks.results_file import write_results  # noqa: E402

LOOP_SOURCE = os.path.join(REPO, "kernels", "engine", "hopper_loop.py")
GRID = (21, 45, 80)
HEADS = 40

# (source, replacement) pairs; each source occurs once in the loop.
_QK_MMA = ("""\
    s = warpgroup_mma(q_op, k_buf.permute((1, 0)), _no_scores(k_buf, me), use_acc=False, is_async=True)
    s, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(s, q_op, k_buf))
""", "    s = _no_scores(k_buf, me)\n")
_EXP2 = ("    p = gl.exp2(s - m_new[:, None])\n", "    p = s - m_new[:, None]\n")
_SOFTMAX = ("""\
    m_new = gl.maximum(m_i, gl.max(s, 1))
    alpha = gl.exp2(m_i - m_new)
    p = gl.exp2(s - m_new[:, None])
    l_i = l_i * alpha + gl.sum(p, 1)
    acc = acc * gl.convert_layout(alpha, gl.SliceLayout(1, me.acc_layout))[:, None]
    return m_new, l_i, acc, p
""", "    return m_i, l_i, acc, s\n")
_PV_MMA = ("""\
    acc = warpgroup_mma(p_op, v_buf, acc, is_async=True)
    acc, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, v_buf))
""", "")
_KEY_BITS = ("            bias = _pair_step_bias(call, shape, blk0, blk1, empty1, offs_n)\n",
             "            bias = zero_bias\n")
_COPIES = ("""\
    mbarrier.expect(ring.k_ready.index(slot), 2 * K_CHUNKS * call.k_grid.block_type.nbytes)
    _copy_block_half(call, shape, call.k_grid, call.k_seq, k_at, blk0, k_slots, k_slot, 0, ring.k_ready.index(slot))
    _copy_block_half(call, shape, call.k_grid, call.k_seq, k_at, blk1, k_slots, k_slot, 1, ring.k_ready.index(slot))
    mbarrier.expect(ring.v_ready.index(slot), 2 * V_CHUNKS * call.v_grid.block_type.nbytes)
    _copy_block_half(call, shape, call.v_grid, call.v_seq, v_at, blk0, ring.v_ring, slot, 0, ring.v_ready.index(slot))
    _copy_block_half(call, shape, call.v_grid, call.v_seq, v_at, blk1, ring.v_ring, slot, 1, ring.v_ready.index(slot))
""", """\
    mbarrier.arrive(ring.k_ready.index(slot), count=1)
    mbarrier.arrive(ring.v_ready.index(slot), count=1)
""")
_HALF_WIDTH = [("    for chunk in gl.static_range(CHUNKS):\n", "    for chunk in gl.static_range(1):\n"),
               ("    K_CHUNKS: gl.constexpr = shape.HEAD_DIM // call.k_grid.block_type.shape[4]\n",
                "    K_CHUNKS: gl.constexpr = 1\n"),
               ("    V_CHUNKS: gl.constexpr = shape.HEAD_DIM // call.v_grid.block_type.shape[4]\n",
                "    V_CHUNKS: gl.constexpr = 1\n")]
_NO_COMPUTE = [_QK_MMA, _SOFTMAX, _PV_MMA]

# name: (what is cut, its (source, replacement) pairs).
CUTS = {
    "no QK^T MMA": ("the scores are zeros: no QKᵀ wgmma and no wait on it", [_QK_MMA]),
    "no exp2 of P": ("P is s - m instead of exp2(s - m) (the row max, sums and rescale stay)", [_EXP2]),
    "no softmax": ("P is the scores: no row max, exp2, sums or rescale", [_SOFTMAX]),
    "no P.V MMA": ("no P·V wgmma and no wait on it", [_PV_MMA]),
    "no MMAs": ("neither wgmma nor the waits on them (the softmax stays)", [_QK_MMA, _PV_MMA]),
    "no compute": ("neither wgmma nor the softmax: the producer's copies and the ring's barriers",
                   _NO_COMPUTE),
    "no key-bits bias": ("the exact steps' bias is zero: no loads of the blocks' key bits", [_KEY_BITS]),
    "no exact copies": ("the producer marks the exact steps' slots ready without copying into them (the "
                        "pooled chunks are copied)", [_COPIES]),
    "half-width copies": ("each half-slot copy moves one of its two 128-byte column chunks", _HALF_WIDTH),
    "no compute, no exact copies": ("the ring's barriers and the pooled chunks' copies", [*_NO_COMPUTE, _COPIES]),
    "no compute, half-width copies": ("the ring's barriers and half the exact steps' bytes",
                                      [*_NO_COMPUTE, *_HALF_WIDTH]),
}
# (row name, cut or None, precision): the baseline first and last.
VARIANTS = (("baseline", None, "bf16"), ("int8", None, "int8"),
            *((name, name, "bf16") for name in CUTS), ("baseline again", None, "bf16"))


def cut_source(cut):
    """hopper_loop.py's source with ``cut`` (a key of CUTS, or None) applied."""
    src = open(LOOP_SOURCE, encoding="utf-8").read()
    if cut is None:
        return src
    for old, new in CUTS[cut][1]:
        if src.count(old) != 1:
            raise ValueError(f"cut {cut!r}: its source occurs {src.count(old)} times in {LOOP_SOURCE}, expected once")
        src = src.replace(old, new)
    return src


def time_variant(source_path, precision, density, rep_ms):
    """Child process: load ``source_path`` as the Hopper loop, time the engine on the routed
    mask with its pooled term in ``precision``; print one JSON line."""
    import importlib.util

    import torch

    import kernels
    spec = importlib.util.spec_from_file_location("kernels.engine.hopper_loop", source_path)
    loop = importlib.util.module_from_spec(spec)
    sys.modules["kernels.engine.hopper_loop"] = loop
    spec.loader.exec_module(loop)
    from benchmarks.bench_kernels import bench_ms, sol_pieces, video_like_qkv
    from kernels.engine import block_sparse_attention
    from kernels.engine.launch_config import ARCHITECTURES

    runs = []
    real = loop.ws_block_sparse_attention
    loop.ws_block_sparse_attention = lambda *a, **kw: runs.append(1) or real(*a, **kw)
    q, k, v = video_like_qkv(GRID, HEADS, 128, seed=GRID[0] * GRID[1] * GRID[2])
    _, routing, scale = sol_pieces(q, k, v, kernels.beta_for_density(density), GRID, None)
    mask, pooled = routing()
    config = ARCHITECTURES[(9, 0)]

    def call():
        return block_sparse_attention(q, k, v, mask, pooled=pooled, config=config, scale=scale, precision=precision)

    call()
    torch.cuda.synchronize()
    print(json.dumps(dict(ms=bench_ms(call, rep_ms), ran_hopper_loop=bool(runs))))


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="results file (JSON)")
    ap.add_argument("--density", type=float, default=0.15, help="target density of the routed mask")
    ap.add_argument("--rep-ms", type=int, default=200, help="triton.testing.do_bench's rep per variant")
    ap.add_argument("--check", action="store_true", help="only check that every cut applies to the source")
    args = ap.parse_args(argv)
    if not 0 < args.density <= 1:
        ap.error(f"--density: expected a share in (0, 1], got {args.density}")
    sources = {cut: cut_source(cut) for cut in (None, *CUTS)}
    if args.check:
        print(f"{len(CUTS)} cuts apply to {os.path.relpath(LOOP_SOURCE, REPO)}")
        return sources
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.error("needs an sm_90 GPU (H100 / H200): the Hopper loop runs nowhere else; --check checks the cuts")
    if not args.out:
        ap.error("--out: the results file is required")
    rows = []
    for name, cut, precision in VARIANTS:
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(sources[cut])
        try:
            child = (f"import sys; sys.path.insert(0, {REPO!r}); from benchmarks.hopper_step_ablation import "
                     f"time_variant; time_variant({f.name!r}, {precision!r}, {args.density!r}, {args.rep_ms!r})")
            done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300,
                                  cwd=REPO)
        finally:
            os.unlink(f.name)
        last = (done.stdout.strip().splitlines() or [""])[-1]
        if done.returncode != 0 or not last.startswith("{"):
            raise RuntimeError(f"variant {name!r} failed:\n{done.stderr[-2000:]}")
        row = dict(variant=name, precision=precision, cut=CUTS[cut][0] if cut else None, **json.loads(last))
        rows.append(row)
        print(f"{name:24s} {precision:5s} {row['ms']:8.2f} ms", flush=True)
    import triton

    write_results(args.out, dict(
        command="python3 benchmarks/hopper_step_ablation.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        started=datetime.datetime.now().isoformat(timespec="seconds"), device=torch.cuda.get_device_name(),
        torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
        shape=dict(grid=list(GRID), heads=HEADS, head_dim=128, inputs="video-like"), density=args.density,
        timed="the engine on the routed mask with its pooled term (no routing, no pooling pass)", rows=rows))
    return rows


if __name__ == "__main__":
    main()
