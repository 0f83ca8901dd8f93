"""benchmarks/preset_tile_work.py: the Hopper loop's tile-steps of a preset's mask, counted on
the CPU, and the forward they give at cuDNN's per-tile rate."""
import json

import pytest
import torch

from benchmarks import preset_tile_work
from cli_usage import usage_error
from kernels.block_mask import block_layout


def _usage_error(tmp_path, capsys, *args):
    return usage_error(preset_tile_work.main, tmp_path, capsys, *args)


def test_full_mask_costs_a_dense_pass_plus_the_padding_the_tiles_cannot_shed():
    unpadded = block_layout((21, 48, 80), (3, 8, 16))
    full = torch.ones(2, unpadded.n_blocks, unpadded.n_blocks, dtype=torch.bool)
    assert preset_tile_work.tile_density(full, unpadded, 1) == pytest.approx(1.0)
    # 45 rows: a 240-token edge block runs 2 query tiles and, with the edge cover, 2 key steps.
    padded = block_layout((21, 45, 80), (3, 8, 16))
    tiles = 175 * 3 + 35 * 2
    assert preset_tile_work.tile_density(full, padded, 1) == pytest.approx(tiles ** 2 / (75600 / 128) ** 2)


def test_the_shipped_wan_preset_and_its_bound(tmp_path, capsys):
    out = tmp_path / "wan.json"
    preset_tile_work.main(["--preset", "wan2.1_14b_720p_81f.json", "--dense-s", "20", "--stub-s", "5",
                           "--out", str(out)])
    result = json.loads(out.read_text())
    assert len(result["rows"]) == 40
    assert 0 < result["block_density"] < result["tile_density"] < 1
    assert result["forward_at_cudnn_rate_s"] == pytest.approx(5 + 15 * result["tile_density"])
    assert "x" in capsys.readouterr().out


def test_unknown_preset_is_a_usage_error(tmp_path, capsys):
    assert "--preset" in _usage_error(tmp_path, capsys, "--preset", "no_such_preset.json")


@pytest.mark.parametrize("args", [("--dense-s", "20"), ("--dense-s", "5", "--stub-s", "6"),
                                  ("--dense-s", "5", "--stub-s", "0")])
def test_dense_and_stub_times_must_make_sense(tmp_path, capsys, args):
    err = _usage_error(tmp_path, capsys, "--preset", "wan2.1_14b_720p_81f.json", *args)
    assert "--stub-s" in err


def test_negative_text_tokens_is_a_usage_error(tmp_path, capsys):
    assert "--extra-tokens" in _usage_error(tmp_path, capsys, "--preset", "wan2.1_14b_720p_81f.json",
                                            "--extra-tokens", "-1")
