"""benchmarks/bench_preset.py refuses a preset or layer it cannot time before it needs a GPU,
and sums the layers the way BENCHMARKS.md reads them."""
import pytest

from benchmarks import bench_preset
from cli_usage import usage_error


def _usage_error(tmp_path, capsys, *args):
    return usage_error(bench_preset.main, tmp_path, capsys, *args)


def test_unknown_preset_is_a_usage_error(tmp_path, capsys):
    err = _usage_error(tmp_path, capsys, "--preset", "no_such_preset.json")
    assert "--preset" in err and "no_such_preset.json" in err and "not found" in err


def test_layer_outside_the_preset_is_a_usage_error(tmp_path, capsys):
    err = _usage_error(tmp_path, capsys, "--preset", "wan2.1_14b_720p_81f.json", "--layers", "0,40")
    assert "--layers" in err and "[40]" in err and "40 layers" in err


def test_summary_adds_the_layers_against_cudnn_times_density():
    rows = [dict(ms=150.0, density=0.30), dict(ms=170.0, density=0.35)]
    s = bench_preset.summarise(rows, cudnn_ms=400.0)
    assert s["psa_ms_sum"] == 320.0 and s["ideal_ms_sum"] == pytest.approx(260.0)
    assert s["share_of_ideal"] == pytest.approx(260.0 / 320.0)
    assert s["speedup"] == pytest.approx(800.0 / 320.0)


@pytest.mark.parametrize("grid", ["21,90,80", "21,x,80"])
def test_grid_with_another_block_grid_is_a_usage_error(tmp_path, capsys, grid):
    err = _usage_error(tmp_path, capsys, "--preset", "wan2.1_14b_720p_81f.json", "--grid", grid)
    assert "--grid" in err
