"""Sol-Attn: Triton kernel (through the interpreter on CPU) vs the float reference, the
reference vs brute force, the β ↔ density map and bad inputs."""
import math

import pytest
import torch

import kernels
from qkv_layouts import heads_first, hunyuan_single_block
from kernels.sol_rules import SOL_BLOCK


def rel_err(a, b):
    return ((a.float() - b.float()).norm() / b.float().norm()).item()


def qkv(B, L, H, D, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, L, H, D, generator=g).to(dtype) for _ in range(3)]


def dense(q, k, v, scale=None):
    o = torch.nn.functional.scaled_dot_product_attention(
        *(x.float().transpose(1, 2) for x in (q, k, v)), scale=scale)
    return o.transpose(1, 2)


KERNEL_CASES = [
    # B, L, H, D, dtype, beta, estimator, sinks
    (1, 200, 2, 64, torch.float16, 0.5, "exact", None),
    (2, 130, 1, 128, torch.bfloat16, 1.0, "diag", None),
    (3, 64, 1, 64, torch.float16, 0.0, "exact", None),
    (1, 321, 3, 64, torch.float16, "per_head", "diag", [(300, 321)]),
    (1, 257, 4, 64, torch.bfloat16, 1.5, "exact", [(0, 5), (100, 130)]),
    (2, 1, 1, 128, torch.float16, 0.7, "exact", None),
    (1, 190, 2, 128, torch.float16, float("-inf"), "exact", None),
    (1, 190, 2, 64, torch.float16, float("inf"), "diag", None),
]


@pytest.mark.parametrize("B,L,H,D,dtype,beta,estimator,sinks", KERNEL_CASES)
def test_kernel_matches_reference(B, L, H, D, dtype, beta, estimator, sinks):
    q, k, v = qkv(B, L, H, D, dtype, seed=L * 7 + H)
    if beta == "per_head":
        beta = torch.linspace(-0.5, 2.0, H)
    kw = dict(beta=beta, estimator=estimator, sinks=sinks, return_stats=True)
    out, stats = kernels.sol_attention(q, k, v, **kw)
    ref, ref_stats = kernels.sol_attention_reference(q, k, v, **kw)
    assert out.shape == q.shape and out.dtype == dtype
    assert torch.isfinite(out).all()
    tol = 3e-3 if dtype == torch.float16 else 2e-2
    assert rel_err(out, ref) < tol
    torch.testing.assert_close(stats["density"], ref_stats["density"])


def test_kernel_accepts_any_strides():
    q, k, v = qkv(1, 150, 2, 64, torch.float16, seed=3)
    qt, kt, vt = heads_first(q, k, v)
    a = kernels.sol_attention(qt, kt, vt, beta=0.8)
    b = kernels.sol_attention(q, k, v, beta=0.8)
    torch.testing.assert_close(a, b)


def test_stats_density_is_the_selection_share():
    q, k, v = qkv(2, 300, 3, 64, torch.float16, seed=11)
    _, stats = kernels.sol_attention(q, k, v, beta=1.0, return_stats=True)
    sel = kernels.sol_block_selection(q, k, v, beta=1.0)
    torch.testing.assert_close(stats["density"], sel.float().mean(dim=(-1, -2)))


def test_reference_all_exact_is_dense_attention():
    q, k, v = qkv(2, 150, 2, 32, torch.float32, seed=5)
    out = kernels.sol_attention_reference(q, k, v, beta=float("-inf"))
    torch.testing.assert_close(out, dense(q, k, v), atol=1e-5, rtol=1e-5)


