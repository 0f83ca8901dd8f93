"""benchmarks/bench_kernels.py refuses a block loop it does not know before it needs a GPU."""
import pytest

from benchmarks import bench_kernels
from cli_usage import usage_error


@pytest.mark.parametrize("loops", ["wsx", "ws,bogus", ","])
def test_unknown_loop_is_a_usage_error(tmp_path, capsys, loops):
    err = usage_error(bench_kernels.main, tmp_path, capsys, "--loops", loops)
    assert "--loops" in err and "default, ws, ws2, tma" in err


def test_every_loop_is_a_hopper_configuration():
    from kernels.launch_config import ARCHITECTURES

    assert bench_kernels.LOOPS["default"] is None
    assert bench_kernels.LOOPS["ws"] == ARCHITECTURES[(9, 0)] and bench_kernels.LOOPS["ws"].warp_specialized
    assert not bench_kernels.LOOPS["tma"].warp_specialized and bench_kernels.LOOPS["tma"].tma
    assert bench_kernels.LOOPS["ws2"].num_stages == 2


@pytest.mark.parametrize("args, message", [
    (["--sol-inputs", "noise"], "--sol-inputs: unknown noise; choose from gaussian, video"),
    (["--sol-inputs", ","], "--sol-inputs: unknown (none given)"),
    (["--sol-inputs", "video", "--sol-seqs", "75600,4096"], "--sol-inputs video needs a video grid"),
])
def test_bad_sol_inputs_are_usage_errors(tmp_path, capsys, args, message):
    assert message in usage_error(bench_kernels.main, tmp_path, capsys, *args)
