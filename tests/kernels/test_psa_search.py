import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import kernels.psa_search.accumulator
import kernels.psa_search.cli as psa_search_cli
from kernels.preset_file import load_preset
from kernels.psa_mask import psa_block_mask
from kernels.psa_reference import psa_attention_reference
from kernels.psa_search import (
    LossTable,
    PSASearchAccumulator,
    candidate_space,
    estimate_sample_bytes,
    save_qkv_sample,
    search_samples,
)
from psa_search_inputs import rewrite


def rand_qkv(B, L, H, D, seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, L, H, D, generator=g) for _ in range(3)]


# ------------------------------------------------------------------------ candidates
def test_candidate_space_is_distinct_and_keeps_anchors():
    grid, tile = (21, 45, 80), (3, 8, 16)  # Wan 720p -> block grid 7 x 6 x 5
    c = candidate_space(grid, tile, max_candidates=100)
    assert c.shape == (100, 6) and c.dtype == torch.int64
    masks = psa_block_mask(grid, c, tile).reshape(100, -1)
    assert len({m.numpy().tobytes() for m in masks}) == 100  # one row per distinct mask
    rows = c.tolist()
    assert rows[0] == [7, 0, 0, 30, 0, 0]  # dense first
    assert bool(masks[0].all())
    for anchor in ([2, 0, 0, 2, 0, 5], [1, 0, 0, 1, 0, 0], [3, 0, 0, 30, 0, 0]):  # STA, own block, SVG spatial
        assert anchor in rows
    # C.2 ranges adapted to the grid
    assert all(1 <= r[0] <= 7 and -2 <= r[1] <= 2 and r[2] in (0, 1, 2, 3) for r in rows)
    assert all((1 <= r[3] <= 4 or r[3] == 30) and -1 <= r[4] <= 1 and r[5] in (0, 1, 3, 5, 6) for r in rows)
    # deterministic, seed-dependent sampling; all distinct masks without a cap
    assert torch.equal(c, candidate_space(grid, tile, max_candidates=100))
    assert not torch.equal(c, candidate_space(grid, tile, max_candidates=100, seed=1))
    full = candidate_space(grid, tile, max_candidates=None)
    assert full.shape[0] > 100


def test_candidate_space_is_user_extensible():
    grid, tile = (8, 8, 8), (2, 2, 2)
    c = candidate_space(grid, tile, Tw=[1, 2], To=[0], Ts=[0], Sw=[1, 3], So=[0], Ss=[0, 4, 99],
                        extra=[[4, 1, 0, 5, 0, 0]], max_candidates=None)
    rows = c.tolist()
    assert [4, 1, 0, 5, 0, 0] in rows
    assert all(r[5] in (0, 4) for r in rows if r != [4, 1, 0, 5, 0, 0])  # 99 >= 16 blocks -> ∞
    with pytest.raises(ValueError, match=r"\.Sw = 0"):
        candidate_space(grid, tile, Sw=[0])


# ------------------------------------------------------------------------ losses
@pytest.mark.parametrize("extra", [0, 4])
def test_losses_equal_the_reference_outputs(extra):
    grid, tile = (4, 5, 6), (2, 2, 3)
    n = 120
    H, D = 2, 8
    q, k, v = rand_qkv(2, n + extra, H, D, seed=extra)
    cands = candidate_space(grid, tile, max_candidates=12)
    acc = PSASearchAccumulator(grid, tile, H, candidates=cands, extra_tokens=extra,
                               query_tiles=None, rows_per_tile=None)
    acc.add(q, k, v, layer=3)
    t = acc.table()
    assert t.layers == [3] and int(t.calls.sum()) == 1
    mse, rel = t.loss("mse")[0, 0], t.loss("rel")[0, 0]
    dense = psa_attention_reference(q, k, v, grid=grid, params=[cands[0].tolist()] * H, tile=tile, extra_tokens=extra)
    for c in range(cands.shape[0]):
        out = psa_attention_reference(q, k, v, grid=grid, params=cands[c].expand(H, 6), tile=tile, extra_tokens=extra)
        err = ((out[:, :n] - dense[:, :n]).double() ** 2)
        torch.testing.assert_close(mse[:, c], err.mean(dim=(0, 1, 3)), atol=1e-9, rtol=1e-4)
        ref = (dense[:, :n].double() ** 2).sum(dim=(0, 1, 3))
        torch.testing.assert_close(rel[:, c], err.sum(dim=(0, 1, 3)) / ref, atol=1e-9, rtol=1e-4)
    assert float(mse[:, 0].abs().max()) < 1e-12  # dense candidate


