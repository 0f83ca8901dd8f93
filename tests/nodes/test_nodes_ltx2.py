"""LTX-2, 2.3 and 2.5 (audio-video) through the real loader, sampler and the Sparse Attention Patch.

Runs on a ComfyUI with comfy/ldm/lightricks/av_model.py (make test COMFYUI=0.33) and skips on
0.3.75, which has no LTXAV. The models are the tiny ones of tests/comfyui_harness.py
(``build_ltx2``): detected as LTXAV by ComfyUI, sampled on the [video, audio] latent that the
sampler packs into one tensor described by ``latent_shapes``. LTX-2.3 and 2.5 are the same
class with other switches in the file's config metadata (gated attention, cross-attention
AdaLN, the text projection in the text encoder: ``tiny_models.LTX23_SWITCHES``); the fixture
runs every test on both.
"""
from __future__ import annotations

import collections

import pytest
import torch

import comfyui_harness as H
import tiny_models
from kernels.preset_file import load_preset
from kernels.psa_mask import psa_mask
from pack_nodes import patch, saved_and_loaded, spy_kernel_calls, summary

STEPS = 3
PRESETS = {"ltx2": "ltx2_720p_121f.json", "ltx23": "ltx2.3_720p_121f.json"}


@pytest.fixture(scope="module", params=["ltx2", "ltx23"])
def ltx2(request, comfy):
    ok, reason = H.ltx2_available()
    if not ok:
        pytest.skip(reason)
    # 256 video tokens: 4 Sol blocks
    return H.build_ltx2(0, latent_shape=(1, 128, 4, 8, 8), ltx23=request.param == "ltx23")


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
    assert s["family"] == "ltx2" and s["warnings"] == {}   # the pack's one adapter for LTXAV
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


def test_kernel_gets_the_video_tokens_of_comfyuis_own_layers(pack, monkeypatch, ltx2):
    """The kernel's value rows are attn1's own v projection (before LTX-2.3's per-head gate,
    which scales the attention output afterwards), with the video grid of ``latent_shapes``."""
    dm = ltx2.patcher.model.diffusion_model
    seen = []
    hook = dm.transformer_blocks[0].attn1.to_v.register_forward_hook(lambda mod, args, out: seen.append(out.clone()))
    kernel_calls = spy_kernel_calls(pack, monkeypatch)
    try:
        H.sample(ltx2, steps=1, model=patch(pack, ltx2.patcher, beta=1.0, warmup=0.0, dense_blocks=""))
    finally:
        hook.remove()
    assert len(kernel_calls) == len(dm.transformer_blocks)
    v, grid = kernel_calls[0]
    assert grid == tuple(ltx2.latent_shape[2:])
    torch.testing.assert_close(v, seen[0].view(*v.shape), rtol=0, atol=0)


def test_psa_with_the_shipped_preset(pack, ltx2, ltx2_base):
    """The shipped 720p preset of each release fits its full-size model as ComfyUI detects it
    from the file's config metadata (LTX-2.3 and 2.5 share the video stream's geometry); cut to
    the tiny model it runs every block with the density of those masks."""
    import comfy.model_detection
    family = ltx2.family
    p = load_preset(H.REPO_ROOT / "mask_presets" / PRESETS[family])
    seed, metadata = tiny_models.ltx2_seed(num_layers=48, num_heads=32, head_dim=128, audio_heads=32,
                                           audio_head_dim=64, caption_channels=3840, connector_heads=30,
                                           ltx23=family == "ltx23")
    full = comfy.model_detection.detect_unet_config(seed, "", metadata=metadata)
    assert full["image_model"] == "ltxav"
    assert (full["num_layers"], full["num_attention_heads"], full["attention_head_dim"]) == \
        tuple(p.fingerprint[k] for k in ("layers", "heads", "head_dim"))
    assert p.family == "ltx2" and tuple(p.grid) == (16, 22, 40)   # 1280x720 (704), 121 frames
    grid, tile = tuple(ltx2.latent_shape[2:]), (1, 2, 4)
    standin = tiny_models.standin_preset(H.REPO_ROOT / "mask_presets" / PRESETS[family], layers=2,
                                         heads=ltx2.heads, hidden_size=ltx2.heads * ltx2.head_dim, grid=grid,
                                         tile=tile, head_dim=ltx2.head_dim)
    m = patch(pack, ltx2.patcher, method="psa", preset=saved_and_loaded(pack, standin), warmup=0.0, dense_blocks="")
    out = H.sample(ltx2, steps=STEPS, model=m)
    s = summary(pack, m)
    assert s["sparse_calls"] == STEPS * 2 and s["dense_calls"] == {"not_video_self_attention": STEPS * 2 * 5}
    want = torch.stack([psa_mask(grid, standin.params_for_layer(b), tile).density(tokens=True) for b in (0, 1)])
    assert float(want.max()) < 1.0
    assert s["mean_density"] == pytest.approx(float(want.mean()), rel=1e-6)
    assert (H.flat(out) - H.flat(ltx2_base)).abs().max() > 1e-5
