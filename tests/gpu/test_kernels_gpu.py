"""GPU suite (run on the H200 through the device tool; skipped without CUDA by conftest):
bf16 kernels vs the float references at full sequence sizes, output memory poisoned first; the
quantized exact blocks (``precision="int8"`` and ``"fp8"``) vs their references of the same
precision at full size and on every architecture's launch row forced here (fp8 refused on the
sm_80 / sm_86 rows). On Hopper the forced rows run once as Triton compiles them there
(``wgmma``) and once more with the rows' own ``mma.sync`` (test_forced_rows_again_with_mma_sync)."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels
from kernels.engine.launch_config import ARCHITECTURES
from kernels.sol_reference import check_sol_call, pooled_means
from kernels.sol_rules import block_thresholds
from qkv_layouts import heads_first, hunyuan_single_block


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def in_layout(q, k, v, layout):
    """"blhd": as made; "heads_first", "single_block": HunyuanVideo's blocks (qkv_layouts)."""
    return {"blhd": lambda *x: x, "heads_first": heads_first, "single_block": hunyuan_single_block}[layout](q, k, v)


def poison(nbytes):
    junk = torch.full((nbytes // 2 + 4096,), float("nan"), dtype=torch.bfloat16, device="cuda")
    del junk


def random_qkv(B, L, H, layout, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return in_layout(*(torch.randn(B, L, H, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                       for _ in range(3)), layout)


def count_bounds(q, k, v, rel_tol=1e-4, **kw):
    """Exact-block counts per query block of the reference with τ moved by ±rel_tol·(|τ| + σ-ish
    spread): the kernel's pooled means and proxy sums differ from the reference's in rounding
    order only, so only pairs that close to τ may route differently."""
    layout, forced, beta, scale = check_sol_call(q, k, v, beta=kw["beta"], estimator=kw["estimator"],
                                                 grid=kw.get("grid"), tile=None, sinks=kw.get("sinks"), scale=None,
                                                 for_kernel=False)
    qm, km = pooled_means(q, layout), pooled_means(k, layout)
    tau = block_thresholds(qm, km, beta, kw["estimator"], scale)
    proxy = scale * (qm.float() @ km.float().transpose(-1, -2))
    slack = rel_tol * (proxy.abs().amax(-1) + 1e-6)
    sure = (proxy > (tau + slack)[..., None]) | forced
    maybe = (proxy > (tau - slack)[..., None]) | forced
    return sure.sum(-1), maybe.sum(-1)


SOL_CASES = [
    # L, grid, H, beta, estimator, layout
    (75600, (21, 45, 80), 2, 1.04, "exact", "blhd"),                 # Wan 720p, 3D tiles
    (118800 + 256, (33, 45, 80), 2, 1.04, "exact", "single_block"),  # HunyuanVideo 720p + text
    (131072, (32, 64, 64), 2, 1.28, "diag", "heads_first"),           # 128K
    (32768 + 5, None, 3, 1.5, "diag", "blhd"),                        # row-major, ragged tail
]


@pytest.mark.parametrize("L,grid,H,beta,estimator,layout", SOL_CASES)
def test_sol_full_size(L, grid, H, beta, estimator, layout):
    q, k, v = random_qkv(1, L, H, layout, seed=L)
    poison(q.numel() * 2)
    kw = dict(beta=beta, estimator=estimator, grid=grid, return_stats=True)
    out, st = kernels.sol_attention(q, k, v, **kw)
    ref, rst = kernels.sol_attention_reference(q, k, v, **kw)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 2e-2
    lo, hi = count_bounds(q, k, v, **kw)
    exact = st["exact_blocks"]
    assert ((exact >= lo) & (exact <= hi)).all()
    assert (exact != rst["exact_blocks"]).float().mean() < 1e-3  # only near-ties differ


@pytest.mark.parametrize("grid,tile,extra,layout", [((21, 45, 80), (3, 8, 16), 0, "blhd"),
                                                    ((30, 48, 80), (6, 8, 8), 256, "blhd"),
                                                    ((33, 45, 80), (3, 8, 16), 256, "single_block"),
                                                    # padding on every axis; whole boxes past T
                                                    ((31, 45, 78), (6, 8, 8), 77, "heads_first"),
                                                    # one frame: the tile is longer than the grid,
                                                    # so every block is short (engine.launch_order.work_order)
                                                    ((1, 45, 80), (3, 8, 16), 0, "blhd"),
                                                    # LTX-2 / 2.3 720p preset: 64-token blocks
                                                    ((16, 22, 40), (2, 4, 8), 0, "blhd")])
def test_psa_full_size(grid, tile, extra, layout):
    L = grid[0] * grid[1] * grid[2] + extra
    q, k, v = random_qkv(1, L, 2, layout, seed=L)
    params = torch.tensor([[2, 0, 0, 3, 0, 0], [1, 1, 3, 2, 0, 10]])
    poison(q.numel() * 2)
    out = kernels.psa_attention(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra, precision="bf16")
    ref = kernels.psa_attention_reference(q, k, v, grid=grid, params=params, tile=tile, extra_tokens=extra)
    assert torch.isfinite(out).all()
    assert rel_err(out, ref) < 2e-2


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_every_architectures_configuration_runs_here(arch):
    """Each architecture's launch configuration forced on this GPU (the nearest thing to those
    GPUs available): PSA and Sol in bf16 against their references (int8 and fp8:
    test_quantized_on_every_architectures_configuration)."""
    config = ARCHITECTURES[arch]
    grid, extra = (9, 45, 80), 256
    L = grid[0] * grid[1] * grid[2] + extra
    q, k, v = random_qkv(1, L, 2, "single_block", seed=arch[0])
    params = torch.tensor([[2, 0, 0, 3, 0, 0], [1, 1, 3, 2, 0, 10]])
    poison(q.numel() * 2)
    out = kernels.psa_attention(q, k, v, grid=grid, params=params, tile=(3, 8, 16), extra_tokens=extra, config=config,
                                precision="bf16")
    ref = kernels.psa_attention_reference(q, k, v, grid=grid, params=params, tile=(3, 8, 16), extra_tokens=extra)
    assert torch.isfinite(out).all() and rel_err(out, ref) < 2e-2
    kw = dict(beta=1.04, grid=grid)
    out = kernels.sol_attention(q, k, v, config=config, precision="bf16", **kw)
    ref = kernels.sol_attention_reference(q, k, v, **kw)
    assert torch.isfinite(out).all() and rel_err(out, ref) < 2e-2


def test_head_offsets_past_2_31():
    """Heads-first storage (HunyuanVideo) with (H - 1)·L·D >= 2**31: the last head's base offset
    needs 64 bits. Checked on the last head against the reference of that head alone."""
    grid = (33, 64, 128)  # 270,336 tokens
    L, H = 33 * 64 * 128, 64
    if torch.cuda.get_device_properties(0).total_memory < 40 * 2**30:
        pytest.skip("needs ~20 GB of GPU memory")
    assert (H - 1) * L * 128 >= 2**31
    q, k, v = random_qkv(1, L, H, "heads_first", seed=5)
    last = [x[:, :, -1:] for x in (q, k, v)]
    params = torch.tensor([[1, 0, 0, 2, 0, 0]] * H)
    out = kernels.psa_attention(q, k, v, grid=grid, params=params, tile=(3, 8, 16), precision="bf16")
    ref = kernels.psa_attention_reference(*last, grid=grid, params=params[-1:], tile=(3, 8, 16))
    assert rel_err(out[:, :, -1:], ref) < 2e-2
    del out
    out = kernels.sol_attention(q, k, v, beta=1.5, grid=grid)
    ref = kernels.sol_attention_reference(*last, beta=1.5, grid=grid)
    assert rel_err(out[:, :, -1:], ref) < 2e-2


@pytest.mark.parametrize("precision", ["bf16", "int8", "fp8"])
def test_sol_call_never_synchronises_and_replays_in_a_cuda_graph(precision):
    grid = (6, 45, 80)
    L = 6 * 45 * 80
    kw = dict(beta=1.04, grid=grid, precision=precision)
    q, k, v = random_qkv(1, L, 4, "blhd", seed=9)
    kernels.sol_attention(q, k, v, **kw)  # compile first
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        eager = kernels.sol_attention(q, k, v, **kw)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    static = [x.clone() for x in (q, k, v)]
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        kernels.sol_attention(*static, **kw)  # warm the graph pool
        with torch.cuda.graph(graph):
            captured = kernels.sol_attention(*static, **kw)
    torch.cuda.current_stream().wait_stream(stream)
    fresh = random_qkv(1, L, 4, "blhd", seed=10)
    for s, x in zip(static, fresh):
        s.copy_(x)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(captured, kernels.sol_attention(*fresh, **kw))
    assert not torch.equal(captured, eager)


# The quantized exact blocks against their reference of the same precision (the same codes and
# scales, bit for bit: what is left is the kernel's bf16 P·V and output rounding, ~2.5e-3 in the
# bf16 checks of kernels_h200.json, and for fp8 the dot's float32 accumulation, at the tensor
# cores' own precision on sm_90) and against the bf16 reference (the codes' rounding through the
# interpreter on gaussian inputs: ~1e-2 for int8, ~3.6e-2 for fp8; tests/kernels/test_quantized.py).
QUANTIZED_VS_REFERENCE = 5e-3
ERROR_BUDGET = {"int8": 3e-2, "fp8": 8e-2}
QUANTIZED = ["int8", "fp8"]


def check_quantized(out, run_reference, precision):
    assert torch.isfinite(out).all()
    assert rel_err(out, run_reference(precision)) < QUANTIZED_VS_REFERENCE
    assert rel_err(out, run_reference("bf16")) < ERROR_BUDGET[precision]


@pytest.mark.parametrize("layout", ["blhd", "heads_first"])
def test_psa_key_means_are_the_references_at_full_size(layout):
    """PSA's smoothing means (float64 sums per span of tokens on the GPU, then over the spans)
    equal the reference's (one float64 sum) bit for bit at Wan 720p, for a head range not
    starting at 0, with a channel offset (the smoothing's reason)."""
    from kernels.engine.quantize import key_means
    from kernels.quantized_reference import smoothing_mean

    L = 75600
    _, k, _ = random_qkv(1, L, 5, layout, seed=17)
    k += torch.linspace(-4, 6, 128, device="cuda", dtype=torch.bfloat16)
    torch.testing.assert_close(key_means(k, 1, 3), smoothing_mean(k)[:, 1:4], rtol=0, atol=0)


@pytest.mark.parametrize("precision", QUANTIZED)
@pytest.mark.parametrize("method,grid,tile,extra,layout", [
    ("sol", (21, 45, 80), None, 0, "blhd"),                      # Wan 720p, 3D tiles, padded
    ("sol", (33, 45, 80), None, 256, "single_block"),           # HunyuanVideo 720p + text
    ("psa", (21, 45, 80), (3, 8, 16), 0, "blhd"),
    ("psa", (31, 45, 78), (6, 8, 8), 77, "heads_first"),
])
def test_quantized_full_size(method, grid, tile, extra, layout, precision):
    L = grid[0] * grid[1] * grid[2] + extra
    q, k, v = random_qkv(1, L, 2, layout, seed=L + 8)
    if method == "psa":
        kw = dict(grid=grid, params=torch.tensor([[2, 0, 0, 3, 0, 0], [1, 1, 3, 2, 0, 10]]), tile=tile,
                  extra_tokens=extra)
        kernel, reference = kernels.psa_attention, kernels.psa_attention_reference
    else:
        kw = dict(beta=1.04, grid=grid)
        kernel, reference = kernels.sol_attention, kernels.sol_attention_reference
    poison(q.numel() * 2)
    check_quantized(kernel(q, k, v, precision=precision, **kw), lambda p: reference(q, k, v, precision=p, **kw),
                    precision)


@pytest.mark.parametrize("precision", QUANTIZED)
@pytest.mark.parametrize("method,layout", [("sol", "blhd"), ("psa", "heads_first")])
def test_quantized_groups_with_codes_in_the_output(monkeypatch, method, layout, precision):
    """Head groups that lay their key codes in the output's later heads (this GPU's loop boxes
    them through the output's token stride) write what one group with scratch codes writes, bit
    for bit, outputs poisoned: Wan 720p, 5 heads as 3 (codes in heads 3-4), 1 (in head 4) and 1
    (in scratch)."""
    import kernels.engine as engine
    import kernels.psa
    import kernels.sol

    grid = (21, 45, 80)
    q, k, v = random_qkv(1, 21 * 45 * 80, 5, layout, seed=29)
    if method == "psa":
        params = torch.tensor([[2, 0, 0, 3, 0, 0], [1, 1, 3, 2, 0, 10], [1, 0, 0, 2, 0, 0], [3, 1, 0, 1, 0, 0],
                               [1, 0, 0, 4, 0, 0]])
        run = lambda: kernels.psa_attention(q, k, v, grid=grid, params=params, tile=(3, 8, 16), precision=precision)
    else:
        run = lambda: kernels.sol_attention(q, k, v, beta=1.04, grid=grid, precision=precision)
    poison(q.numel() * 2)
    whole = run()
    groups = []
    real = engine.head_groups

    def three_heads_of_scratch(num_heads, per_head_bytes, output_bytes, code_bytes_per_head):
        monkeypatch.setattr(engine, "SCRATCH_FLOOR", 0)
        monkeypatch.setattr(engine, "SCRATCH_SHARE", 3.5 * per_head_bytes / output_bytes)
        groups.extend(real(num_heads, per_head_bytes, output_bytes, code_bytes_per_head))
        return groups

    monkeypatch.setattr(kernels.sol if method == "sol" else kernels.psa, "head_groups", three_heads_of_scratch)
    poison(q.numel() * 2)
    split = run()
    assert groups == [(0, 3, True), (3, 4, True), (4, 5, False)]
    assert torch.isfinite(split).all()
    assert torch.equal(split, whole), rel_err(split, whole)


@pytest.mark.parametrize("precision", QUANTIZED)
@pytest.mark.parametrize("arch", sorted(ARCHITECTURES))
def test_quantized_on_every_architectures_configuration(monkeypatch, arch, precision):
    """Each architecture's launch row forced here with quantized exact blocks (the portable
    kernel, TMA boxes or the pointer loop as the row says; on the sm_90 row the
    warp-specialised loop, for both methods): PSA and Sol, text blocks, HunyuanVideo's
    single-block layout, against their references of the same precision. fp8 on the sm_80 and
    sm_86 rows (no fp8 tensor cores) is refused by name."""
    from kernels.engine import load_hopper_loop

    hopper = load_hopper_loop()
    ws_runs = []
    if hopper is not None:
        real = hopper.ws_block_sparse_attention
        monkeypatch.setattr(hopper, "ws_block_sparse_attention", lambda *a, **kw: ws_runs.append(
            "psa" if kw["pooled"] is None else "sol") or real(*a, **kw))
    config = ARCHITECTURES[arch]
    grid, extra = (9, 45, 80), 256
    L = grid[0] * grid[1] * grid[2] + extra
    q, k, v = random_qkv(1, L, 2, "single_block", seed=arch[0] + 3)
    kw = dict(grid=grid, params=torch.tensor([[2, 0, 0, 3, 0, 0], [1, 1, 3, 2, 0, 10]]), tile=(3, 8, 16),
              extra_tokens=extra)
    if precision == "fp8" and arch < (8, 9):
        with pytest.raises(ValueError, match=r"^precision: 'fp8' needs fp8 tensor cores \(sm_89 or later\)"):
            kernels.psa_attention(q, k, v, config=config, precision=precision, **kw)
        return
    poison(q.numel() * 2)
    check_quantized(kernels.psa_attention(q, k, v, config=config, precision=precision, **kw),
                    lambda p: kernels.psa_attention_reference(q, k, v, precision=p, **kw), precision)
    kw = dict(beta=1.04, grid=grid)
    poison(q.numel() * 2)
    check_quantized(kernels.sol_attention(q, k, v, config=config, precision=precision, **kw),
                    lambda p: kernels.sol_attention_reference(q, k, v, precision=p, **kw), precision)
    on_hopper_loop = config.warp_specialized and hopper is not None and torch.cuda.get_device_capability() == (9, 0)
    assert set(ws_runs) == ({"psa", "sol"} if on_hopper_loop else set())


@pytest.mark.skipif(os.environ.get("DISABLE_MMA_V3") == "1", reason="this process compiles mma.sync already")
def test_forced_rows_again_with_mma_sync():
    """On Hopper Triton compiles a forced A100 / RTX row for the GPU it runs on, to ``wgmma``;
    with DISABLE_MMA_V3=1 it emits ``mma.sync``, the instruction those cards run
    (``tools/compile_kernels.py --run-on sm_90`` shows both). The variable is read at compile
    time and keys Triton's disk cache but not a process's kernels, so the forced-row tests run
    again in a child process that has it from the start."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("before Hopper the forced rows compile to mma.sync already")
    here = Path(__file__)
    child = subprocess.run([sys.executable, "-m", "pytest", str(here), "-q", "-p", "no:cacheprovider",
                            "-k", "every_architectures_configuration"],
                           cwd=here.parents[2], env=dict(os.environ, DISABLE_MMA_V3="1"),
                           capture_output=True, text=True, timeout=1200)
    assert child.returncode == 0, child.stdout[-6000:] + child.stderr[-2000:]
    assert " passed" in child.stdout and " failed" not in child.stdout, child.stdout[-2000:]


WS_CASES = [
    # method, B, L, grid, tile, extra, H, D, dtype, layout
    ("psa", 1, 21 * 45 * 80, (21, 45, 80), (3, 8, 16), 0, 2, 128, torch.bfloat16, "blhd"),      # Wan 720p, padded
    ("psa", 1, 33 * 45 * 80 + 256, (33, 45, 80), (3, 8, 16), 256, 2, 128, torch.bfloat16, "single_block"),
    ("psa", 2, 31 * 45 * 78 + 77, (31, 45, 78), (6, 8, 8), 77, 3, 64, torch.float16, "heads_first"),
    ("psa", 1, 45 * 80 + 16, (1, 45, 80), (3, 8, 16), 16, 2, 128, torch.bfloat16, "blhd"),    # one frame
    ("psa", 1, 31 * 22 * 40, (31, 22, 40), (2, 8, 8), 0, 2, 128, torch.bfloat16, "blhd"),       # Wan 2.2 5B preset
    # HunyuanVideo 1.5 720p preset: frames cut, the edge cover, text, vision and glyph tokens
    ("psa", 1, 31 * 45 * 80 + 1000, (31, 45, 80), (3, 8, 16), 1000, 2, 128, torch.bfloat16, "heads_first"),
    ("sol", 1, 21 * 45 * 80, (21, 45, 80), None, 0, 3, 128, torch.bfloat16, "blhd"),            # odd work count
    ("sol", 2, 9 * 45 * 80 + 256, (9, 45, 80), None, 256, 2, 128, torch.bfloat16, "single_block"),
    ("sol", 1, 32768 + 5, None, None, 0, 2, 64, torch.float16, "heads_first"),                 # row-major
    # 5 frames of blocks and 3 text blocks: query blocks without a partner in their pair stream
    ("sol", 1, 5 * 45 * 80 + 150, (5, 45, 80), None, 150, 2, 128, torch.bfloat16, "single_block"),
]


# The cases again with quantized QKᵀ (the key codes in the ring, the query tiles quantized in the loop).
WS_PRECISION_CASES = [(precision, *case) for precision in ["bf16", *QUANTIZED] for case in WS_CASES]


@pytest.mark.parametrize("precision,method,B,L,grid,tile,extra,H,D,dtype,layout", WS_PRECISION_CASES)
def test_warp_specialised_loop_matches_the_portable_loop(monkeypatch, precision, method, B, L, grid, tile, extra, H,
                                                         D, dtype, layout):
    """The Hopper loop (hopper_loop) against the portable kernel on the same inputs and mask, in
    the same precision (quantized: the same codes and scales): every row written (outputs
    poisoned), equal up to accumulation order, and it did run."""
    import dataclasses

    from kernels.engine import load_hopper_loop

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialised loop is built for sm_90")
    hopper = load_hopper_loop()
    assert hopper is not None, "this Triton cannot build the warp-specialised loop"
    ws = ARCHITECTURES[(9, 0)]
    portable = dataclasses.replace(ws, warp_specialized=False)
    runs = []
    real = hopper.ws_block_sparse_attention
    monkeypatch.setattr(hopper, "ws_block_sparse_attention", lambda *a, **kw: runs.append(1) or real(*a, **kw))
    g = torch.Generator(device="cuda").manual_seed(L + B)
    q, k, v = in_layout(*(torch.randn(B, L, H, D, device="cuda", dtype=dtype, generator=g) for _ in range(3)), layout)
    if method == "psa":
        params = torch.tensor([[2, 0, 0, 3, 0, 0], [1, 1, 3, 2, 0, 10], [1, 0, 0, 2, 0, 0]][:H])
        kw = dict(grid=grid, params=params, tile=tile, extra_tokens=extra)
        run = kernels.psa_attention
    else:
        kw = dict(beta=1.04, grid=grid)
        run = kernels.sol_attention
    poison(q.numel() * q.element_size())
    out_ws = run(q, k, v, config=ws, precision=precision, **kw)
    assert runs, "the warp-specialised loop did not run"
    poison(q.numel() * q.element_size())
    out_portable = run(q, k, v, config=portable, precision=precision, **kw)
    assert torch.isfinite(out_ws).all()
    assert rel_err(out_ws, out_portable) < 5e-3


@pytest.mark.parametrize("layout", ["blhd", "single_block"])
def test_sol_launches_per_head_write_what_one_launch_writes(monkeypatch, layout):
    """Sol on the Hopper loop runs one launch per head where a head's K/V exceed L2
    (``hopper_loop.l2_bytes``): forced both ways on one small call (batch 2, 3 heads, text
    blocks), every row is written and the outputs are bitwise equal (a program's rows do not
    depend on its launch)."""
    from kernels.engine import hopper_loop as hopper

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialised loop is built for sm_90")
    grid, extra, H = (9, 45, 80), 256, 3
    L = 9 * 45 * 80 + extra
    g = torch.Generator(device="cuda").manual_seed(L)
    q, k, v = in_layout(*(torch.randn(2, L, H, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                          for _ in range(3)), layout)
    launches = []
    real = hopper._ws_block_sparse_kernel
    monkeypatch.setattr(hopper, "_ws_block_sparse_kernel", type("Counted", (), {
        "__getitem__": lambda self, grid: launches.append(grid) or real[grid]})())
    outputs = {}
    for name, l2 in (("one", 0), ("per_head", 1)):
        monkeypatch.setattr(hopper, "l2_bytes", lambda device, l2=l2: l2)
        launches.clear()
        poison(q.numel() * 2)
        outputs[name] = kernels.sol_attention(q, k, v, beta=1.04, grid=grid)
        assert torch.isfinite(outputs[name]).all()
        assert len(launches) == (H if name == "per_head" else 1)
    assert torch.equal(outputs["one"], outputs["per_head"])


EDGE_COVER_CASES = [
    # grid, tile, extra tokens, layout, head dim, dtype, real rows of the last block row, steps there
    ((6, 45, 80), (3, 8, 16), 0, "blhd", 128, torch.bfloat16, 5, 2),             # 720p: 3 tops, then the 5th row
    ((6, 45, 80), (3, 8, 16), 256, "single_block", 128, torch.bfloat16, 5, 2),
    ((6, 45, 80), (3, 8, 8), 77, "heads_first", 64, torch.float16, 5, 2),         # 64-key slots
    ((6, 20, 32), (3, 8, 16), 0, "blhd", 128, torch.bfloat16, 4, 2),             # 3 tops and a padding half
    ((5, 19, 40), (2, 8, 16), 0, "blhd", 128, torch.bfloat16, 3, 1),             # frames and columns cut too
    ((8, 22, 48), (4, 8, 16), 0, "heads_first", 128, torch.bfloat16, 6, 3),      # two rows below the tops
    ((9, 13, 32), (6, 8, 16), 77, "blhd", 128, torch.bfloat16, 5, 4),            # 2 row boxes a row, frames cut
]


@pytest.mark.parametrize("grid,tile,extra,layout,D,dtype,rows,steps", EDGE_COVER_CASES)
def test_edge_cover_matches_masked_attention_row_by_row(monkeypatch, grid, tile, extra, layout, D, dtype, rows,
                                                        steps):
    """The edge cover (hopper_loop.edge_cover_rows: a last block row cut to ``rows`` rows read
    in ``steps`` steps of two half-slot boxes, the keys not the block's masked) against float32
    attention over the same visited pairs, per query block. Random block masks (every query
    block sees at least itself) visit edge blocks of every frame tile, including the last,
    whose boxes reach past the grid; one query block visits a single edge block, where a
    foreign, missing or doubled key would move every row."""
    from kernels.block_mask import block_layout, mask_from_dense
    from kernels.engine import block_sparse_attention, load_hopper_loop

    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the warp-specialised loop is built for sm_90")
    hopper = load_hopper_loop()
    H = 2
    lay = block_layout(grid, tile, extra_tokens=extra, device="cuda")
    assert hopper.edge_cover_rows(lay, 1) == rows and hopper.cover_steps(tile[0], tile[1], rows) == steps
    runs = []
    real = hopper.ws_block_sparse_attention
    monkeypatch.setattr(hopper, "ws_block_sparse_attention", lambda *a, **kw: runs.append(1) or real(*a, **kw))
    L = lay.n_tokens
    g = torch.Generator(device="cuda").manual_seed(L)
    q, k, v = in_layout(*(torch.randn(1, L, H, D, device="cuda", dtype=dtype, generator=g) for _ in range(3)), layout)
    nb = lay.n_blocks
    _, nH, nW = lay.block_grid
    keep = torch.rand(1, H, nb, nb, generator=torch.Generator().manual_seed(nb)) < 0.4
    keep[:, :, torch.arange(nb), torch.arange(nb)] = True  # no query block without keys
    last_edge_block = lay.n_grid_blocks - 1  # the last frame tile's, in the last block row
    assert (last_edge_block % (nH * nW)) // nW == nH - 1
    keep[:, :, 0] = False
    keep[:, :, 0, last_edge_block] = True  # query block 0 sees that edge block alone
    mask = mask_from_dense(keep, lay)
    scale = D ** -0.5
    poison(q.numel() * q.element_size())
    out = block_sparse_attention(q, k, v, mask, scale=scale, config=ARCHITECTURES[(9, 0)], precision="bf16")
    assert runs, "the warp-specialised loop did not run"
    assert torch.isfinite(out).all()
    blocks = lay.token_blocks()
    allowed_keys = keep[0].to("cuda")  # (H, nb, nb)
    for h in range(H):
        kh, vh = k[0, :, h].float(), v[0, :, h].float()
        for start in range(0, L, 4096):
            rows = torch.arange(start, min(start + 4096, L), device="cuda")
            s = (q[0, rows, h].float() @ kh.T) * scale
            s = s.masked_fill(~allowed_keys[h][blocks[rows]][:, blocks], float("-inf"))
            ref = torch.softmax(s, -1) @ vh
            err = (out[0, rows, h].float() - ref).norm(dim=-1) / ref.norm(dim=-1)
            worst = torch.zeros(nb, device="cuda").scatter_reduce(0, blocks[rows], err, "amax")
            assert worst.max().item() < 2e-2, f"head {h}: query block {worst.argmax().item()} off by {worst.max():.3g}"


def test_a_forced_row_runs_with_the_shared_memory_of_its_gpus_sm():
    """benchmarks/sm_shared_memory.py: held to an RTX 40 SM's 100 KB, every engine kernel a Sol
    call of that row launched fits as many programs an SM as 100 KB allow (fewer than here for
    one of more than 50 KB), and gets its own carveout back once the row is done."""
    import ctypes

    from benchmarks.sm_shared_memory import SharedMemoryPerSM
    from kernels.engine.portable import _block_sparse_kernel

    row = ARCHITECTURES[(8, 9)]  # built for the H100's wgmma its Sol launch takes more than half of 100 KB
    emulator = SharedMemoryPerSM()
    grid = (8, 24, 32)
    q, k, v = random_qkv(1, grid[0] * grid[1] * grid[2], 2, "blhd", seed=5)

    def programs_per_sm():
        kernels.sol_attention(q, k, v, beta=1.04, grid=grid, config=row)
        torch.cuda.synchronize()
        counts = {}
        for compiled in _block_sparse_kernel.device_caches[torch.cuda.current_device()][0].values():
            if compiled.function in emulator.applied:
                n = ctypes.c_int()
                assert emulator.libcuda.cuOccupancyMaxActiveBlocksPerMultiprocessor(
                    ctypes.byref(n), ctypes.c_void_p(compiled.function), compiled.metadata.num_warps * 32,
                    compiled.metadata.shared) == 0
                counts[compiled.function] = (compiled.metadata.shared, n.value)
        return counts

    try:
        own = programs_per_sm()
        assert emulator.emulate(row) == 100 * 1024
        held = programs_per_sm()
        assert emulator.emulate(None) is None
        back = programs_per_sm()
    finally:
        from triton import knobs
        knobs.runtime.launch_enter_hook.remove(emulator)
    assert own and held.keys() == own.keys() and back == own
    for function, (shared, programs) in held.items():
        assert programs == min(own[function][1], 100 * 1024 // (shared + 1024)), (shared, programs, own[function])
    assert any(shared > 50 * 1024 and programs < own[f][1] for f, (shared, programs) in held.items()), held
