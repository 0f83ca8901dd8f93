"""LTX-2 (audio-video) through the real loader, sampler and the Sparse Attention Patch.

Runs on a ComfyUI with comfy/ldm/lightricks/av_model.py (make test COMFYUI=0.33) and skips on
0.3.75, which has no LTX-2. The model is the tiny one of tests/comfyui_harness.py
(``build_ltx2``): detected as LTXAV by ComfyUI, sampled on the [video, audio] latent that the
sampler packs into one tensor described by ``latent_shapes``.
"""
from __future__ import annotations

import collections

import pytest
import torch

import comfyui_harness as H
from pack_nodes import patch, summary

STEPS = 3


@pytest.fixture(scope="module")
def ltx2(comfy):
    ok, reason = H.ltx2_available()
    if not ok:
        pytest.skip(reason)
    return H.build_ltx2(0, latent_shape=(1, 128, 4, 8, 8))   # 256 video tokens: 4 Sol blocks


@pytest.fixture(scope="module")
def ltx2_base(ltx2):
    return H.sample(ltx2, steps=STEPS)


def call_kinds(tiny, calls):
    """Name each recorded attention call by its (query, key) token counts."""
    n = tiny.latent_shape[2] * tiny.latent_shape[3] * tiny.latent_shape[4]   # patch 1
    a = tiny.audio_latent_shape[2]
    names = {(n, n): "video_self", (a, a): "audio_self", (n, a): "audio_to_video", (a, n): "video_to_audio",
             (n, 1024): "video_text", (a, 1024): "audio_text"}
    return collections.Counter(names[c.args[0]["shape"][1], c.args[1]["shape"][1]] for c in calls)


def test_ltx2_video_self_attention_sparse_everything_else_dense(pack, ltx2, ltx2_base):
    rec = H.AttentionRecorder()       # an earlier override: it gets exactly the calls we leave dense
    grids = []

    def latent_seen(executor, x, t, *args, **kwargs):
        grids.append((tuple(x.shape), [tuple(s) for s in kwargs.get("latent_shapes") or []]))
        return executor(x, t, *args, **kwargs)

    import comfy.patcher_extension as pe
    prior = H.with_attention_override(ltx2.patcher, rec)
    prior.add_wrapper_with_key(pe.WrappersMP.APPLY_MODEL, "test_latent_seen", latent_seen)
    m = patch(pack, prior, beta=float("-inf"), warmup=0.0, dense_blocks="")
    out = H.sample(ltx2, steps=STEPS, model=m)
    # beta = -inf: every key block exact, so the unpatched model's output (video and audio)
    torch.testing.assert_close(H.flat(out), H.flat(ltx2_base), atol=1e-4, rtol=1e-4)
    s = summary(pack, m)
    layers = len(ltx2.patcher.model.diffusion_model.transformer_blocks)
    assert s["family"] == "ltx2" and s["warnings"] == {}
    assert s["sparse_calls"] == STEPS * layers                          # video self-attention
    assert s["dense_calls"] == {"not_video_self_attention": STEPS * layers * 5}
    assert s["mean_density"] == pytest.approx(1.0)
    # the dense ones are audio self, text cross (video and audio), a2v and v2a: never video self
    prev = pack.patching.dispatcher_of(m).prev_override
    assert call_kinds(ltx2, prev.calls) == {k: STEPS * layers for k in
                                            ("audio_self", "video_text", "audio_text", "audio_to_video",
                                             "video_to_audio")}
    # the model gets one packed tensor [B, 1, video + audio values]; only latent_shapes tells
    # the video grid, and that is the grid the patch used
    video, audio = ltx2.latent_shape, ltx2.audio_latent_shape
    assert grids and all(g == ((1, 1, H.flat(out).shape[1]), [video, audio]) for g in grids)
    assert s["grid"] == list(video[2:])


def test_ltx2_sol_changes_only_what_it_should(pack, ltx2, ltx2_base):
    m = patch(pack, ltx2.patcher, beta=1.0, warmup=0.0, dense_blocks="")
    out = H.sample(ltx2, steps=STEPS, model=m)
    s = summary(pack, m)
    assert s["sparse_calls"] == STEPS * 2 and 0 < s["mean_density"] < 1.0
    diff = (H.flat(out) - H.flat(ltx2_base)).abs()
    assert diff.max() > 1e-4 and torch.isfinite(diff).all()
    # dense blocks and warm-up apply per LTX-2 transformer block and step, like every family
    m = patch(pack, ltx2.patcher, beta=1.0, warmup=0.34, dense_blocks="-1")
    H.sample(ltx2, steps=STEPS, model=m)
    s = summary(pack, m)
    assert {b for (_, b) in s["density_by_step_block"]} == {0}
    assert {st for st, c in s["steps"].items() if c["sparse"]} == {1, 2}
    assert s["dense_calls"]["warmup"] == 2 and s["dense_calls"]["dense_block"] == 2
