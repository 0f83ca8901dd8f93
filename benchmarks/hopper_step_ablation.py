"""Where a step of the Hopper loop spends its time: the engine fed one mask (Sol's routed mask
with its pooled term, or with ``--method psa`` a PSA stripe mask; Wan 720p, 40 heads, d 128,
video-like inputs), timed with parts of the consumers' step or of the producer's copies cut
out of ``kernels/engine/hopper_loop.py``, each variant built and timed in a process of its
own. A cut variant's output is wrong by design; its time says what the step costs without
that part. The baseline runs first and last, so that a drift of the GPU's clock between
processes shows.

    python3 benchmarks/hopper_step_ablation.py --out benchmarks/results/hopper_step_ablation_h100.json
    python3 benchmarks/hopper_step_ablation.py --method psa --out benchmarks/results/hopper_step_ablation_psa_h100.json

``--steps`` counts the launch's programs and ring steps per program on the CPU, and for Sol
what pairing each head's query blocks by their routed blocks would make of them.

Needs an sm_90 GPU and a Triton that builds the Hopper loop. ``--check`` only checks that
every cut still applies to the loop's source (the CPU tests run it).
"""
from __future__ import annotations

import argparse
import datetime
import functools
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
HEAD_DIM = 128

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
_KEY_BITS = ("                bias = _pair_step_bias(call, shape, blk0, blk1, empty1, offs_n, part == 0)\n",
             "                bias = zero_bias\n")
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
# PSA's consumers take turns (``_attend_in_turn``): a turn issues the previous tile's P·V and
# this tile's QKᵀ, and one wait covers both.
_TURN_PV = ("    acc = warpgroup_mma(p_prev, v_prev, acc, is_async=True)\n    k_buf = ring.k_ring.index(slot)\n",
            "    k_buf = ring.k_ring.index(slot)\n")
_TURN_QK = ("    s = warpgroup_mma(q_smem, k_buf.permute((1, 0)), _no_scores(k_buf, me), use_acc=False, is_async=True)\n",
            "    s = _no_scores(k_buf, me)\n")
_TURN_WAIT = "    acc, s, _, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, s, q_smem, k_buf, v_prev))\n"
_TURN_MMAS = [_TURN_PV, _TURN_QK, (_TURN_WAIT, "")]
_BOX_COPY = ("""\
    mbarrier.expect(bar, desc.block_type.nbytes)
    dst = ring.index(slot)._reinterpret(desc.dtype, desc.block_type.shape, desc.layout)
    tma.async_copy_global_to_shared(desc, coord, bar, dst)
""", "    mbarrier.arrive(bar, count=1)\n")
_HALVES_COPY = ("""\
    mbarrier.expect(bar, CHUNKS * (desc.block_type.nbytes + second_desc.block_type.nbytes))
    _copy_half(desc, coord, ring_buf, slot, 0, bar)
    _copy_half(second_desc, second_coord, ring_buf, slot, 1, bar)
""", "    mbarrier.arrive(bar, count=1)\n")

PSA_CUTS = {
    "no QK^T MMA": ("the scores are zeros: no QKᵀ wgmma", [_TURN_QK, (_TURN_WAIT, """\
    acc, _, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(acc, q_smem, k_buf, v_prev))
""")]),
    "no P.V MMA": ("no P·V wgmma", [_TURN_PV, (_TURN_WAIT, """\
    s, _, _, _ = warpgroup_mma_wait(num_outstanding=0, deps=(s, q_smem, k_buf, v_prev))
""")]),
    "no MMAs": ("neither wgmma nor the wait on them (the softmax stays)", _TURN_MMAS),
    "no softmax": CUTS["no softmax"],
    "no compute": ("neither wgmma nor the softmax: the producer's copies and the ring's barriers",
                   [*_TURN_MMAS, _SOFTMAX]),
    "no copies": ("the producer marks every slot ready without copying into it", [_BOX_COPY, _HALVES_COPY]),
    "no compute, no copies": ("the ring's barriers and the turns (the compiler drops the unread ring: more "
                              "programs fit an SM)", [*_TURN_MMAS, _SOFTMAX, _BOX_COPY, _HALVES_COPY]),
}
METHOD_CUTS = {"sol": CUTS, "psa": PSA_CUTS}
PSA_TILE = (3, 8, 16)  # the Wan 720p preset's tile


def variants(method):
    """(row name, cut or None, precision) of ``method``'s run: the baseline first and last."""
    return (("baseline", None, "bf16"), ("int8", None, "int8"),
            *((name, name, "bf16") for name in METHOD_CUTS[method]), ("baseline again", None, "bf16"))


def cut_source(cut, method="sol"):
    """hopper_loop.py's source with ``cut`` (a key of ``method``'s cuts, or None) applied."""
    src = open(LOOP_SOURCE, encoding="utf-8").read()
    if cut is None:
        return src
    for old, new in METHOD_CUTS[method][cut][1]:
        if src.count(old) != 1:
            raise ValueError(f"cut {cut!r}: its source occurs {src.count(old)} times in {LOOP_SOURCE}, expected once")
        src = src.replace(old, new)
    return src


