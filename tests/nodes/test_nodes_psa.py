"""PSA through the nodes inside a real ComfyUI (CPU, float reference backend): presets made
with kernels.preset_file, loaded by 'Load Stripe Mask Preset', validated at patch time, resolved
per grid and per step bucket, and the achieved density in the run summary."""
from __future__ import annotations

import json

import pytest
import torch

import comfyui_harness as H
from kernels.psa_mask import psa_mask
from pack_nodes import check_hunyuan_join_order, patch, saved_and_loaded, summary
from preset_builders import TINY_TILE, fingerprint, full_row, tiny_preset, token_grid

STEPS = 4


@pytest.fixture(scope="module")
def models(comfy):
    """Two heads each (hidden 256 = 2 × 128): Wan with 2 blocks, HunyuanVideo 1+1 blocks."""
    out = {}
    for fam, tiny in (("wan", H.build_wan21(3, num_layers=2, dim=256)),
                      ("hunyuan_video", H.build_hunyuan_video(3, hidden_size=256))):
        out[fam] = (tiny, H.sample(tiny, steps=STEPS))
    return out


@pytest.mark.parametrize("family", ["wan", "hunyuan_video"])
def test_full_preset_reproduces_unpatched(pack, models, family):
    tiny, base = models[family]
    grid = token_grid(tiny)
    p = tiny_preset(f"full_{family}", family, fingerprint(tiny), grid,
                    [[[full_row(grid)] * tiny.heads] * 2])
    m = patch(pack, tiny.patcher, method="psa", preset=saved_and_loaded(pack, p),
              warmup=0.0, dense_blocks="")
    out = H.sample(tiny, steps=STEPS, model=m)
    torch.testing.assert_close(out, base, atol=1e-4, rtol=1e-4)
    s = summary(pack, m)
    assert s["sparse_calls"] == STEPS * 2                       # every video self-attention
    assert s["mean_density"] == pytest.approx(1.0)
    assert s["head_density_by_block"] == {0: [1.0, 1.0], 1: [1.0, 1.0]}
    assert s["preset"]["name"] == f"full_{family}" and s["grid"] == list(grid)


@pytest.mark.parametrize("family", ["wan", "hunyuan_video"])
def test_sparse_preset_density_per_head_and_bucket(pack, models, family):
    tiny, base = models[family]
    grid = token_grid(tiny)
    early = [[1, 0, 0, 1, 0, 0], [2, 0, 0, 1, 0, 0]]                 # bucket 0, heads 0/1
    late = [[1, 0, 0, 2, 0, 0], full_row(grid)]                      # bucket 1
    p = tiny_preset(f"stripes_{family}", family, fingerprint(tiny), grid,
                    [[early, early], [late, late]], edges=[0.5])
    m = patch(pack, tiny.patcher, method="psa", preset=saved_and_loaded(pack, p),
              warmup=0.0, dense_blocks="0")
    out = H.sample(tiny, steps=STEPS, model=m)
    assert (out - base).abs().max() > 1e-4                           # the sparse path ran
    s = summary(pack, m)
    assert s["sparse_calls"] == STEPS and s["dense_calls"]["dense_block"] == STEPS
    d_early = psa_mask(grid, early, TINY_TILE).density(tokens=True)
    d_late = psa_mask(grid, late, TINY_TILE).density(tokens=True)
    assert float(d_early.max()) < 1.0
    for step in range(STEPS):        # progress = step / 4: steps 0, 1 in bucket 0; 2, 3 in 1
        want = d_early if step < 2 else d_late
        assert s["steps"][step]["mean_density"] == pytest.approx(float(want.mean()), rel=1e-6)
    per_head = s["head_density_by_block"][1]
    assert per_head == pytest.approx(((d_early + d_late) / 2).tolist(), rel=1e-6)


