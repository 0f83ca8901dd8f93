"""Guards against a patch that silently does nothing, and the 0.33 call details the dispatcher
honours, inside a real ComfyUI (CPU; the version of the matrix that runs).

* displaced: a node after the patch installs its own attention override (ModelAttentionBackend
  on 0.33, any Sage/Radial-style patch on both versions); the wrappers still run and warn once,
  in the log and in the run summary the Inspector shows, with the fix.
* no_sparse_calls: a sparse run without one sparse call although the video self-attention ran.
* low_precision_attention=False (0.33 passes it) runs dense; AttentionTensorContainer inputs
  (0.33's wrap_attn) reach the dispatcher as tensors; LTX guides' masked video self-attention
  (0.33) is counted and warned.
"""
from __future__ import annotations

import json
import logging

import pytest
import torch

import comfyui_harness as H
from pack_nodes import live_dispatcher, patch, summary

VERSION = H.comfyui_env.comfyui_version()
LOGGER = "sparse_video_attention"


@pytest.fixture(scope="module")
def wan(comfy):
    return H.build_wan21(0, num_layers=3)


@pytest.fixture(scope="module")
def wan_base(wan):
    return H.sample(wan, steps=3)


def warnings_logged(caplog, guard_text):
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == logging.WARNING
            and guard_text in r.getMessage()]


def other_attention_patch(model):
    """What a Sage or Radial attention node does: a clone whose transformer_options carry its
    own optimized_attention_override (here the default attention, unchanged)."""
    def sage_like_override(func, *args, **kwargs):
        return func(*args, **kwargs)
    return H.with_attention_override(model, sage_like_override)


def test_summary_names_the_comfyui_version(pack, wan):
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.0, dense_blocks="")
    H.sample(wan, steps=1, model=m)
    s = summary(pack, m)
    assert s["comfyui_version"] == VERSION and s["warnings"] == {}
    assert s["video_self_attention"] == {"modules_entered": 3, "calls_reached_override": 3,
                                         "modules_without_a_call": 0}
    info = pack.node_inspector.render(m)[1]
    assert info["comfyui_version"] == VERSION and "warnings" not in info


def test_attention_patch_after_ours_is_warned_once(pack, wan, wan_base, caplog):
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.0, dense_blocks="")
    late = other_attention_patch(m)
    d = pack.patching.dispatcher_of(late)
    assert d is not None and d is not pack.patching.dispatcher_of(m)   # the clone's own state
    with caplog.at_level(logging.INFO, logger=LOGGER):
        out = H.sample(wan, steps=3, model=late)
        H.sample(wan, steps=3, model=late)
    torch.testing.assert_close(out, wan_base)          # the other override ran every call
    s = summary(pack, late)
    assert s["sparse_calls"] == 0 and s["calls"] == 0 and s["forwards"] == 3
    assert "sage_like_override" in s["override_displaced_by"]
    assert set(s["warnings"]) == {"displaced", "no_sparse_calls"}
    for text in s["warnings"].values():
        assert "Fix: place the Sparse Attention Patch last, after ModelAttentionBackend / Sage / other " \
               "attention patches." in text
    assert "sage_like_override" in s["warnings"]["displaced"]
    assert s["video_self_attention"] == {"modules_entered": 9, "calls_reached_override": 0,
                                         "modules_without_a_call": 9}
    # once per patched model, although two runs of 3 steps saw it
    assert len(warnings_logged(caplog, "not the Sparse Attention Patch's")) == 1
    assert len(warnings_logged(caplog, "no sparse attention call")) == 1
    # the Inspector's summary carries them
    info = json.loads(pack.node_inspector.SparseAttentionInspector.execute(model=late).result[3])
    assert info["warnings"] == s["warnings"]


