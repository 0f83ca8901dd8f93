"""HunyuanVideo 1.5 through the real loader, sampler and the Sparse Attention Patch.

The model is the tiny one of tests/comfyui_harness.py (``build_hunyuan_video15``): ComfyUI
detects it as HunyuanVideo15 (its vision_in layer), builds its HunyuanVideo class with a
1x1x1 patch on the 32-channel latent, and samples it with the conditioning its nodes give:
Qwen2.5-VL text, and for image-to-video the start image's latent and SigLIP vision tokens
(HunyuanVideo15ImageToVideo + CLIPVisionEncode), here with a glyph prompt's ByT5 tokens too.
Both ComfyUI versions of the matrix have the class.
"""
from __future__ import annotations

import collections

import pytest
import torch

import comfyui_harness as H
import tiny_models
from kernels.preset_file import load_preset
from kernels.psa_mask import psa_mask
from pack_nodes import check_hunyuan_join_order, hunyuan_non_video_tokens, patch, saved_and_loaded, summary

STEPS = 3
PRESET = H.REPO_ROOT / "mask_presets" / "hunyuan_video1.5_720p_121f.json"


@pytest.fixture(scope="module", params=["t2v", "i2v"])
def hv15(request, comfy):
    """(tiny, unpatched output, kind): two double blocks, no single block (the 8.3B's layout),
    a 4 x 8 x 8 latent grid (256 video tokens: four 64-token blocks)."""
    tiny = H.build_hunyuan_video15(0, i2v=request.param == "i2v", glyph_tokens=4 if request.param == "i2v" else 0)
    return tiny, H.sample(tiny, steps=STEPS, cfg=2.0), request.param


def test_video_self_attention_sparse_text_refiner_dense_beta_neg_inf_exact(pack, hv15):
    tiny, base, kind = hv15
    rec = H.AttentionRecorder()       # an earlier override: it gets exactly the calls we leave dense
    m = patch(pack, H.with_attention_override(tiny.patcher, rec), beta=float("-inf"), warmup=0.0, dense_blocks="")
    out = H.sample(tiny, steps=STEPS, cfg=2.0, model=m)
    # beta = -inf: every key block exact, so the unpatched model's output
    torch.testing.assert_close(out, base, atol=1e-4, rtol=1e-4)
    s = summary(pack, m)
    depth = len(tiny.patcher.model.diffusion_model.double_blocks)
    assert s["family"] == "hunyuan_video" and s["warnings"] == {}
    assert s["sparse_calls"] == STEPS * depth                     # the joint attention of every block
    assert s["dense_calls"] == {"not_video_self_attention": STEPS * 2}   # the text refiner's two blocks
    assert s["mean_density"] == pytest.approx(1.0)
    assert s["grid"] == list(tiny.latent_shape[2:])               # patch 1x1x1: the latent grid itself
    # what stayed dense is the refiner, text tokens only (cond and uncond batched)
    prev = pack.patching.dispatcher_of(m).prev_override
    assert collections.Counter(tuple(c.args[0]["shape"]) for c in prev.calls) == \
        {(2, tiny.heads, tiny.extra_tokens["text"], tiny.head_dim): STEPS * 2}


def test_sol_changes_only_the_video_attention_and_keeps_the_schedule(pack, hv15):
    tiny, base, kind = hv15
    m = patch(pack, tiny.patcher, beta=1.0, warmup=0.34, dense_blocks="-1")
    out = H.sample(tiny, steps=STEPS, cfg=2.0, model=m)
    s = summary(pack, m)
    assert {b for (_, b) in s["density_by_step_block"]} == {0}       # "-1" is the last double block
    assert {st for st, c in s["steps"].items() if c["sparse"]} == {1, 2}
    assert s["dense_calls"]["warmup"] == 2 and s["dense_calls"]["dense_block"] == 2
    assert 0 < s["mean_density"] < 1
    diff = (out - base).abs()
    assert diff.max() > 1e-5 and torch.isfinite(diff).all()