def test_reference_nothing_exact_is_the_closed_form_pooled_softmax():
    B, L, H, D = 1, 150, 2, 16
    q, k, v = qkv(B, L, H, D, torch.float32, seed=6)
    out = kernels.sol_attention_reference(q, k, v, beta=float("inf"))
    s = 1 / math.sqrt(D)
    n = math.ceil(L / SOL_BLOCK)
    expected = torch.empty_like(q)
    for h in range(H):
        blocks = [slice(j * SOL_BLOCK, min(L, (j + 1) * SOL_BLOCK)) for j in range(n)]
        k_mean = torch.stack([k[0, b, h].mean(0) for b in blocks])
        v_sum = torch.stack([v[0, b, h].sum(0) for b in blocks])
        lens = torch.tensor([b.stop - b.start for b in blocks], dtype=torch.float32)
        w = torch.exp(s * q[0, :, h] @ k_mean.T)
        expected[0, :, h] = (w @ v_sum) / (w @ lens)[:, None]
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def test_reference_hand_computed_case():
    # Two blocks: 64 tokens, then a 2-token tail. D = 1, scale 1.
    L = SOL_BLOCK + 2
    q = torch.zeros(1, L, 1, 1)
    k = torch.zeros(1, L, 1, 1)
    v = torch.zeros(1, L, 1, 1)
    q[0, :, 0, 0] = 1.0
    k[0, :SOL_BLOCK, 0, 0] = 0.0
    k[0, SOL_BLOCK:, 0, 0] = torch.tensor([1.0, 3.0])   # tail: mean 2
    v[0, :SOL_BLOCK, 0, 0] = 1.0                        # block 0: value sum 64
    v[0, SOL_BLOCK:, 0, 0] = torch.tensor([10.0, 20.0])  # tail: value sum 30
    # Proxy scores of every query block: [0, 2]; mean 1, std 1. β = 0 picks the tail only.
    out = kernels.sol_attention_reference(q, k, v, beta=0.0, scale=1.0)
    # Block 0 pooled: exp(0)·64 in the denominator, exp(0)·64 in the numerator.
    # Tail exact: e¹·10 + e³·20 over e¹ + e³.
    num = 64.0 + math.e * 10 + math.e ** 3 * 20
    den = 64.0 + math.e + math.e ** 3
    torch.testing.assert_close(out[0, :, 0, 0], torch.full((L,), num / den))
    sel = kernels.sol_block_selection(q, k, v, beta=0.0, scale=1.0)
    assert sel[0, 0].tolist() == [[False, True], [False, True]]


def block_sparse_sdpa(q, k, v, sel, layout):
    """Plain block-sparse attention of a bool (B, H, N, N) block selection, by token mask."""
    blocks = layout.token_blocks()
    token_mask = sel[:, :, blocks][..., blocks]  # (B, H, L, L)
    return torch.nn.functional.scaled_dot_product_attention(
        *(x.float().transpose(1, 2) for x in (q, k, v)), attn_mask=token_mask).transpose(1, 2)


def test_beta_density_map():
    assert abs(kernels.density_for_beta(1.0) - 0.15866) < 1e-4
    assert abs(kernels.density_for_beta(2.0) - 0.02275) < 1e-4
    for rho in (0.01, 0.07, 0.15, 0.5, 0.9):
        assert abs(kernels.density_for_beta(kernels.beta_for_density(rho)) - rho) < 1e-9
    assert kernels.beta_for_density(0.5) == pytest.approx(0.0, abs=1e-12)
    for bad in (0.0, 1.0, -0.1, 1.5):
        with pytest.raises(ValueError, match="rho"):
            kernels.beta_for_density(bad)


@pytest.mark.parametrize("fn", [kernels.sol_attention, kernels.sol_attention_reference])
def test_bad_inputs_name_the_argument(fn):
    q, k, v = qkv(1, 70, 2, 64, torch.float16, seed=1)
    with pytest.raises(ValueError, match="q must have shape"):
        fn(q[0], k, v, beta=1.0)
    with pytest.raises(ValueError, match="same shape"):
        fn(q, k[:, :60], v, beta=1.0)
    with pytest.raises(ValueError, match="estimator"):
        fn(q, k, v, beta=1.0, estimator="full")
    with pytest.raises(ValueError, match="beta"):
        fn(q, k, v, beta=torch.ones(3))
    with pytest.raises(ValueError, match="beta"):
        fn(q, k, v, beta=float("nan"))
    with pytest.raises(TypeError, match="beta"):
        fn(q, k, v, beta="high")
    with pytest.raises(ValueError, match="sinks"):
        fn(q, k, v, beta=1.0, sinks=[(60, 80)])
    with pytest.raises(ValueError, match="scale"):
        fn(q, k, v, beta=1.0, scale=-1.0)


