"""benchmarks/profile_kernels.py on the CPU: its arguments and the forced Sol launch mode
(the kernels themselves run under Nsight Compute on the GPU)."""
import pytest

from benchmarks import profile_kernels


def test_arguments_and_their_errors():
    args = profile_kernels.parse_args(["--seq", "131072", "--methods", "sol", "--sol-launch", "per_group"])
    assert (args.seq, args.methods, args.sol_launch, args.density) == (131072, ["sol"], "per_group", 0.15)
    assert profile_kernels.parse_args(["--methods", "sol,cudnn"]).methods == ["sol", "cudnn"]
    for bad in (["--methods", "flex"], ["--methods", ","], ["--density", "0"], ["--seq", "4096"],
                ["--sol-launch", "sometimes"]):
        with pytest.raises(SystemExit):
            profile_kernels.parse_args(bad)


@pytest.mark.parametrize("mode, splits", [("per_head", True), ("per_group", False)])
def test_forced_sol_launch_decides_the_hopper_loops_split(monkeypatch, mode, splits):
    from kernels import hopper_loop

    monkeypatch.setattr(hopper_loop, "l2_bytes", hopper_loop.l2_bytes)  # restored after the test
    profile_kernels.force_sol_launch(mode)
    kv_bytes = 75600 * 128 * 4  # one head's K and V at Wan 720p, which the H200's L2 holds
    assert hopper_loop.launch_per_head("cuda:0", kv_bytes) == splits


def test_auto_keeps_the_shipped_rule(monkeypatch):
    from kernels import hopper_loop

    monkeypatch.setattr(hopper_loop, "l2_bytes", hopper_loop.l2_bytes)
    before = hopper_loop.l2_bytes
    profile_kernels.force_sol_launch("auto")
    assert hopper_loop.l2_bytes is before