def wrapped_by_a_later_override(model, make_override):
    """A clone of ``model`` as a later node makes it: its override is ``make_override(inner)``,
    ``inner`` being the override it found on the clone. Returns (clone, inner)."""
    late = model.clone()
    late.model_options = dict(late.model_options)
    to = late.model_options["transformer_options"] = dict(late.model_options["transformer_options"])
    inner = to["optimized_attention_override"]
    to["optimized_attention_override"] = make_override(inner)
    return late, inner


def test_override_after_ours_that_hands_calls_on_is_no_displacement(pack, wan, caplog):
    """A later node whose override wraps the one it finds on its clone keeps the patch working:
    the wrapped one is the clone's own dispatcher, the one its wrappers run."""
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.0, dense_blocks="")
    seen = []

    def wrapping(inner):
        def wrapping_override(func, *args, **kwargs):
            seen.append(1)
            return inner(func, *args, **kwargs)
        return wrapping_override
    late, inner = wrapped_by_a_later_override(m, wrapping)
    assert inner is pack.patching.dispatcher_of(late) and inner is not pack.patching.dispatcher_of(m)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        H.sample(wan, steps=2, model=late)
    s = summary(pack, late)
    assert len(seen) == 2 * 3 * 2 and s["sparse_calls"] == 2 * 3
    assert "wrapping_override" in s["override_displaced_by"] and s["warnings"] == {}
    assert not warnings_logged(caplog, "Fix: place")


def test_a_clone_after_a_wrapping_override_keeps_the_patch(pack, wan, caplog):
    """Patch → a node that wraps the override it finds (as ComfyUI's Model Sparse Attention
    does; it hands on every call of a sequence under its min_tokens, so every call of this tiny
    model) → a node that clones the model (ModelSamplingSD3, a LoRA loader). The wrapper still
    holds the dispatcher it wrapped, while the clone's wrappers run a fresh one: the calls
    reach the live one, and run sparse."""
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.0, dense_blocks="")

    def core_like(inner):
        def block_sparse_override(func, *args, **kwargs):
            return inner(func, *args, **kwargs)
        return block_sparse_override
    late, wrapped = wrapped_by_a_later_override(m, core_like)
    cloned = late.clone()
    assert pack.patching.dispatcher_of(cloned) is not wrapped
    with caplog.at_level(logging.INFO, logger=LOGGER):
        H.sample(wan, steps=2, model=cloned)
    s = summary(pack, cloned)
    assert s["sparse_calls"] == 2 * 3 and s["warnings"] == {}, s
    assert not warnings_logged(caplog, "Fix:")


def test_override_after_ours_that_runs_some_calls_itself_is_warned(pack, wan, caplog):
    """Like ComfyUI's own Model Sparse Attention node (after 0.33): a later override that
    runs the calls it wants itself and hands the rest on. The patch is then only partly in
    charge; the summary and the log say so once, with how many modules ran without it."""
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.0, dense_blocks="")
    calls = []

    def picky(inner):
        def picky_override(func, *args, **kwargs):   # block 0 (its self and cross call) its own way
            calls.append(1)
            if len(calls) % 6 in (1, 2):
                return func(*args, **kwargs)
            return inner(func, *args, **kwargs)
        return picky_override
    late, _ = wrapped_by_a_later_override(m, picky)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        H.sample(wan, steps=2, model=late)
    s = summary(pack, late)
    assert s["sparse_calls"] == 2 * 2
    assert s["video_self_attention"] == {"modules_entered": 6, "calls_reached_override": 4,
                                         "modules_without_a_call": 2}
    assert set(s["warnings"]) == {"displaced_in_part"}
    text = s["warnings"]["displaced_in_part"]
    assert "picky_override" in text and "(1 of 3 ran without the patch)" in text, text  # the first forward
    assert text.endswith("Fix: " + pack.report.PLACE_LAST + ".")
    assert len(warnings_logged(caplog, "ran without the patch")) == 1