def test_kernel_rejects_what_it_cannot_run(monkeypatch):
    q, k, v = qkv(1, 70, 2, 64, torch.float32, seed=1)
    with pytest.raises(TypeError, match="float16 or torch.bfloat16"):
        kernels.sol_attention(q, k, v, beta=1.0)
    q, k, v = qkv(1, 70, 2, 96, torch.float16, seed=1)
    with pytest.raises(ValueError, match="head dim"):
        kernels.sol_attention(q, k, v, beta=1.0)
    q, k, v = qkv(1, 70, 2, 64, torch.float16, seed=1)
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="CUDA"):
        kernels.sol_attention(q, k, v, beta=1.0)


@pytest.mark.parametrize("arch,layout", [((9, 0), "blhd"), ((8, 6), "blhd"), ((9, 0), "mixed"), ((8, 6), "mixed")])
def test_engine_fed_a_mask_is_plain_block_sparse_attention(arch, layout):
    """The engine on a given block mask, without the pooled term, on both loops (TMA boxes and
    the pointer loop). "mixed": k heads first and v a view of a fused qkv (HunyuanVideo's single
    blocks), each read through its own TMA descriptor layout."""
    from kernels.block_mask import mask_from_dense, row_major_layout
    from kernels.engine import block_sparse_attention
    from kernels.engine.launch_config import ARCHITECTURES

    q, k, v = qkv(1, 200, 2, 64, torch.float16, seed=21)
    if layout == "mixed":
        q, k, v = hunyuan_single_block(q, k, v)
    lay = row_major_layout(200)
    sel = torch.rand(1, 2, lay.n_blocks, lay.n_blocks, generator=torch.Generator().manual_seed(1)) < 0.5
    sel |= torch.eye(lay.n_blocks, dtype=torch.bool)
    mask = mask_from_dense(sel, lay)
    # bf16 named: the bound below is bf16's, whatever auto picks
    out = block_sparse_attention(q, k, v, mask, scale=0.125, config=ARCHITECTURES[arch], precision="bf16")
    assert rel_err(out, block_sparse_sdpa(q, k, v, sel, lay)) < 3e-3


def test_a_mask_from_a_dense_matrix_reads_back():
    """The one mask form (counts and the bitmap) of a dense matrix: ``to_dense`` gives it back,
    across bit 63 and a partial last bitmap word, and ``density`` is its share."""
    from kernels.block_mask import mask_from_dense, row_major_layout

    lay = row_major_layout(130 * 64)  # 130 blocks: 3 words, the last partial
    keep = torch.rand(2, 3, 130, 130, generator=torch.Generator().manual_seed(2)) < 0.4
    keep[..., 63] = True
    mask = mask_from_dense(keep, lay)
    assert torch.equal(mask.to_dense(), keep)
    torch.testing.assert_close(mask.density(), keep.float().mean(dim=(-1, -2)))
    assert mask.counts.sum(-1).tolist() == keep.sum(-1).tolist()


def test_sol_tile_for_grid_pads_least():
    assert kernels.sol_tile_for_grid((21, 45, 80)) == (1, 8, 8)   # Wan 720p: 45 rows pad to 48
    assert kernels.sol_tile_for_grid((22, 48, 80)) == (2, 4, 8)   # divisible: the most compact
    assert kernels.sol_tile_for_grid((1, 30, 52)) in {(1, 8, 8), (1, 4, 16), (1, 2, 32)}
    q, k, v = qkv(1, 4 * 8 * 8, 1, 64, torch.float16, seed=2)
    with pytest.raises(ValueError, match="64 tokens"):
        kernels.sol_attention_reference(q, k, v, beta=1.0, grid=(4, 8, 8), tile=(1, 4, 4))
    with pytest.raises(ValueError, match="tile needs grid"):
        kernels.sol_attention_reference(q, k, v, beta=1.0, tile=(1, 8, 8))
    with pytest.raises(ValueError, match="sinks"):
        kernels.sol_attention_reference(q, k, v, beta=1.0, grid=(4, 8, 8), sinks=[(0, 4)])
    with pytest.raises(ValueError, match="more than L"):
        kernels.sol_attention_reference(q, k, v, beta=1.0, grid=(5, 8, 8))


