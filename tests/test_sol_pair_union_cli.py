"""benchmarks/sol_pair_union.py: the K/V tiles two work items of a program would load with one
shared key stream (the union of their routed lists) against one stream each."""
import json

import pytest
import torch

from benchmarks import sol_pair_union
from cli_usage import usage_error


def test_neighbour_pairs_cover_every_block_once():
    block_grid = (3, 2, 4)
    for axis, stride in (("t", 8), ("w", 1)):
        pairs = sol_pair_union.neighbour_pairs(block_grid, axis)
        distinct = pairs[pairs[:, 0] != pairs[:, 1]]
        assert (distinct[:, 1] - distinct[:, 0] == stride).all()
        assert sorted(torch.unique(pairs).tolist()) == list(range(24))
        # 3 frames of blocks: the last frame's 8 blocks have no partner along t and run alone.
        assert int((pairs[:, 0] == pairs[:, 1]).sum()) == (8 if axis == "t" else 0)


def test_union_ratio_counts_shared_blocks_once():
    selected = torch.zeros(1, 1, 4, 4, dtype=torch.bool)
    selected[0, 0, 0, [0, 1]] = True      # block 0: keys 0, 1
    selected[0, 0, 1, [1, 2]] = True      # block 1: keys 1, 2 (key 1 shared)
    selected[0, 0, 2, [3]] = True         # block 2 alone: key 3
    pairs = torch.tensor([[0, 1], [2, 2], [3, 3]])
    res = sol_pair_union.union_ratio(selected, pairs)
    assert res["separate_tiles"] == 5 and res["union_tiles"] == 4
    assert res["ratio"] == pytest.approx(0.8)


def test_routed_pairs_stay_in_one_head():
    selected = torch.rand(1, 2, 5, 5, generator=torch.Generator().manual_seed(0)) < 0.5
    pairs = sol_pair_union.routed_pairs(selected)
    assert pairs.shape == (2, 3, 2)
    for h in range(2):
        assert sorted(set(pairs[h].reshape(-1).tolist())) == list(range(5))


def test_the_run_writes_one_row_per_input_and_density(tmp_path, capsys):
    out = tmp_path / "u.json"
    sol_pair_union.main(["--grid", "4,8,16", "--heads", "2", "--densities", "0.2", "--out", str(out)])
    result = json.loads(out.read_text())
    assert [r["inputs"] for r in result["rows"]] == ["gaussian", "video"]
    for row in result["rows"]:
        for pairing in sol_pair_union.PAIRINGS:
            assert 0.5 <= row[pairing]["ratio"] <= 1.0
    assert result["command"].startswith("python benchmarks/sol_pair_union.py --grid 4,8,16")
    assert "gaussian" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["--grid", "4,8"], "three positive sizes"),
    (["--densities", "1.5"], "densities must be in (0, 1)"),
    (["--inputs", "noise"], "unknown ['noise']"),
    (["--heads", "0"], "--heads must be >= 1"),
])
def test_bad_arguments_name_the_problem(tmp_path, capsys, args, message):
    assert message in usage_error(sol_pair_union.main, tmp_path, capsys, *args)
