"""Fast CPU checks of the video-like workload generator (benchmarks/workload.py)."""
import math
import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.workload import KINDS, rope_bands, video_qkv  # noqa: E402
from benchmarks.workload_stats import head_attention_stats, proxy_z, top_fraction_mass  # noqa: E402

GRID = (6, 12, 16)


@pytest.fixture(scope="module")
def one_of_each():
    kinds = ["local", "temporal", "spatial", "global"] * 2
    return video_qkv(GRID, len(kinds), 64, kinds=kinds, seed=3, dtype=torch.float32)


def test_shapes_dtype_and_labels():
    q, k, v, kinds = video_qkv((2, 4, 8), 5, 128, batch=2, seed=0, dtype=torch.bfloat16)
    for t in (q, k, v):
        assert t.shape == (2, 64, 5, 128)
        assert t.dtype == torch.bfloat16
        assert torch.isfinite(t.float()).all()
    assert len(kinds) == 5 and set(kinds) <= set(KINDS)


def test_deterministic_per_seed():
    a = video_qkv(GRID, 4, 64, seed=7, dtype=torch.float32)
    b = video_qkv(GRID, 4, 64, seed=7, dtype=torch.float32)
    c = video_qkv(GRID, 4, 64, seed=8, dtype=torch.float32)
    for x, y in zip(a[:3], b[:3]):
        assert torch.equal(x, y)
    assert not torch.equal(a[0], c[0])
    assert a[3] == b[3]


def test_wan_rope_split():
    assert rope_bands(128) == (44, 42, 42)
    assert rope_bands(64) == (24, 20, 20)


def test_bad_kinds():
    with pytest.raises(ValueError):
        video_qkv(GRID, 2, 64, kinds=["local"], seed=0)
    with pytest.raises(ValueError):
        video_qkv(GRID, 1, 64, kinds=["diagonal"], seed=0)


def test_values_smooth_over_grid(one_of_each):
    _, _, v, _ = one_of_each
    x = v[0].reshape(*GRID, v.shape[2], v.shape[3])
    neighbour = torch.nn.functional.cosine_similarity(x[:, :, 1:], x[:, :, :-1], dim=-1).mean()
    far = torch.nn.functional.cosine_similarity(x, x.roll(GRID[2] // 2, dims=2).roll(GRID[1] // 2, dims=1), dim=-1).mean()
    assert neighbour > 0.7 and neighbour > far + 0.3


def _head_token_stats(q, k, h):
    _, token, _ = head_attention_stats(q[0, :, h], k[0, :, h], GRID)
    return token


def test_kinds_behave_as_labelled(one_of_each):
    q, k, _, kinds = one_of_each
    stats = {}
    for h, kind in enumerate(kinds):
        stats.setdefault(kind, []).append(_head_token_stats(q, k, h))
    mean = {kd: {key: sum(s[key] for s in ss) / len(ss) for key in ss[0]} for kd, ss in stats.items()}
    # temporal heads: same (h, w) in other frames; spatial heads: the same frame
    assert mean["temporal"]["same_hw_other_frames"] > 2 * mean["spatial"]["same_hw_other_frames"]
    assert mean["spatial"]["same_frame"] > mean["temporal"]["same_frame"]
    # local heads: most mass in the 3x3x3 neighbourhood, more than global heads
    assert mean["local"]["neighbourhood"] > 2 * mean["global"]["neighbourhood"]
    # a uniform share of same-frame mass is 1/T; spatial heads are well above it
    assert mean["spatial"]["same_frame"] > 2.0 / GRID[0]


def test_attention_concentrated_and_proxy_standardized(one_of_each):
    q, k, _, kinds = one_of_each
    h = kinds.index("local")
    bm, _, _ = head_attention_stats(q[0, :, h], k[0, :, h], GRID)
    assert torch.allclose(bm.sum(-1), torch.ones(bm.shape[0]), atol=1e-4)
    n = bm.shape[-1]
    uniform = math.ceil(0.15 * n) / n  # share the top 15 % of blocks would hold under uniform attention
    assert top_fraction_mass(bm) > 2.5 * uniform
    z = proxy_z(q[0, :, h], k[0, :, h])
    assert torch.allclose(z.mean(-1), torch.zeros(z.shape[0]), atol=1e-4)
    assert torch.allclose(z.pow(2).mean(-1), torch.ones(z.shape[0]), atol=1e-3)


def test_no_quadratic_memory_in_generation():
    # 30k tokens: an L×L float32 map would be 3.6 GB; generation must stay O(L·D).
    q, _, _, _ = video_qkv((8, 60, 64), 1, 64, seed=0, dtype=torch.bfloat16)
    assert q.shape[1] == 8 * 60 * 64 and not math.isnan(q.float().std().item())
