"""benchmarks/sol_call_profile.py refuses options it cannot run (the profile itself needs a GPU:
its numbers are in benchmarks/results/sol_call_profile_h200/ and sol_bands_h200/)."""
import pytest
import torch

from benchmarks import sol_call_profile as profile
from cli_usage import usage_error


@pytest.mark.parametrize("args,flag", [
    (["--seqs", "1000"], "--seqs"),                                   # no grid for this length
    (["--seqs", "x"], "--seqs"),
    (["--seqs", "75600,131072", "--densities", "0.1,0.2,0.3"], "--densities"),
    (["--densities", "0"], "--densities"),
    (["--inputs", "noise"], "--inputs"),
    (["--corrections", "maybe"], "--corrections"),
    (["--calls", "0"], "--calls"),
])
def test_bad_options_are_usage_errors(tmp_path, capsys, args, flag):
    assert flag in usage_error(profile.main, tmp_path, capsys, *args)


@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here")
def test_without_a_gpu_it_says_so(tmp_path, capsys):
    assert "needs a CUDA GPU" in usage_error(profile.main, tmp_path, capsys)