def test_3d_tiles_are_row_major_blocks_of_the_tile_major_order():
    """On a grid the tile divides, Sol on tiles equals row-major Sol on the tokens permuted
    tile by tile (extra tokens after the grid as sinks), permuted back."""
    from kernels.layout import tile_layout

    grid, tile, extra = (2, 8, 16), (2, 4, 8), 9
    L = 2 * 8 * 16 + extra
    q, k, v = qkv(1, L, 2, 64, torch.float32, seed=31)
    out = kernels.sol_attention_reference(q, k, v, beta=0.8, grid=grid, tile=tile)
    lay = tile_layout(grid, tile)
    blocked = [lay.to_blocks(t, dim=1, extra_tokens=extra) for t in (q, k, v)]
    by_hand = lay.from_blocks(kernels.sol_attention_reference(*blocked, beta=0.8, sinks=[(256, L)]),
                              dim=1, extra_tokens=extra)
    torch.testing.assert_close(out, by_hand)


def per_block_rel_err(out, ref, layout):
    """Largest relative error of one (batch, head, query block) of rows."""
    blocks = layout.token_blocks()
    err = torch.zeros(out.shape[0], out.shape[2], layout.n_blocks).index_add_(
        2, blocks, ((out.float() - ref.float()) ** 2).sum(-1).transpose(1, 2))
    norm = torch.zeros_like(err).index_add_(2, blocks, (ref.float() ** 2).sum(-1).transpose(1, 2))
    return float((err / norm.clamp_min(1e-12)).sqrt().max())


def kernel_over_nan(monkeypatch, q, k, v, **kw):
    """``kernels.sol_attention`` with its output allocated as NaN: every element must be written."""
    real_empty = torch.empty
    monkeypatch.setattr(kernels.sol.torch, "empty",
                        lambda *a, **k: real_empty(*a, **k).fill_(float("nan")) if k.get("dtype", None) == q.dtype
                        else real_empty(*a, **k))
    try:
        return kernels.sol_attention(q, k, v, **kw)
    finally:
        monkeypatch.undo()


TILE_CASES = [
    # B, grid, tile, extra, H, D, dtype, beta, estimator
    (2, (3, 6, 10), None, 9, 2, 64, torch.float16, 0.8, "exact"),      # auto tile, text sinks
    (3, (2, 5, 12), (2, 4, 8), 0, 1, 128, torch.bfloat16, 0.5, "diag"),  # padded on h and w
    (1, (5, 3, 7), (4, 4, 4), 70, 4, 64, torch.bfloat16, 1.2, "exact"),  # two text blocks
    (2, (1, 9, 9), (1, 8, 8), 0, 3, 64, torch.float16, float("-inf"), "diag"),
]


@pytest.mark.parametrize("B,grid,tile,extra,H,D,dtype,beta,estimator", TILE_CASES)
def test_kernel_matches_reference_on_3d_tiles(B, grid, tile, extra, H, D, dtype, beta, estimator, monkeypatch):
    from kernels.sol_rules import sol_layout

    L = grid[0] * grid[1] * grid[2] + extra
    q, k, v = qkv(B, L, H, D, dtype, seed=L + H)
    kw = dict(beta=beta, estimator=estimator, grid=grid, tile=tile, return_stats=True)
    out, stats = kernel_over_nan(monkeypatch, q, k, v, **kw)
    ref, ref_stats = kernels.sol_attention_reference(q, k, v, **kw)
    assert torch.isfinite(out).all()
    assert per_block_rel_err(out, ref, sol_layout(L, grid, tile)) < (5e-3 if dtype == torch.float16 else 3e-2)
    assert torch.equal(stats["exact_blocks"], ref_stats["exact_blocks"])
    torch.testing.assert_close(stats["density"], ref_stats["density"])


