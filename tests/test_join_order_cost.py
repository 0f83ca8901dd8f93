"""benchmarks/join_order_cost.py: its agreement check (run here through Triton's interpreter,
before any timing on a GPU) finds the two join orders equal, fails a reorder that is not put
back, and its bad options are usage errors."""
import pytest
import torch

from benchmarks import join_order_cost as joc
from cli_usage import usage_error

SMALL = dict(grid=(2, 8, 8), text_tokens=16, heads=2, head_dim=64, density=0.3, device="cpu",
             dtype=torch.float16)


@pytest.mark.parametrize("method", joc.METHODS)
def test_both_join_orders_give_one_output(method):
    largest, nan = joc.agreement(method, **SMALL)
    assert largest <= joc.AGREEMENT and not nan


def test_inputs_left_in_the_join_order_are_caught(monkeypatch):
    """The check can fail: a dispatcher that handed the kernel the text first."""
    monkeypatch.setattr(joc, "tokens_to_front", lambda t, start, count, dim: t)
    largest, _ = joc.agreement("sol", **SMALL)
    assert largest > 0.1


@pytest.mark.parametrize("args, flag", [(["--grid", "33,45"], "--grid"), (["--grid", "0,4,4"], "--grid"),
                                        (["--methods", "flash"], "--methods"), (["--density", "1.5"], "--density"),
                                        (["--text", "0"], "--text")])
def test_bad_options_are_usage_errors(tmp_path, capsys, args, flag):
    assert flag in usage_error(joc.main, tmp_path, capsys, *args)