def time_variant(source_path, method, precision, density, rep_ms):
    """Child process: load ``source_path`` as the Hopper loop, time the engine in ``precision``
    on Sol's routed mask with its pooled term, or on PSA's stripe mask (``bench_kernels``'
    heads of about ``density``); print one JSON line."""
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
    q, k, v = video_like_qkv(GRID, HEADS, HEAD_DIM, seed=GRID[0] * GRID[1] * GRID[2])
    if method == "sol":
        _, routing, scale = sol_pieces(q, k, v, kernels.beta_for_density(density), GRID, None)
        mask, pooled = routing()
    else:
        mask, pooled, scale = psa_mask(density, q.device), None, HEAD_DIM ** -0.5
    config = ARCHITECTURES[(9, 0)]

    def call():
        return block_sparse_attention(q, k, v, mask, pooled=pooled, config=config, scale=scale, precision=precision)

    call()
    torch.cuda.synchronize()
    print(json.dumps(dict(ms=bench_ms(call, rep_ms), ran_hopper_loop=bool(runs))))


def psa_mask(density, device, grid=GRID, heads=HEADS):
    """The PSA stripe mask this tool times: ``bench_kernels``' heads of about ``density`` on
    the Wan 720p preset's tile."""
    from benchmarks.bench_kernels import psa_params_for_density
    from kernels.psa_mask import psa_kernel_mask

    params, _ = psa_params_for_density(grid, PSA_TILE, heads, density)
    return psa_kernel_mask(grid, params, PSA_TILE, 0, device)