def test_sol_and_quantized_psa_take_their_own_pipeline_depth_on_the_100kb_rows():
    """On RTX 30/40/50 (100 KB of shared memory an SM) Sol's 64-row programs run 2 stages, so
    that two share an SM, PSA's longer tiles 3 in bf16 and 2 with int8/fp8 keys
    (kernels/DESIGN.md); the A100 and the TMA rows run 3 for all. The row's description says
    so where they differ."""
    from kernels.engine.launch_config import ARCHITECTURES
    from kernels.engine.portable import tile_stages

    for cap in ((8, 6), (8, 9), (12, 0)):
        row = ARCHITECTURES[cap]
        assert [tile_stages(row, 64, q) for q in (False, True)] == [2, 2]
        assert [tile_stages(row, 128, q) for q in (False, True)] == [3, 2]
        assert row.shared_memory_per_sm == 100 * 1024
        assert "pointer loop, 3 stages (Sol 2, PSA int8/fp8 2), " in row.describe()
    for cap in ((8, 0), (9, 0), (10, 0)):
        row = ARCHITECTURES[cap]
        assert {tile_stages(row, m, q) for m in (64, 128) for q in (False, True)} == {3}
        assert "(" not in row.describe().split("stages")[1].split(";")[0]


@pytest.mark.parametrize("arch", [(8, 0), (8, 6)])
def test_pointer_loop_splits_pv_of_64_row_tiles_at_d128(arch, poisoned_outputs):
    """On the rows without TMA, Sol's 64-row tiles at d 128 compute P·V as two dots over the
    halves of the head dim (``portable.split_pv``, ``tile_loop.softmax_update``): through the
    pooled term, the grid's cut tiles and a text block, the reference's result. Tiles too short
    for every warp to own 16 rows, tiles as long as the head dim and the TMA rows do not split."""
    from kernels.engine.launch_config import ARCHITECTURES
    from kernels.engine.portable import split_pv
    from kernels.sol_rules import sol_layout

    config = ARCHITECTURES[arch]
    assert split_pv(config, 64, 128)
    assert not (split_pv(config, 64, 64) or split_pv(config, 32, 64) or split_pv(config, 128, 128))
    assert not split_pv(ARCHITECTURES[(9, 0)], 64, 128)
    grid, tile, extra = (2, 5, 12), (1, 8, 8), 11
    L = math.prod(grid) + extra
    q, k, v = qkv(1, L, 2, 128, torch.bfloat16, seed=L)
    kw = dict(beta=0.6, estimator="exact", grid=grid, tile=tile, return_stats=True)
    out, stats = kernels.sol_attention(q, k, v, config=config, precision="bf16", **kw)
    ref, ref_stats = kernels.sol_attention_reference(q, k, v, **kw)
    assert per_block_rel_err(out, ref, sol_layout(L, grid, tile)) < 3e-2
    assert torch.equal(stats["exact_blocks"], ref_stats["exact_blocks"])


