"""benchmarks/l2_bandwidth.py: its tile streams sum what they read (checked here under Triton's
interpreter, before any timing on a GPU), and it refuses options it cannot run."""
import pytest
import torch

from benchmarks import l2_bandwidth as l2
from cli_usage import usage_error


@pytest.mark.parametrize("kind", ["shared", "random"])
def test_each_program_sums_the_tiles_of_its_order(kind):
    g = torch.Generator().manual_seed(1)
    table = torch.randn(5 * l2.TILE_ROWS, l2.TILE_COLS, generator=g).to(torch.bfloat16)
    order = l2.tile_orders(5, programs=3, steps=4, kind=kind, generator=g)
    assert order.shape == (3, 4) and int(order.max()) < 5
    torch.testing.assert_close(l2.stream(table, order), l2.reference_sums(table, order), rtol=1e-3, atol=1e-2)


def test_shared_order_reads_the_same_sequence_in_every_program():
    order = l2.tile_orders(3, programs=2, steps=5, kind="shared", generator=torch.Generator())
    assert order.tolist() == [[0, 1, 2, 0, 1], [0, 1, 2, 0, 1]]


@pytest.mark.parametrize("args,flag", [(["--orders", "sideways"], "--orders"), (["--megabytes", "x"], "--megabytes"),
                                       (["--megabytes", "0.5"], "--megabytes"), (["--steps", "0"], "--steps")])
def test_bad_options_are_usage_errors(tmp_path, capsys, args, flag):
    assert flag in usage_error(l2.main, tmp_path, capsys, *args)