def ring_steps(method, density, grid=GRID, heads=HEADS):
    """(programs, mean ring steps per program) of ``method``'s Hopper-loop launch on the mask
    this tool times, counted on the CPU from the masks' rules: a Sol program walks its pair
    stream (``sol_stream_steps``) after its pooled chunks; a PSA program (128 rows of a query
    tile) walks each listed block a frame a step, or in the edge cover's steps in the last
    block row. Sol's inputs are the video-like ones on the CPU (``benchmarks.workload``),
    statistically the GPU's."""
    import torch

    from kernels.engine.hopper_loop import cover_steps, edge_cover_rows

    if method == "psa":
        mask = psa_mask(density, "cpu", grid, heads)
        lay = mask.layout
        _, rows, cols = lay.block_grid
        edge = edge_cover_rows(lay, 1)
        last_row = (torch.arange(lay.n_blocks) % (rows * cols)) // cols == rows - 1
        per_block = torch.where(last_row, cover_steps(lay.tile[0], lay.tile[1], edge) if edge else lay.tile[0],
                                lay.tile[0]).float()
        tiles = -(-lay.block_tokens // 128)
        return lay.n_blocks * tiles * heads, (mask.to_dense()[0].float() @ per_block).mean().item()
    selected, lay = sol_selection(density, grid, heads)
    steps = sol_stream_steps(selected, lay) + -(-lay.n_blocks // 128)  # the pooled chunks first
    return steps.numel(), steps.float().mean().item()


@functools.lru_cache(maxsize=4)
def sol_selection(density, grid=GRID, heads=HEADS):
    """(Sol's routed blocks (heads, N, N) of the video-like inputs on the CPU, their layout)."""
    import kernels
    from benchmarks.workload import video_qkv
    from kernels.sol_reference import sol_block_selection
    from kernels.sol_rules import sol_layout

    q, k, v, _ = video_qkv(grid, heads, HEAD_DIM, seed=grid[0] * grid[1] * grid[2])
    selected = sol_block_selection(q, k, v, beta=kernels.beta_for_density(density), grid=grid)[0]
    return selected, sol_layout(q.shape[1], grid)


def sol_stream_steps(selected, layout, partners=None):
    """Steps of each Sol pair stream (heads, pairs) of a selection (heads, N, N): of the whole
    blocks, then of the blocks with padding keys, the blocks both items routed two a step,
    then each item's own two a step (``pair_streams``' rule). ``partners``: the loop's
    (``pair_partners``), or pairs (heads, P, 2) of each head's own (``overlap_partners``)."""
    import torch

    from kernels.engine.pair_streams import padded_blocks, pair_partners

    pairs = pair_partners(layout) if partners is None else partners
    pairs = pairs.expand(selected.shape[0], -1, -1)
    heads = torch.arange(selected.shape[0])[:, None]
    first = selected[heads, pairs[..., 0]]
    second = torch.where((pairs[..., 1] >= 0)[..., None], selected[heads, pairs[..., 1].clamp_min(0)], False)
    padded = padded_blocks(layout).to(first.device, torch.bool)
    return sum((n + 1) // 2 for part in (~padded, padded)
               for n in ((first & second & part).sum(-1), (first & ~second & part).sum(-1),
                         (second & ~first & part).sum(-1)))


def overlap_partners(selected):
    """Pairs (heads, ⌈N/2⌉, 2) of each head's query blocks by the routed blocks they share, a
    block left over alone (-1): in rounds, each unpaired block picks the unpaired block it
    shares most with, and blocks that pick each other pair up; what no round pairs goes two by
    two in block order. What the fixed partners of ``pair_partners`` (neighbours in time) would
    gain from pairing by the mask instead."""
    import torch

    heads, n, _ = selected.shape
    index = torch.arange(n)
    result = []
    for routed in selected.float():
        shared = routed @ routed.T
        shared.fill_diagonal_(-1)
        free = torch.ones(n, dtype=torch.bool)
        pairs = []
        while True:
            pick = torch.where(free[:, None] & free[None, :], shared, -2.0).argmax(1)
            mutual = free & (pick[pick] == index) & (index < pick)
            if not mutual.any():
                break
            pairs.append(torch.stack([index[mutual], pick[mutual]], 1))
            free[index[mutual]] = False
            free[pick[mutual]] = False
        rest = index[free]
        pairs.append(rest[:len(rest) // 2 * 2].view(-1, 2))
        if len(rest) % 2:
            pairs.append(torch.tensor([[int(rest[-1]), -1]]))
        result.append(torch.cat(pairs))
    return torch.stack(result)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", help="results file (JSON)")
    ap.add_argument("--method", choices=sorted(METHOD_CUTS), default="sol", help="whose loop: Sol's pair streams "
                    "(64-row items) or PSA's shared tiles (128 rows, turns)")
    ap.add_argument("--density", type=float, default=0.15, help="target density of the mask")
    ap.add_argument("--rep-ms", type=int, default=200, help="triton.testing.do_bench's rep per variant")
    ap.add_argument("--check", action="store_true", help="only check that every cut applies to the source")
    ap.add_argument("--steps", action="store_true", help="only count the launch's programs and ring steps "
                    "(on the CPU, from the masks)")
    args = ap.parse_args(argv)
    if not 0 < args.density <= 1:
        ap.error(f"--density: expected a share in (0, 1], got {args.density}")
    cuts = METHOD_CUTS[args.method]
    sources = {cut: cut_source(cut, args.method) for cut in (None, *cuts)}
    if args.steps:
        programs, steps = ring_steps(args.method, args.density)
        print(f"{args.method} at density {args.density}: {programs} programs, {steps:.1f} ring steps each")
        if args.method == "sol":
            selected, lay = sol_selection(args.density)
            by_overlap = sol_stream_steps(selected, lay, overlap_partners(selected)).float().mean().item()
            print(f"  each head's blocks paired by the routed blocks they share instead: "
                  f"{by_overlap + -(-lay.n_blocks // 128):.1f} ring steps each")
        return programs, steps
    if args.check:
        print(f"{len(cuts)} {args.method} cuts apply to {os.path.relpath(LOOP_SOURCE, REPO)}")
        return sources
    import torch

    if not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0):
        ap.error("needs an sm_90 GPU (H100 / H200): the Hopper loop runs nowhere else; --check checks the cuts")
    if not args.out:
        ap.error("--out: the results file is required")
    rows = []
    for name, cut, precision in variants(args.method):
        with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
            f.write(sources[cut])
        try:
            child = (f"import sys; sys.path.insert(0, {REPO!r}); from benchmarks.hopper_step_ablation import "
                     f"time_variant; time_variant({f.name!r}, {args.method!r}, {precision!r}, {args.density!r}, "
                     f"{args.rep_ms!r})")
            done = subprocess.run([sys.executable, "-c", child], capture_output=True, text=True, timeout=300,
                                  cwd=REPO)
        finally:
            os.unlink(f.name)
        last = (done.stdout.strip().splitlines() or [""])[-1]
        if done.returncode != 0 or not last.startswith("{"):
            raise RuntimeError(f"variant {name!r} failed:\n{done.stderr[-2000:]}")
        row = dict(variant=name, precision=precision, cut=cuts[cut][0] if cut else None, **json.loads(last))
        rows.append(row)
        print(f"{name:24s} {precision:5s} {row['ms']:8.2f} ms", flush=True)
    import triton

    write_results(args.out, dict(
        command="python3 benchmarks/hopper_step_ablation.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        started=datetime.datetime.now().isoformat(timespec="seconds"), device=torch.cuda.get_device_name(),
        torch=torch.__version__, triton=triton.__version__, python=platform.python_version(),
        shape=dict(grid=list(GRID), heads=HEADS, head_dim=HEAD_DIM, inputs="video-like"), method=args.method,
        density=args.density,
        timed=("the engine on the routed mask with its pooled term (no routing, no pooling pass)" if args.method == "sol"
               else f"the engine on a stripe mask of tile {list(PSA_TILE)} (bench_kernels' PSA heads)"), rows=rows))
    return rows


if __name__ == "__main__":
    main()