@pytest.mark.parametrize("seed", range(8))
def test_random_grids_and_tiles_match_reference(seed, monkeypatch):
    """Seeded random grids (smaller or larger than the tile on any axis), tiles (the grid's
    own or a forced one within the 8x padding limit), text tokens, batch and heads: the
    kernel's output, written over NaN, against the reference per block, and its exact-block
    counts equal to the reference's."""
    from kernels.sol_rules import sol_layout

    gen = torch.Generator().manual_seed(200 + seed)

    def draw(low, high):
        return int(torch.randint(low, high + 1, (1,), generator=gen))
    tiles = [None, (1, 8, 8), (2, 4, 8), (4, 4, 4), (2, 8, 4), (1, 4, 16)]
    while True:
        grid, tile = (draw(1, 5), draw(1, 12), draw(1, 14)), tiles[draw(0, len(tiles) - 1)]
        if tile is None:
            break
        padded = 1
        for g, t in zip(grid, tile):
            padded *= -(-g // t) * t
        if padded <= 8 * grid[0] * grid[1] * grid[2]:
            break
    B, H, extra = draw(1, 2), draw(1, 3), draw(0, 70)
    dtype = (torch.float16, torch.bfloat16)[draw(0, 1)]
    L = grid[0] * grid[1] * grid[2] + extra
    q, k, v = qkv(B, L, H, 64, dtype, seed=300 + seed)
    kw = dict(beta=(0.0, 0.8, 1.5)[draw(0, 2)], estimator=("exact", "diag")[draw(0, 1)], grid=grid, tile=tile,
              return_stats=True)
    out, stats = kernel_over_nan(monkeypatch, q, k, v, **kw)
    ref, ref_stats = kernels.sol_attention_reference(q, k, v, **kw)
    case = (B, grid, tile, extra, H, dtype, kw["beta"], kw["estimator"])
    assert torch.isfinite(out).all(), case
    assert per_block_rel_err(out, ref, sol_layout(L, grid, tile)) < (5e-3 if dtype == torch.float16 else 3e-2), case
    assert torch.equal(stats["exact_blocks"], ref_stats["exact_blocks"]), case


def test_heads_run_in_groups_within_the_scratch_budget(monkeypatch):
    """A tight budget splits the heads into groups; every group writes its heads of the same
    output, which equals the one-group result."""
    import kernels.engine as engine
    import kernels.sol as sol

    grid = (2, 8, 16)
    q, k, v = qkv(2, 256 + 20, 5, 64, torch.float16, seed=41)
    whole, st_whole = kernels.sol_attention(q, k, v, beta=0.7, grid=grid, return_stats=True)
    calls = []
    real = sol._sol_heads
    monkeypatch.setattr(engine, "SCRATCH_FLOOR", 0)
    monkeypatch.setattr(engine, "SCRATCH_SHARE", 1e-9)  # one head per group
    monkeypatch.setattr(sol, "_sol_heads", lambda *a, **kw: calls.append(a[7:9]) or real(*a, **kw))
    split, st_split = kernels.sol_attention(q, k, v, beta=0.7, grid=grid, return_stats=True)
    assert calls == [(h, h + 1) for h in range(5)]
    torch.testing.assert_close(split, whole)
    assert torch.equal(st_split["exact_blocks"], st_whole["exact_blocks"])
    assert engine.head_groups(40, 10, 1000) == [(h, h + 1, False) for h in range(40)]
    assert engine.head_groups(40, 1, 10**12) == [(0, 40, False)]


def test_head_groups_are_as_few_and_as_even_as_fit():
    """Each group is one launch whose last wave leaves SMs idle: 40 heads, at most 12 a group,
    run as four groups of 10; 5 heads at most 2 a group as 1, 2, 2."""
    import kernels.engine as engine

    output = 10**10  # a budget well above the floor
    budget = engine.SCRATCH_SHARE * output
    assert engine.head_groups(40, int(budget / 12), output) == [(0, 10, False), (10, 20, False), (20, 30, False),
                                                                (30, 40, False)]
    assert engine.head_groups(5, int(budget / 2), output) == [(0, 1, False), (1, 3, False), (3, 5, False)]
    assert engine.head_groups(7, int(budget), output) == [(h, h + 1, False) for h in range(7)]


def test_head_groups_lay_key_codes_in_the_heads_after_them():
    """Quantized calls: a group's key codes (half an output head each, as int8 codes of a bf16
    output) go to the output's later heads where they fit, so the scratch limits the groups
    only through the rest; the last heads, with no room after them, keep their codes in
    scratch, and a call whose codes all fit in scratch runs as one group."""
    import kernels.engine as engine

    output = 10**10
    budget = engine.SCRATCH_SHARE * output
    head = output // 40
    groups = engine.head_groups(40, int(budget / 12), output, code_bytes_per_head=head // 2)
    # 12 heads at most by the rest; 24 .. 34: ten heads' codes fill five of the six heads left.
    assert groups == [(0, 12, True), (12, 24, True), (24, 34, True), (34, 38, True), (38, 40, False)]
    assert engine.head_groups(40, 1, output, code_bytes_per_head=1) == [(0, 40, False)]
    # One head whose codes fit nowhere still runs, alone, in scratch (the budget's ">= 1 head").
    assert engine.head_groups(2, 1, 1000, code_bytes_per_head=10**10) == [(0, 1, False), (1, 2, False)]


def test_every_launch_runs_on_the_inputs_device(monkeypatch):
    """Triton launches on the current CUDA device; a model on cuda:1 needs each launch under a
    device guard for its tensors' device (checked here by recording the guards)."""
    import kernels._device
    import kernels.engine
    import kernels.engine.id_lists
    import kernels.engine.launch_order
    import kernels.engine.pair_streams
    import kernels.engine.portable
    import kernels.sol_gpu_routing

    seen = []
    real = kernels._device.device_guard

    def recording(t):
        seen.append(t.device)
        return real(t)

    for module in (kernels.engine, kernels.engine.id_lists, kernels.engine.launch_order, kernels.engine.pair_streams,
                   kernels.engine.portable, kernels.sol_gpu_routing):
        monkeypatch.setattr(module, "device_guard", recording)
    q, k, v = qkv(1, 130, 1, 64, torch.float16, seed=4)
    kernels.sol_attention(q, k, v, beta=1.0)
    kernels.psa_attention(q, k, v, grid=(2, 5, 13), params=[[1, 0, 0, 1, 0, 0]], tile=(1, 4, 4))
    # Sol: pool, route, id lists, work order, engine; PSA (its lists made on the host): engine.
    assert len(seen) == 6 and all(d == q.device for d in seen)
    assert type(real(q)).__name__ == "nullcontext"
    if not torch.cuda.is_available():
        import types

        fake = types.SimpleNamespace(is_cuda=True, device=torch.device("cuda", 1))
        assert real(fake).idx == 1


# ------------------------------------------------------------------------ non-finite values
@pytest.mark.parametrize("fn", [kernels.sol_attention, kernels.sol_attention_reference])
@pytest.mark.parametrize("beta", [float("-inf"), 1.0])
def test_large_fp16_values_do_not_overflow(fn, beta):
    """Values in [1500, 3000]: a 64-token block's value sum (~143,000) is beyond fp16's 65,504;
    the pooled blocks store the mean instead."""
    g = torch.Generator().manual_seed(40)
    q, k = (torch.randn(1, 200, 2, 64, generator=g).half() for _ in range(2))
    v = (1500 + 1500 * torch.rand(1, 200, 2, 64, generator=g)).half()
    out = fn(q, k, v, beta=beta)
    assert torch.isfinite(out).all()
    assert rel_err(out, dense(q, k, v)) < (3e-3 if beta == float("-inf") else 3e-2)
    if fn is kernels.sol_attention:
        assert rel_err(out, kernels.sol_attention_reference(q, k, v, beta=beta)) < 3e-3


def nan_at(which, q, k, v, row, head, col):
    x = {"q": q, "k": k, "v": v}[which].clone()
    x[0, row, head, col] = float("nan")
    return [x if name == which else t for name, t in zip("qkv", (q, k, v))]


@pytest.mark.filterwarnings("ignore:All-NaN slice encountered")  # the interpreter's max of a NaN row
@pytest.mark.parametrize("fn", [kernels.sol_attention, kernels.sol_attention_reference])
@pytest.mark.parametrize("which", ["q", "k", "v"])
@pytest.mark.parametrize("beta", [1.0, float("inf")])
def test_nan_in_nan_out(fn, which, beta):
    """One NaN in q, k or v: NaN exactly where dense attention has NaN, and the other rows of
    a query block with NaN routing are dense attention."""
    q, k, v = qkv(1, 200, 2, 64, torch.float16, seed=41)
    q, k, v = nan_at(which, q, k, v, row=70, head=1, col=5)
    out = fn(q, k, v, beta=beta).float()
    want = dense(q, k, v)
    assert torch.equal(torch.isnan(out), torch.isnan(want))
    assert torch.isnan(out).any()
    if which == "q":  # only row 70 of head 1 is NaN; its block (64-127) is all exact: dense
        ok = torch.isfinite(want[0, 64:128, 1])
        torch.testing.assert_close(out[0, 64:128, 1][ok], want[0, 64:128, 1][ok], atol=3e-3, rtol=3e-3)


def test_row_major_blocks_take_sequences_longer_than_a_grid_axis():
    """A flat sequence is the grid (L, 1, 1): the 1024-per-axis limit of video grids does not
    apply to it (its token limit does)."""
    from kernels.block_mask import row_major_layout

    q, k, v = qkv(1, 2100, 1, 16, torch.float32, seed=43)
    out = kernels.sol_attention_reference(q, k, v, beta=1.0)
    assert torch.isfinite(out).all()
    lay = row_major_layout(2100)
    assert lay.n_blocks == 33 and lay.lengths[-1] == 2100 - 32 * 64 and lay.padded
    with pytest.raises(ValueError, match="sequence length"):
        row_major_layout(1 << 23)


def test_routed_work_runs_each_heads_blocks_heaviest_first():
    """The portable loop's order: each head's query blocks come heaviest first (counts summed
    over the batch), every (head, block) exactly once, heads in order."""
    from kernels.engine.launch_order import work_by_count

    counts = torch.tensor([[[[3, 0], [9, 1], [5, 0]], [[1, 0], [1, 0], [7, 0]]],
                           [[[0, 0], [0, 0], [4, 0]], [[2, 0], [0, 0], [0, 0]]]], dtype=torch.int32)
    work = work_by_count(counts)
    assert work.dtype == torch.int32
    assert work.tolist() == [1, 2, 0, 5, 3, 4]  # loads: head 0 (3, 10, 5), head 1 (3, 1, 7)


@pytest.mark.parametrize("estimator", ["exact", "diag"])
@pytest.mark.parametrize("dtype,offset", [(torch.bfloat16, 0.0), (torch.float16, 0.0), (torch.bfloat16, 6.0)])
def test_router_thresholds_are_block_thresholds(estimator, dtype, offset):
    """The router's own τ (one pass over the pooled keys per program, chunk statistics merged)
    routes as ``sol_rules.block_thresholds`` does: over several programs per head, a ragged
    last chunk, per-head β, and means sharing a large offset (|μ| >> σ, where a plain sum of
    squares would cancel). Only pairs within a rounding slack of τ may differ."""
    from kernels.sol_gpu_routing import route
    from kernels.sol_rules import block_thresholds, forced_key_blocks, row_major_layout

    n, D, B, H, scale = 150, 64, 2, 3, 0.125
    layout = row_major_layout(n * 64)
    g = torch.Generator().manual_seed(17)
    q_mean = (torch.randn(B, H, n, D, generator=g) + offset).to(dtype)
    k_mean = (torch.randn(B, H, n, D, generator=g) * 0.3 + offset).to(dtype)
    beta = torch.tensor([-0.5, 0.9, 2.0])
    mask = route(q_mean, k_mean, beta, forced_key_blocks(layout, []), layout, estimator=estimator, scale=scale)
    tau = block_thresholds(q_mean, k_mean, beta, estimator, scale)
    proxy = scale * (q_mean.float() @ k_mean.float().transpose(-1, -2))
    slack = 1e-5 * proxy.abs().amax(-1, keepdim=True)
    decided = (proxy - tau[..., None]).abs() > slack
    assert decided.float().mean() > 0.99
    got, want = mask.to_dense(), proxy > tau[..., None]
    assert torch.equal(got[decided], want[decided])
    assert 0.01 < want.float().mean() < 0.9
