"""β's documented range (kernels.sol_rules.BETA_MIN/BETA_MAX): inside it no warning,
outside it (±inf included) the call runs and gives a BetaRangeWarning attributed to the
caller's line; README and the node's tooltip state the same range."""
from __future__ import annotations

import math
import warnings
from pathlib import Path

import pytest
import torch

import kernels
from kernels import sol_rules

REPO = Path(__file__).resolve().parents[2]


def qkv(heads=2, length=256):
    g = torch.Generator().manual_seed(0)
    return [torch.randn(1, length, heads, 64, generator=g) for _ in range(3)]


@pytest.mark.parametrize("beta", [sol_rules.BETA_MIN, 0.0, 1.5, sol_rules.BETA_MAX,
                                  torch.tensor([sol_rules.BETA_MIN, sol_rules.BETA_MAX])])
def test_no_warning_inside_the_range(beta):
    q, k, v = qkv()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        kernels.sol_attention_reference(q, k, v, beta=beta)
        kernels.sol_block_selection(q, k, v, beta=beta)


@pytest.mark.parametrize("beta, words", [
    (sol_rules.BETA_MIN - 0.5, "-1.5 gives an expected density 1 - Phi(beta) of 0.933"),
    (sol_rules.BETA_MAX + 1.0, "5 gives an expected density 1 - Phi(beta) of 2.87e-07"),
    (float("-inf"), "-inf computes every key block exactly"),
    (float("inf"), "inf computes only forced key blocks exactly"),
])
def test_outside_the_range_warns_and_runs(beta, words):
    q, k, v = qkv()
    with pytest.warns(sol_rules.BetaRangeWarning) as record:
        out = kernels.sol_attention_reference(q, k, v, beta=beta)
    message = str(record[0].message)
    assert message.startswith("beta outside the documented range [-1, 4]") and words in message, message
    assert record[0].filename == __file__  # the caller's line, not a line inside kernels/
    assert torch.isfinite(out).all()


def test_per_head_tensor_names_each_value_outside():
    q, k, v = qkv(heads=3)
    with pytest.warns(sol_rules.BetaRangeWarning, match=r"-3 gives .*; 6 gives"):
        kernels.sol_attention_reference(q, k, v, beta=torch.tensor([1.0, 6.0, -3.0]))


def test_range_ends_are_the_documented_densities():
    assert sol_rules.density_for_beta(sol_rules.BETA_MIN) == pytest.approx(0.8413, abs=1e-4)
    assert sol_rules.density_for_beta(sol_rules.BETA_MAX) == pytest.approx(3.17e-5, rel=1e-2)
    assert sol_rules.beta_range_problem(math.nextafter(sol_rules.BETA_MAX, math.inf)) is not None


def test_readme_states_the_range():
    text = (REPO / "README.md").read_text()
    lo, hi = sol_rules.BETA_MIN, sol_rules.BETA_MAX
    stated = (f"β in [{lo:g}, {hi:g}] (expected density ~{100 * sol_rules.density_for_beta(lo):.0f} % "
              f"down to ~{100 * sol_rules.density_for_beta(hi):.3f} %)").replace("-", "−")
    assert stated in text, f"README.md should say: {stated}"



@pytest.mark.parametrize("beta", [1e39, -1e39, -1e308, 10 ** 400, torch.tensor([1.0, 1e39], dtype=torch.float64)],
                         ids=["1e39", "-1e39", "-1e308", "10**400", "per-head float64"])
def test_a_finite_beta_beyond_float32_is_refused_by_name(beta):
    """The routing computes in float32, where such a β would silently turn into ±inf."""
    q, k, v = qkv()
    for call in (kernels.sol_attention_reference, kernels.sol_block_selection):
        with pytest.raises(ValueError, match="^beta: must be -inf, inf or a number within float32's range"):
            call(q, k, v, beta=beta)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", sol_rules.BetaRangeWarning)
        for limit in (math.inf, -math.inf, torch.finfo(torch.float32).max):
            assert not kernels.sol_attention_reference(q, k, v, beta=limit).isnan().any()