def test_comfyuis_own_sparse_node_gets_its_own_fix(pack):
    report = pack.report
    override = "make_attention_override.<locals>.override"
    # ComfyUI loads comfy_extras files by path: the module is the file's path less ".py"
    for module in ("comfy_extras.nodes_sparse_attention", "/opt/ComfyUI/comfy_extras/nodes_sparse_attention",
                   "C:\\ComfyUI\\comfy_extras\\nodes_sparse_attention"):
        assert report.displacement_fix(f"{module}.{override}") == report.ONE_SPARSE_NODE, module
    for other in ("comfy.model_patcher.set_model_optimized_attention", "sage_attention.override",
                  "comfy_extras.nodes_sparse_attention_like.override",
                  "/opt/ComfyUI/comfy_extras/nodes_sparse_attention_like.override",
                  "/opt/custom_nodes/my_comfy_extras/nodes_sparse_attention_v2.override"):
        assert report.displacement_fix(other) == report.PLACE_LAST


def test_attention_patch_before_ours_is_fine(pack, wan, caplog):
    calls = []

    def earlier(func, *args, **kwargs):
        calls.append(args[1].shape[1])
        return func(*args, **kwargs)
    m = patch(pack, H.with_attention_override(wan.patcher, earlier), beta=1.0, warmup=0.0, dense_blocks="")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        H.sample(wan, steps=2, model=m)
    s = summary(pack, m)
    assert s["warnings"] == {} and s["override_displaced_by"] is None
    assert s["sparse_calls"] == 2 * 3 and calls == [16] * (2 * 3)   # it still gets the cross-attention
    assert not warnings_logged(caplog, "Fix: place")


@pytest.mark.skipif(VERSION == "0.3.75", reason="ComfyUI 0.3.75 has no ModelAttentionBackend node")
def test_model_attention_backend_after_the_patch(pack, comfy, wan, caplog):
    node = comfy.nodes.NODE_CLASS_MAPPINGS["ModelAttentionBackend"]()
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.0, dense_blocks="")
    (late,) = node.patch(m, "pytorch attention")
    with caplog.at_level(logging.INFO, logger=LOGGER):
        H.sample(wan, steps=2, model=late)
    s = summary(pack, late)
    assert s["sparse_calls"] == 0 and "set_model_optimized_attention" in s["override_displaced_by"]
    assert set(s["warnings"]) == {"displaced", "no_sparse_calls"}
    assert len(warnings_logged(caplog, "not the Sparse Attention Patch's")) == 1
    # placed before the patch, it is the override the patch chains its dense calls to
    (early,) = node.patch(wan.patcher, "pytorch attention")
    m2 = patch(pack, early, beta=1.0, warmup=0.0, dense_blocks="")
    H.sample(wan, steps=2, model=m2)
    s2 = summary(pack, m2)
    assert s2["warnings"] == {} and s2["sparse_calls"] == 2 * 3
    assert s2["dense_calls"] == {"not_video_self_attention": 2 * 3}


def test_no_sparse_call_is_warned_with_the_reasons(pack, wan, caplog):
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.0, dense_blocks="", min_tokens=10_000)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        H.sample(wan, steps=2, model=m)
    s = summary(pack, m)
    assert set(s["warnings"]) == {"no_sparse_calls"}
    text = s["warnings"]["no_sparse_calls"]
    assert "all 6 video self-attention calls ran dense (min_tokens=6)" in text
    assert "Fix: see why in the run summary's dense_calls: lower min_tokens" in text
    assert len(warnings_logged(caplog, "no sparse attention call")) == 1
    # method dense asks for no sparse call: nothing to warn about
    m = patch(pack, wan.patcher, method="dense")
    H.sample(wan, steps=1, model=m)
    assert summary(pack, m)["warnings"] == {}


