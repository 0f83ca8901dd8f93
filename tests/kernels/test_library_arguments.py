"""The library's public functions check their arguments (finite, in range, integral where
they must be) before they compute or allocate, and say which argument is wrong; the command
line turns every such refusal into one line and exit status 2."""
from __future__ import annotations

import math

import pytest
import torch

import kernels
import kernels.psa_search.cli
from kernels.psa_mask import psa_kernel_mask
from kernels.psa_search import PSASearchAccumulator

GRID = (2, 4, 4)
N = 32
PARAMS = [[1, 0, 0, 1, 0, 0]] * 2


def qkv(dtype=torch.float32, D=16):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, N, 2, D, generator=g).to(dtype) for _ in range(3)]


SCALE_CALLS = {
    "sol_attention_reference": lambda q, k, v, s: kernels.sol_attention_reference(q, k, v, beta=1.0, scale=s),
    "sol_block_selection": lambda q, k, v, s: kernels.sol_block_selection(q, k, v, beta=1.0, scale=s),
    "psa_attention_reference": lambda q, k, v, s: kernels.psa_attention_reference(
        q, k, v, grid=GRID, params=PARAMS, tile=(1, 2, 2), scale=s),
    "PSASearchAccumulator": lambda q, k, v, s: PSASearchAccumulator(GRID, (1, 2, 2), 2, scale=s),
}


@pytest.mark.parametrize("call", sorted(SCALE_CALLS))
@pytest.mark.parametrize("scale", [1e300, 1e-300, math.inf, math.nan, 0.0, -1.0, "x", 10 ** 400],
                         ids=["1e300", "1e-300", "inf", "nan", "0", "-1", "text", "10**400"])
def test_a_scale_float32_cannot_hold_is_refused(call, scale):
    q, k, v = qkv()
    with pytest.raises(ValueError, match="^scale must be a positive number in float32's range"):
        SCALE_CALLS[call](q, k, v, scale)
    assert SCALE_CALLS[call](q, k, v, 1e3) is not None   # a large scale inside the range still runs


def test_the_patch_leaves_calls_with_such_a_scale_dense(pack):
    q = torch.randn(1, 8, 64)
    plan = pack.policy.Plan("reference", None)

    def verdict(scale):
        return pack.policy.admit(pack.calls.read_call((q, q, q, 1), {"scale": scale}), plan)

    for scale in (1e300, 1e-300, math.inf, -1.0):
        dense = verdict(scale)
        assert dense.reason == "scale" and "float32's range" in dense.detail
    assert verdict(0.125).scale == 0.125


@pytest.mark.parametrize("grid", [(0, 0, 0), (-1, 4, 4), (1.5, 2, 2), (2, 4), "244", (2, 4, 2000)])
def test_sol_tile_for_grid_refuses_what_is_not_a_video_grid(grid):
    with pytest.raises(ValueError, match="^grid"):
        kernels.sol_tile_for_grid(grid)
    assert kernels.sol_tile_for_grid((21, 45, 80)) == (1, 8, 8)


@pytest.mark.parametrize("extra, words", [(2 ** 40, "extra_tokens must be <= 4194272"), (-1, "extra_tokens must be >= 0"),
                                          (2.0, "extra_tokens must be an integer"), (math.inf, "extra_tokens must be")])
def test_block_layout_bounds_the_extra_tokens_before_it_allocates(extra, words):
    """2**40 extra tokens once asked for 549 GB; the bound is the longest sequence the kernels take."""
    for call in (lambda: kernels.block_layout((2, 4, 4), (1, 2, 2), extra_tokens=extra),
                 lambda: psa_kernel_mask((2, 4, 4), PARAMS, (1, 2, 2), extra_tokens=extra)):
        with pytest.raises(ValueError, match=words):
            call()
    assert kernels.block_layout((2, 4, 4), (1, 2, 2), extra_tokens=5).n_blocks == 8 + 2


HUGE = 10 ** 400   # beyond every float
NOT_COUNTS = [0, -1, 1.5, math.nan, math.inf, HUGE, "3", None, True]
UNBOUNDED_COUNTS = [0, -1, 1.5, math.nan, math.inf, "3", True]   # None: the default; any size goes
NUMERIC_CALLS = [   # (argument, a call with it set to x, values refused by name)
    ("query_chunk", lambda x: kernels.psa_attention_reference(*qkv(), grid=GRID, params=PARAMS, tile=(1, 2, 2),
                                                              query_chunk=x), UNBOUNDED_COUNTS),
    ("max_candidates", lambda x: kernels.psa_search.candidate_space(GRID, (1, 2, 2), max_candidates=x),
     UNBOUNDED_COUNTS),
    ("seed", lambda x: kernels.psa_search.candidate_space(GRID, (1, 2, 2), seed=x), [-1, 1.5, math.nan, "3", None]),
    ("layer", lambda x: PSASearchAccumulator(GRID, (1, 2, 2), 2, candidates=PARAMS[:1]).add(*qkv(), layer=x),
     [-1, 1024, 1.5, math.inf, HUGE, "3", None]),
    ("step", lambda x: PSASearchAccumulator(GRID, (1, 2, 2), 2, candidates=PARAMS[:1]).add(*qkv(), layer=0, step=x),
     [math.nan, HUGE, "3", None, True]),
    ("shape entries", lambda x: kernels.psa_search.estimate_sample_bytes((1, x, 2, 16)), [-1, 1.5, math.inf, "3"]),
    ("beta", lambda x: kernels.density_for_beta(x), [math.nan, HUGE, "3", None]),
    ("rho (target density)", lambda x: kernels.beta_for_density(x), [0, 1, math.nan, math.inf, HUGE, "3", None]),
]


@pytest.mark.parametrize("name, call, refused", NUMERIC_CALLS, ids=[c[0] for c in NUMERIC_CALLS])
def test_numeric_arguments_are_refused_by_name(name, call, refused):
    for x in refused:
        with pytest.raises((ValueError, TypeError)) as e:
            call(x)
        assert name in str(e.value), (x, str(e.value))


@pytest.mark.parametrize("device", ["meta", "mps", "bogus", "cuda:99"])
def test_cli_device_is_checked_in_one_line(tmp_path, capsys, device):
    samples = tmp_path / "samples"
    samples.mkdir()
    kernels.psa_search.save_qkv_sample(samples / "s.safetensors", *qkv(), layer=0, step=0.0, grid=GRID)
    out = tmp_path / "t.safetensors"
    assert kernels.psa_search.cli.main(["search", str(samples), "--tile", "1", "2", "2", "--out", str(out),
                                    "--device", device]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("python -m kernels.psa_search: error: --device: ") and "\n" not in err, err
    assert not out.exists()
