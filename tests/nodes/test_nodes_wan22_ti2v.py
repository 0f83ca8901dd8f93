"""Wan 2.2 TI2V 5B through the real loader, sampler and the Sparse Attention Patch.

The model is the tiny one of tests/comfyui_harness.py (``build_wan22_ti2v``): 48 input and
output channels, which ComfyUI detects as WAN22_T2V (model base WAN22), on the 48-channel
latent of the Wan 2.2 VAE. Text-to-video samples an empty latent; image-to-video, as
Wan22ImageToVideoLatent makes it, keeps the first latent frame with a noise mask, and WAN22
then gives every frame its own timestep. Both ComfyUI versions of the matrix have the class.
"""
from __future__ import annotations

import pytest
import torch

import comfyui_harness as H
import tiny_models
from kernels.preset_file import load_preset
from kernels.psa_mask import psa_mask
from pack_nodes import patch, saved_and_loaded, spy_kernel_calls, summary

STEPS = 3
PRESET = H.REPO_ROOT / "mask_presets" / "wan2.2_ti2v_5b_720p_121f.json"


@pytest.fixture(scope="module", params=["t2v", "ti2v"])
def wan22(request, comfy):
    """(tiny, sampling keywords, unpatched output): two blocks, latent 48 x 4 x 16 x 16 (token
    grid 4 x 8 x 8: 256 tokens, four 64-token blocks)."""
    tiny = H.build_wan22_ti2v(0, latent_shape=(1, 48, 4, 16, 16))
    kw = {"noise_mask": H.ti2v_noise_mask(tiny)} if request.param == "ti2v" else {}
    return tiny, kw, H.sample(tiny, steps=STEPS, cfg=2.0, **kw)


def test_video_self_attention_sparse_text_cross_dense_beta_neg_inf_exact(pack, wan22):
    tiny, kw, base = wan22
    rec = H.AttentionRecorder()       # an earlier override: it gets exactly the calls we leave dense
    m = patch(pack, H.with_attention_override(tiny.patcher, rec), beta=float("-inf"), warmup=0.0, dense_blocks="")
    out = H.sample(tiny, steps=STEPS, cfg=2.0, model=m, **kw)
    torch.testing.assert_close(out, base, atol=1e-4, rtol=1e-4)
    s = summary(pack, m)
    layers = len(tiny.patcher.model.diffusion_model.blocks)
    assert s["family"] == "wan" and s["warnings"] == {}
    assert s["sparse_calls"] == STEPS * layers
    assert s["dense_calls"] == {"not_video_self_attention": STEPS * layers}   # the text cross-attention
    assert s["grid"] == [4, 8, 8]                 # the 48-channel latent over the 1x2x2 patch
    prev = pack.patching.dispatcher_of(m).prev_override
    assert {(c.args[0]["shape"][1], c.args[1]["shape"][1]) for c in prev.calls} == {(256, 16)}


def test_warmup_and_dense_blocks_count_steps_with_per_frame_timesteps(pack, wan22):
    """Image-to-video gives every latent frame its own timestep (the kept frame 0); the steps
    the patch counts are still the sampler's."""
    tiny, kw, base = wan22
    m = patch(pack, tiny.patcher, beta=1.0, warmup=0.34, dense_blocks="0")
    out = H.sample(tiny, steps=STEPS, cfg=2.0, model=m, **kw)
    s = summary(pack, m)
    assert {st for st, c in s["steps"].items() if c["sparse"]} == {1, 2}
    assert {b for (_, b) in s["density_by_step_block"]} == {1}
    assert s["dense_calls"]["warmup"] == 2 and s["dense_calls"]["dense_block"] == 2
    assert 0 < s["mean_density"] < 1
    diff = (out - base).abs()
    assert diff.max() > 1e-5 and torch.isfinite(diff).all()


def test_kernel_gets_the_video_tokens_of_comfyuis_own_layers(pack, monkeypatch, wan22):
    """The kernel's value rows are the self-attention's own v projection, every token of the
    grid in ComfyUI's order, with the grid the kernel tiles."""
    tiny, kw, _ = wan22
    dm = tiny.patcher.model.diffusion_model
    seen = []
    hook = dm.blocks[0].self_attn.v.register_forward_hook(lambda mod, args, out: seen.append(out.clone()))
    kernel_calls = spy_kernel_calls(pack, monkeypatch)
    try:
        H.sample(tiny, steps=1, cfg=2.0, model=patch(pack, tiny.patcher, beta=1.0, warmup=0.0, dense_blocks=""), **kw)
    finally:
        hook.remove()
    assert len(kernel_calls) == len(dm.blocks)
    v, grid = kernel_calls[0]
    assert grid == (4, 8, 8)
    torch.testing.assert_close(v, seen[0].view(*v.shape), rtol=0, atol=0)


def test_psa_with_the_shipped_preset(pack, wan22):
    """The shipped 720p preset fits the released 5B as ComfyUI detects it; cut to the tiny model
    it runs every block with the density of those masks."""
    import comfy.model_detection
    p = load_preset(PRESET)
    full = comfy.model_detection.detect_unet_config(
        tiny_models.wan_seed(dim=3072, num_layers=30, ffn_dim=14336, in_dim=48, out_dim=48), "")
    assert (full["num_layers"], full["num_heads"], full["dim"] // full["num_heads"], full["dim"]) == \
        tuple(p.fingerprint[k] for k in ("layers", "heads", "head_dim", "hidden_size"))
    assert full["out_dim"] == 48 and p.family == "wan" and tuple(p.grid) == (31, 22, 40)   # 1280x704, 121 frames
    tiny, kw, base = wan22
    grid, tile = (4, 8, 8), (1, 2, 4)
    standin = tiny_models.standin_preset(PRESET, layers=2, heads=tiny.heads, hidden_size=128, grid=grid, tile=tile)
    m = patch(pack, tiny.patcher, method="psa", preset=saved_and_loaded(pack, standin), warmup=0.0, dense_blocks="")
    out = H.sample(tiny, steps=STEPS, cfg=2.0, model=m, **kw)
    s = summary(pack, m)
    assert s["sparse_calls"] == STEPS * 2
    want = torch.stack([psa_mask(grid, standin.params_for_layer(b), tile).density(tokens=True) for b in (0, 1)])
    assert float(want.max()) < 1.0
    assert s["mean_density"] == pytest.approx(float(want.mean()), rel=1e-6)
    assert (out - base).abs().max() > 1e-5