def test_low_precision_attention_false_runs_dense(pack, wan, comfy):
    """Through ComfyUI's own optimized_attention (wrap_attn hands the keyword to the override)."""
    import comfy.ldm.modules.attention as attention
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.0, dense_blocks="")
    d = live_dispatcher(pack, m)
    d.stats = pack.report.RunStats()
    topts = {"optimized_attention_override": d}
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 72, 256, generator=g) for _ in range(3))
    dense = attention.optimized_attention(q, k, v, 2)
    out = attention.optimized_attention(q, k, v, 2, transformer_options=topts, low_precision_attention=False)
    assert torch.equal(out, dense)
    assert d.stats.sparse == 0 and dict(d.stats.dense) == {"low_precision": 1}
    out = attention.optimized_attention(q, k, v, 2, transformer_options=topts, low_precision_attention=True)
    assert d.stats.sparse == 1 and not torch.equal(out, dense)


def test_callers_scale_reaches_the_kernels_and_gqa_runs_dense(pack, wan, comfy):
    """ComfyUI's attention functions take ``scale`` and ``enable_gqa`` keywords (0.33 honours
    both; no video model of the four families passes them today): a sparse call must use the
    caller's scale, and a grouped-query call, which the kernels cannot run, stays dense."""
    import comfy.ldm.modules.attention as attention
    m = patch(pack, wan.patcher, beta=float("-inf"), warmup=0.0, dense_blocks="")   # exact
    d = live_dispatcher(pack, m)
    d.stats = pack.report.RunStats()
    topts = {"optimized_attention_override": d}
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(1, 72, 256, generator=g) for _ in range(3))
    heads = [t.view(1, 72, 2, 128).transpose(1, 2) for t in (q, k, v)]
    for scale in (0.02, 0.3):
        want = torch.nn.functional.scaled_dot_product_attention(*heads, scale=scale)
        out = attention.optimized_attention(q, k, v, 2, transformer_options=topts, scale=scale)
        torch.testing.assert_close(out, want.transpose(1, 2).reshape(1, 72, 256), atol=1e-5, rtol=1e-5)
    assert d.stats.sparse == 2 and not d.stats.dense
    attention.optimized_attention(q, k, v, 2, transformer_options=topts, enable_gqa=True)
    assert d.stats.sparse == 2 and dict(d.stats.dense) == {"gqa": 1}
    for bad in (0.0, -1.0, float("nan"), float("inf")):
        assert d(attention.attention_basic, q, k, v, 2, scale=bad).shape == q.shape
    assert d.stats.sparse == 2 and dict(d.stats.dense) == {"gqa": 1, "scale": 4}


def test_calls_that_need_gradients_run_dense(pack, wan, comfy):
    """Decision (docs/HARDENING.md): the kernels have no backward pass, so a patched model that
    is trained runs dense attention, with gradients; sampling (no grad) is unchanged."""
    import comfy.ldm.modules.attention as attention
    d = live_dispatcher(pack, patch(pack, wan.patcher, warmup=0.0, dense_blocks=""))
    d.stats = pack.report.RunStats()
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 72, 256, generator=g) for _ in range(3))
    q.requires_grad_()
    out = d(attention.attention_basic, q, k, v, 2)
    torch.testing.assert_close(out, attention.attention_basic(q, k, v, 2))
    out.sum().backward()
    assert q.grad is not None and dict(d.stats.dense) == {"grad": 1} and d.stats.sparse == 0
    assert "no backward pass" in d.stats.notes["grad"]
    with torch.no_grad():
        d(attention.attention_basic, q, k, v, 2)
    assert d.stats.sparse == 1