def test_hunyuan_video_psa_gets_the_video_tokens_first_in_either_join_order(pack, models, monkeypatch):
    tiny, _ = models["hunyuan_video"]
    grid = token_grid(tiny)
    stripes = [[1, 0, 0, 1, 0, 0], [2, 0, 0, 1, 0, 0]]               # sparse for both heads
    p = tiny_preset("stripes_join_order", "hunyuan_video", fingerprint(tiny), grid, [[stripes, stripes]])
    m = patch(pack, tiny.patcher, method="psa", preset=saved_and_loaded(pack, p),
              warmup=0.0, dense_blocks="")
    check_hunyuan_join_order(pack, monkeypatch, tiny, "psa_attention", m)


def test_bad_presets_rejected_at_patch_time(pack, models):
    tiny, _ = models["wan"]
    grid = token_grid(tiny)
    rows = [[full_row(grid)] * tiny.heads] * 2
    fp = fingerprint(tiny)
    cases = [
        (tiny_preset("fam", "ltxv", fp, grid, [rows]), ["model family: preset 'ltxv', model 'wan'"]),
        (tiny_preset("layers", "wan", dict(fp, layers=3), grid, [rows + rows[:1]]),
         ["layers: preset 3, model 2"]),
        (tiny_preset("heads", "wan", dict(fp, heads=1, hidden_size=128), grid,
                     [[[full_row(grid)]] * 2]), ["heads: preset 1, model 2", "hidden_size"]),
        (tiny_preset("all", "hunyuan_video", dict(fp, head_dim=64), grid, [rows]),
         ["model family", "head_dim: preset 64, model 128"]),
    ]
    for preset, parts in cases:
        loaded = saved_and_loaded(pack, preset)
        with pytest.raises(ValueError) as e:
            patch(pack, tiny.patcher, method="psa", preset=loaded)
        for part in parts:
            assert part in str(e.value), str(e.value)
    # the Wan 2.1 name of the family is accepted for a Wan model
    ok = tiny_preset("wan21name", "wan2.1", fp, grid, [rows])
    patch(pack, tiny.patcher, method="psa", preset=saved_and_loaded(pack, ok))


def test_other_grid_refused_without_crash_or_rescaled(pack, models, caplog):
    tiny, base = models["wan"]
    grid = token_grid(tiny)                                    # (3, 4, 6): block grid (3, 2, 3)
    rows = [[[1, 0, 0, 1, 0, 0]] * tiny.heads] * 2
    big = saved_and_loaded(pack, tiny_preset("big", "wan", fingerprint(tiny), (6, 8, 12), [rows]))
    m = patch(pack, tiny.patcher, method="psa", preset=big, warmup=0.0, dense_blocks="")
    out = H.sample(tiny, steps=STEPS, model=m)                 # sampling completes, dense
    torch.testing.assert_close(out, base)
    s = summary(pack, m)
    assert s["sparse_calls"] == 0 and s["dense_calls"]["preset_grid"] == STEPS * 2
    assert "(6, 8, 12)" in s["notes"]["preset_grid"] and "(3, 4, 6)" in s["notes"]["preset_grid"]
    assert any("(6, 8, 12)" in r.getMessage() for r in caplog.records if r.levelname == "WARNING")
    # rescale: approximate masks on the video's block grid, with a warning
    caplog.clear()
    m = patch(pack, tiny.patcher, method="psa", preset=big, warmup=0.0, dense_blocks="",
              preset_grid="rescale")
    H.sample(tiny, steps=STEPS, model=m)
    assert summary(pack, m)["sparse_calls"] == STEPS * 2
    assert any("rescaling preset 'big'" in r.getMessage() for r in caplog.records)
    # another token grid with the same block grid uses the parameters unchanged
    same = saved_and_loaded(pack, tiny_preset("same_blocks", "wan", fingerprint(tiny),
                                                     (3, 3, 5), [rows]))
    m = patch(pack, tiny.patcher, method="psa", preset=same, warmup=0.0, dense_blocks="")
    H.sample(tiny, steps=STEPS, model=m)
    s = summary(pack, m)
    assert s["sparse_calls"] == STEPS * 2
    want = psa_mask(grid, rows[0], TINY_TILE).density(tokens=True).mean()
    assert s["mean_density"] == pytest.approx(float(want), rel=1e-6)
    json.dumps(s["preset"])