@pytest.mark.parametrize("op_name, method", [("sol_attention", "sol_attn"), ("psa_attention", "psa")])
def test_i2v_kernels_get_the_video_then_vision_glyph_and_text_tokens(pack, monkeypatch, op_name, method):
    """The token ranges, read off ComfyUI's own layers on either version: the video rows are
    the image stream's, the rows after them the text stream's, which ComfyUI makes of the
    SigLIP vision tokens, then the glyph (ByT5) tokens, then the Qwen text. One double and one
    single block, so that both kinds of block are checked (the class has both; the released
    8.3B uses double blocks only)."""
    tiny = H.build_hunyuan_video15(1, i2v=True, glyph_tokens=4, depth=1, depth_single_blocks=1)
    widgets = dict(beta=1.0, warmup=0.0, dense_blocks="")
    if method == "psa":
        preset = tiny_models.standin_preset(PRESET, layers=2, heads=tiny.heads, hidden_size=128,
                                            grid=tuple(tiny.latent_shape[2:]), tile=(1, 2, 4))
        widgets.update(method="psa", preset=saved_and_loaded(pack, preset))
    m = patch(pack, tiny.patcher, **widgets)
    seen = check_hunyuan_join_order(pack, monkeypatch, tiny, op_name, m)
    assert hunyuan_non_video_tokens(tiny, seen) == tiny.extra_tokens == {"vision": 9, "glyph": 4, "text": 16}


def test_psa_with_the_shipped_preset(pack, hv15):
    """The shipped 720p preset fits the released model as ComfyUI detects it; cut to the tiny
    model (its first blocks and heads, rescaled to the tiny grid), PSA runs every block with
    the density of those masks."""
    import comfy.model_detection
    p = load_preset(PRESET)
    full = comfy.model_detection.detect_unet_config(
        tiny_models.hunyuan_video15_seed(hidden_size=2048, depth=54, depth_single_blocks=0), "")
    assert (full["depth"] + full["depth_single_blocks"], full["num_heads"], full["hidden_size"] // full["num_heads"],
            full["hidden_size"]) == tuple(p.fingerprint[k] for k in ("layers", "heads", "head_dim", "hidden_size"))
    assert p.family == "hunyuan_video" and tuple(p.grid) == (31, 45, 80)   # 1280x720, 121 frames
    tiny, base, kind = hv15
    grid, tile = tuple(tiny.latent_shape[2:]), (1, 2, 4)
    standin = tiny_models.standin_preset(PRESET, layers=2, heads=tiny.heads, hidden_size=128, grid=grid, tile=tile)
    m = patch(pack, tiny.patcher, method="psa", preset=saved_and_loaded(pack, standin), warmup=0.0, dense_blocks="")
    out = H.sample(tiny, steps=STEPS, cfg=2.0, model=m)
    s = summary(pack, m)
    assert s["sparse_calls"] == STEPS * 2 and s["dense_calls"] == {"not_video_self_attention": STEPS * 2}
    want = torch.stack([psa_mask(grid, standin.params_for_layer(b), tile).density(tokens=True) for b in (0, 1)])
    assert float(want.max()) < 1.0
    assert s["mean_density"] == pytest.approx(float(want.mean()), rel=1e-6)
    assert (out - base).abs().max() > 1e-5


def test_padded_text_mask_runs_dense_with_its_reason(pack, comfy, caplog):
    """A text attention mask with padding (a batch of prompts of different lengths) reaches the
    joint attention as an additive mask over the keys, which the kernels do not take: those
    calls run ComfyUI's attention, logged, and the output is the unpatched one."""
    tiny = H.build_hunyuan_video15(2)
    make = tiny.make_conditioning

    def padded(cond_seed):
        pos, neg = make(cond_seed)
        for cond in (pos, neg):
            mask = torch.ones(1, tiny.extra_tokens["text"], dtype=torch.long)
            mask[:, -5:] = 0
            cond[0][1]["attention_mask"] = mask
        return pos, neg
    tiny.make_conditioning = padded
    base = H.sample(tiny, steps=2)
    m = patch(pack, tiny.patcher, beta=1.0, warmup=0.0, dense_blocks="")
    torch.testing.assert_close(H.sample(tiny, steps=2, model=m), base, rtol=0, atol=0)
    s = summary(pack, m)
    assert s["sparse_calls"] == 0 and s["dense_calls"]["mask"] == 2 * 2
    assert any("mask" in r.getMessage() and "dense" in r.getMessage() for r in caplog.records)