@pytest.mark.skipif(VERSION == "0.3.75", reason="ComfyUI 0.3.75 has no AttentionTensorContainer")
def test_attention_tensor_containers_reach_the_dispatcher_as_tensors(pack, wan, comfy):
    import comfy.ldm.modules.attention as attention
    m = patch(pack, wan.patcher, beta=float("-inf"), warmup=0.0, dense_blocks="")
    d = live_dispatcher(pack, m)
    d.stats = pack.report.RunStats()
    assert not hasattr(d, "container_function")   # so ComfyUI takes the tensors out for us
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 72, 256, generator=g) for _ in range(3))
    dense = attention.optimized_attention(q, k, v, 2)
    boxes = [attention.AttentionTensorContainer(t) for t in (q, k, v)]
    out = attention.optimized_attention(*boxes, 2, transformer_options={"optimized_attention_override": d})
    assert d.stats.sparse == 1 and all(b.tensor is None for b in boxes)   # consumed once
    torch.testing.assert_close(out, dense, atol=1e-5, rtol=1e-5)          # beta -inf: exact
    # containers handed to the override directly are taken out before anything else
    boxes = [attention.AttentionTensorContainer(t) for t in (q, k, v)]
    out = d(attention.attention_basic, *boxes, 2, transformer_options={}, _inside_attn_wrapper=True)
    assert d.stats.sparse == 2 and all(b.tensor is None for b in boxes)
    torch.testing.assert_close(out, dense, atol=1e-5, rtol=1e-5)


@pytest.fixture(scope="module")
def ltxv_with_vae(comfy):
    """The tiny LTX-Video checkpoint (transformer + VAE) through ComfyUI's checkpoint loader."""
    import tiny_models
    import comfy.sd
    sd, metadata = tiny_models.ltxv_checkpoint(0)
    model, _, vae, _ = comfy.sd.load_state_dict_guess_config(sd, output_vae=True, output_clip=False,
                                                             metadata=metadata)
    return model, vae


def test_ltx_guide_masked_self_attention_is_counted_and_warned(pack, comfy, ltxv_with_vae, caplog):
    """LTXVAddGuide with strength 0.5 appends a guide frame; ComfyUI 0.33 then splits the video
    self-attention into query groups with additive masks (mask=..., low_precision_attention=
    False): those run dense, counted under "mask" and warned, not logged at INFO. 0.3.75 passes
    no mask for guides: there the whole self-attention, guide frame included, runs sparse."""
    nodes = comfy.nodes.NODE_CLASS_MAPPINGS
    import comfy.sample as comfy_sample
    model, vae = ltxv_with_vae
    latent = nodes["EmptyLTXVLatentVideo"].execute(width=192, height=128, length=17, batch_size=1)[0]
    g = torch.Generator().manual_seed(0)
    cond = [[torch.randn(1, 16, 4096, generator=g), {"attention_mask": torch.ones(1, 16, dtype=torch.long),
                                                      "frame_rate": 25}]]
    image = torch.rand(1, 128, 192, 3, generator=g)
    pos, neg, guided = nodes["LTXVAddGuide"].execute(cond, cond, vae, latent, image, 0, 0.5)[:3]
    assert guided["samples"].shape[2] == latent["samples"].shape[2] + 1     # the guide frame
    m = patch(pack, model, beta=1.0, warmup=0.0, dense_blocks="")
    noise = comfy_sample.prepare_noise(guided["samples"], 0)
    with caplog.at_level(logging.INFO, logger=LOGGER):
        comfy_sample.sample(m, noise, 2, 1.0, "euler", "simple", pos, neg, guided["samples"],
                            noise_mask=guided.get("noise_mask"), seed=0, disable_pbar=True)
    s = summary(pack, m)
    blocks = len(model.model.diffusion_model.transformer_blocks)
    masked = hasattr(model.model.diffusion_model, "_build_guide_self_attention_mask")
    assert masked == (VERSION != "0.3.75")
    if masked:
        # two query groups (noisy, guide) per block and step, none sparse
        assert s["sparse_calls"] == 0 and s["dense_calls"]["mask"] == 2 * blocks * 2
        assert "mask (1, 1, 1, 96) on 72 queries x 96 keys" in s["notes"]["mask"]
        assert [r.levelno for r in caplog.records if "dense because the video self-attention carries"
                in r.getMessage()] == [logging.WARNING]
        assert set(s["warnings"]) == {"no_sparse_calls"}
    else:
        assert s["sparse_calls"] == 2 * blocks and "mask" not in s["dense_calls"]
        assert s["grid"] == [4, 4, 6]                                        # 3 frames + the guide