def test_subsampling_is_documented_and_deterministic():
    grid, tile = (4, 6, 6), (2, 3, 3)  # 2*2*2 = 8 blocks of 18 tokens
    acc = PSASearchAccumulator(grid, tile, 1, candidates=[[1, 0, 0, 1, 0, 0]], query_tiles=3, rows_per_tile=5)
    rows, qblk = acc._sample_rows(layer=2, bucket=0, call=0)
    assert rows.numel() == 15 and qblk.unique().numel() == 3
    assert torch.equal(acc.layout.block_of_token()[rows], qblk)  # rows lie in their blocks
    again, _ = acc._sample_rows(layer=2, bucket=0, call=0)
    assert torch.equal(rows, again)
    other, _ = acc._sample_rows(layer=2, bucket=0, call=1)
    assert not torch.equal(rows, other)
    q, k, v = rand_qkv(1, 144, 1, 4, seed=1)
    acc.add(q, k, v, layer=2)
    assert float(acc.table().count.sum()) == 15 * 4  # rows x D elements


# ------------------------------------------------------------------------ planted masks
def planted_qkv(grid, tile, planted, D, beta=25.0, seed=0):
    """Heads whose attention lies (up to e^-beta) inside a planted block mask: key tokens
    carry a one-hot code of their block, query tokens the row of the planted mask."""
    masks = psa_block_mask(grid, planted, tile).float()  # (H, nB, nB)
    H, nB, _ = masks.shape
    assert D >= nB
    T, Hh, W = grid
    bt, bh, bw = tile
    nH, nW = -(-Hh // bh), -(-W // bw)
    t = torch.arange(T)[:, None, None] // bt
    h = torch.arange(Hh)[None, :, None] // bh
    w = torch.arange(W)[None, None, :] // bw
    blk = ((t * nH + h) * nW + w).reshape(-1)
    g = torch.Generator().manual_seed(seed)
    n = blk.numel()
    k = torch.zeros(1, n, H, D)
    k[0, torch.arange(n), :, blk] = 1.0
    q = torch.zeros(1, n, H, D)
    for hh in range(H):
        q[0, :, hh, :nB] = beta * masks[hh][blk]
    q += 0.01 * torch.randn(q.shape, generator=g)
    v = torch.randn(1, n, H, D, generator=g)
    return q, k, v


def test_search_recovers_planted_masks():
    grid, tile = (4, 6, 8), (1, 2, 2)  # block grid 4 x 3 x 4 = 48 blocks
    nW = 4
    planted = [
        [2, 0, 0, 2, 0, nW],   # STA window, full height
        [4, 0, 0, 1, 0, 0],    # SVG temporal
        [1, 1, 2, 1, 0, 3],    # strided, offset
        [2, 0, 0, 12, 0, 0],   # SVG spatial
    ]
    q, k, v = planted_qkv(grid, tile, planted, D=48)
    cands = candidate_space(grid, tile, max_candidates=60, extra=planted)
    acc = PSASearchAccumulator(grid, tile, 4, candidates=cands, scale=1.0, query_tiles=None, rows_per_tile=8)
    acc.add(q, k, v, layer=0)
    sel = acc.table().select(alpha=1e-6)
    planted_masks = psa_block_mask(grid, planted, tile)
    chosen = psa_block_mask(grid, sel.params[0, 0], tile)
    for h in range(4):
        assert bool((chosen[h] | ~planted_masks[h]).all()), f"head {h}: chosen mask does not cover the planted one"
        # the sparsest covering candidate is the planted mask itself
        assert torch.equal(chosen[h], planted_masks[h]), (h, sel.params[0, 0, h].tolist())


# ------------------------------------------------------------------------ dual interface
def random_table(seed=0, C=40, L=3, B=2, H=5):
    g = torch.Generator().manual_seed(seed)
    cands = torch.tensor([[1 + i % 7, 0, 0, 1 + i // 7, 0, 0] for i in range(C)], dtype=torch.int64)
    density = torch.rand(C, generator=g, dtype=torch.float64)
    density[0] = 1.0
    sq = torch.rand(L, B, H, C, generator=g, dtype=torch.float64) * (1 - density) * 10
    count = torch.full((L, B, H), 10.0, dtype=torch.float64)
    return LossTable((4, 4, 4), (1, 1, 1), cands, density, density.clone(), list(range(L)), [0.5], H,
                     sq, torch.ones(L, B, H, dtype=torch.float64), count, torch.ones(L, B, dtype=torch.int64))


def test_alpha_is_monotone_and_rule_holds():
    t = random_table()
    loss = t.loss()
    prev = None
    for alpha in [0.0, 0.01, 0.05, 0.1, 0.2, 0.4, 0.8, 2.0]:
        s = t.select(alpha=alpha)
        assert s.params.shape == (2, 3, 5, 6)
        if prev is not None:
            assert bool((s.sparsity >= prev - 1e-15).all())  # larger α never less sparse
        prev = s.sparsity
        chosen = s.index.permute(1, 0, 2)  # (L, B, H)
        ok = loss <= alpha
        best = torch.where(ok, t.sparsity.expand_as(loss), torch.full_like(loss, -1)).amax(-1)
        assert bool((s.loss.permute(1, 0, 2) <= alpha).all())
        assert torch.equal(t.sparsity[chosen], best)


def test_target_sparsity_rule():
    t = random_table(1)
    loss = t.loss()
    for rho in [0.0, 0.3, 0.6, 0.9]:
        s = t.select(target_sparsity=rho)
        feasible = t.sparsity >= rho
        assert bool((s.sparsity >= rho).all())
        best = torch.where(feasible.expand_as(loss), loss, torch.full_like(loss, float("inf"))).amin(-1)
        assert torch.equal(s.loss.permute(1, 0, 2), best)
    # infeasible target: the sparsest candidate
    s = t.select(target_sparsity=1.0)
    assert bool((s.sparsity == t.sparsity.max()).all())
    with pytest.raises(ValueError, match="exactly one"):
        t.select()
    with pytest.raises(ValueError, match="exactly one"):
        t.select(alpha=0.1, target_sparsity=0.5)


def test_tables_are_reused_without_re_evaluation(tmp_path, monkeypatch):
    grid, tile = (3, 4, 4), (1, 2, 2)
    q, k, v = rand_qkv(1, 48, 3, 8, seed=2)
    acc = PSASearchAccumulator(grid, tile, 3, candidates=candidate_space(grid, tile, max_candidates=20),
                               bucket_edges=[0.5])
    acc.add(q, k, v, layer=0, step=0.1)
    acc.add(q, k, v, layer=0, step=0.7)
    acc.add(q, k, v, layer=1, step=0.7)
    path = tmp_path / "table.safetensors"
    acc.table().save(path)

    def boom(*a, **kw):
        raise AssertionError("re-evaluated")

    monkeypatch.setattr(kernels.psa_search.accumulator, "_head_losses", boom)
    t = LossTable.load(path)
    assert t.layers == [0, 1] and t.calls.tolist() == [[1, 1], [0, 1]]
    sels = [t.select(alpha=a) for a in (0.0, 1e-3, 1e-1, 10.0)]
    assert sels[-1].mean_sparsity >= sels[0].mean_sparsity
    assert bool(sels[0].missing[0, 1].all())  # layer 1, bucket 0 never seen -> dense
    assert bool((sels[0].params[0, 1] == t.candidates[torch.argmax(t.density)]).all())
    torch.testing.assert_close(t.loss(), acc.table().loss(), equal_nan=True)
    merged = t.merge(t)
    torch.testing.assert_close(merged.loss(), t.loss(), equal_nan=True)  # same data twice
    assert int(merged.calls.sum()) == 2 * int(t.calls.sum())


# ------------------------------------------------------------------------ samples, CLI, distributed
def write_samples(folder, grid=(3, 4, 6), H=4, D=8, extra=2, layers=(0, 1, 2)):
    n = grid[0] * grid[1] * grid[2]
    paths = []
    for layer in layers:
        for step in (0.2, 0.8):
            q, k, v = rand_qkv(1, n + extra, H, D, seed=layer * 10 + int(step * 10))
            p = os.path.join(folder, f"s_l{layer}_{step}.safetensors")
            size = save_qkv_sample(p, q.half(), k.half(), v.half(), layer=layer, step=step, grid=grid, extra_tokens=extra)
            assert size <= estimate_sample_bytes(q.shape, torch.float16)
            paths.append(p)
    return paths


def test_cli_search_select_show(tmp_path, capsys):
    paths = write_samples(str(tmp_path))
    table = str(tmp_path / "t.safetensors")
    assert psa_search_cli.main(["search", str(tmp_path), "--tile", "1", "2", "3", "--out", table, "--max-candidates", "16",
                    "--bucket-edges", "0.5", "--query-tiles", "0", "--rows-per-tile", "4"]) == 0
    t = LossTable.load(table)
    assert t.layers == [0, 1, 2] and t.calls.tolist() == [[1, 1]] * 3
    preset = str(tmp_path / "p.json")
    assert psa_search_cli.main(["select", table, "--alpha", "0.05", "--out", preset, "--name", "tiny", "--family", "ltxv",
                    "--model-name", "tiny test", "--fingerprint", "3", "4", "8", "32", "--prompts", "1"]) == 0
    p = load_preset(preset)
    assert p.params.shape == (2, 3, 4, 6) and p.search["rule"] == "alpha" and p.search["value"] == 0.05
    assert torch.equal(p.params, t.select(alpha=0.05).params)
    assert psa_search_cli.main(["show", table, "--sparsity", "0.5"]) == 0
    assert "bucket 1 layer 2" in capsys.readouterr().out


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank, world, port, paths, out):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        t = search_samples(paths, tile=(1, 2, 3), candidates=candidate_space((3, 4, 6), (1, 2, 3), max_candidates=16),
                           bucket_edges=[0.5], query_tiles=4, rows_per_tile=5)
        t.save(f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # two worker processes
def test_two_process_search_equals_one_process(tmp_path):
    paths = write_samples(str(tmp_path))
    single = search_samples(paths, tile=(1, 2, 3), candidates=candidate_space((3, 4, 6), (1, 2, 3), max_candidates=16),
                            bucket_edges=[0.5], query_tiles=4, rows_per_tile=5)
    out = str(tmp_path / "dist")
    mp.start_processes(_worker, args=(2, _free_port(), paths, out), nprocs=2, join=True, start_method="spawn")
    for rank in range(2):
        t = LossTable.load(f"{out}.{rank}")
        for name in ("sq_err", "ref_sq", "count", "calls"):
            assert torch.equal(getattr(t, name), getattr(single, name)), name
        assert t.settings["world_size"] == 2


def test_accumulator_input_checks():
    acc = PSASearchAccumulator((2, 2, 2), (1, 1, 1), 2, candidates=[[1, 0, 0, 1, 0, 0]])
    q, k, v = rand_qkv(1, 8, 3, 4, seed=0)
    with pytest.raises(ValueError, match="3 heads"):
        acc.add(q, k, v, layer=0)
    q, k, v = rand_qkv(1, 9, 2, 4, seed=0)
    with pytest.raises(ValueError, match=r"L = 9 .* 8 \+ extra_tokens 0"):
        acc.add(q, k, v, layer=0)
    with pytest.raises(ValueError, match="ascending"):
        PSASearchAccumulator((2, 2, 2), (1, 1, 1), 2, bucket_edges=[0.5, 0.2])


# ------------------------------------------------------------------------ tables, CLI
def tiny_table(tmp_path, name="t.safetensors"):
    grid, tile = (3, 4, 6), (1, 2, 3)
    acc = PSASearchAccumulator(grid, tile, 2, candidates=candidate_space(grid, tile, max_candidates=6))
    assert acc.candidates.shape[0] == 9  # the anchors are always kept
    q, k, v = rand_qkv(1, 72, 2, 8, seed=3)
    acc.add(q, k, v, layer=0)
    path = str(tmp_path / name)
    acc.table().save(path)
    return path


@pytest.mark.parametrize("change,words", [
    (dict(header={"grid": [8, 64, 64], "tile": [1, 1, 1]}), "header.tile: block grid (8, 64, 64) has 32768 blocks"),
    (dict(header={"tile": [0, 2, 3]}), "header.tile[0]: expected an integer in [1, 256], got 0"),
    (dict(header={"grid": [3, 4]}), "header.grid: expected 3 entries"),
    (dict(header={"layers": [0, 0]}), "header.layers: expected distinct layer ids"),
    (dict(header={"num_heads": "2"}), "header.num_heads: expected an integer"),
    (dict(header={"layers": None}), "header.layers: expected a list"),
    (dict(header={"settings": {"family": "a/b"}}), "header.settings.family: expected a family name"),
    (dict(header={"settings": {"fingerprint": {"layers": 1}}}), "header.settings.fingerprint.heads: missing field"),
    (dict(meta={"header": None}), "header: invalid JSON"),
    (dict(meta={"version": "2"}), "PSA loss table version '2'; this code reads version 1"),
    (dict(meta={"format": "other"}), "not a PSA loss table (metadata format 'other'"),
    (dict(tensors={"calls": None}), "tensors: expected ['calls', 'candidates', 'count', 'density', 'ref_sq', "
                                    "'sq_err', 'token_density'], missing ['calls']"),
    (dict(tensors={"density": torch.zeros(3, dtype=torch.float64)}), "tensor density: expected shape (9,), got (3,)"),
    (dict(tensors={"sq_err": torch.zeros(1, 1, 2, 9)}), "tensor sq_err: expected torch.float64, got torch.float32"),
    (dict(tensors={"candidates": torch.zeros(6, 6, dtype=torch.int64)}), "tensor candidates: params[0].Tw = 0"),
])
def test_table_errors_name_the_file_and_the_field(tmp_path, change, words):
    path = rewrite(tiny_table(tmp_path), **change)
    with pytest.raises(ValueError) as e:
        LossTable.load(path)
    assert str(e.value).startswith(path + ": ") and words in str(e.value), str(e.value)


def test_unreadable_tables_name_the_file(tmp_path):
    for path, words in [(str(tmp_path / "missing.safetensors"), "no such file"),
                        (str(tmp_path), "not a file"),
                        (str(tmp_path / "junk.safetensors"), "not a PSA loss table (cannot read it as safetensors")]:
        if path.endswith("junk.safetensors"):
            open(path, "wb").write(b"\x00" * 100)
        with pytest.raises(ValueError) as e:
            LossTable.load(path)
        assert str(e.value).startswith(path + ": ") and words in str(e.value)
        assert "\n" not in str(e.value)


def run_cli(argv, capsys):
    rc = psa_search_cli.main(argv)
    captured = capsys.readouterr()
    return rc, captured.err.strip().splitlines()


def test_cli_errors_are_one_line_with_exit_2(tmp_path, capsys):
    empty = tmp_path / "empty"
    empty.mkdir()
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"not safetensors at all")
    table = tiny_table(tmp_path)
    cases = [
        (["search", str(tmp_path / "nope"), "--tile", "1", "2", "3", "--out", "o"], "nope: no such file or folder"),
        (["search", str(empty), "--tile", "1", "2", "3", "--out", "o"], "holds no .safetensors sample files"),
        (["search", str(junk), "--tile", "1", "2", "3", "--out", "o"], "not a PSA q/k/v sample"),
        (["show", str(junk)], "junk.safetensors: not a PSA loss table"),
        (["show", str(tmp_path / "nope.safetensors")], "nope.safetensors: no such file"),
        (["show", table, "--alpha", "0.1", "--sparsity", "0.5"], "give exactly one of alpha"),
        (["select", table, "--alpha", "0.1", "--out", str(tmp_path / "p.json"), "--name", "bad\nname",
          "--family", "wan", "--model-name", "m", "--fingerprint", "1", "2", "128", "256"], "preset.name"),
        (["select", table, "--alpha", "0.1", "--out", str(tmp_path / "p.json"), "--name", "n", "--family", "a/b",
          "--model-name", "m", "--fingerprint", "1", "2", "128", "256"], "family: expected a family name"),
    ]
    for argv, words in cases:
        rc, err = run_cli(argv, capsys)
        assert rc == 2 and len(err) == 1, (argv, err)
        assert err[0].startswith("python -m kernels.psa_search: error: ") and words in err[0], (argv, err)
    assert not (tmp_path / "o").exists() and not (tmp_path / "p.json").exists()


@pytest.mark.parametrize("argv,words", [
    (["search", "s", "--tile", "1", "２", "3", "--out", "o"], "argument --tile: expected an integer written with"),
    (["show", "t", "--alpha", "nan"], "argument --alpha: expected a number"),
])
def test_cli_argument_errors(argv, words, capsys):
    with pytest.raises(SystemExit) as e:
        psa_search_cli.main(argv)
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_cli_help_states_defaults_and_examples(capsys):
    for argv in (["--help"], ["search", "--help"], ["select", "--help"], ["show", "--help"]):
        with pytest.raises(SystemExit):
            psa_search_cli.main(argv)
        out = " ".join(capsys.readouterr().out.split())
        assert "examples: python -m kernels.psa_search" in out, argv
    with pytest.raises(SystemExit):
        psa_search_cli.main(["search", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    for words in ("candidate masks per head (default: 128)", "(0: all) (default: 32)", "(default: 0)",
                  "(default: none, one bucket)", "(default: the current CUDA device"):
        assert words in out, words
    with pytest.raises(SystemExit):
        psa_search_cli.main(["select", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "(wan, hunyuan_video, ltxv, ltx2)" in out and "(default: mse)" in out
