"""The pack's nodes called as ComfyUI calls them, in the in-process ComfyUI of
tests/comfyui_harness.py; ``pack`` is the fixture of tests/conftest.py.

* ``patch`` / ``search``: Sparse Attention Patch and PSA Mask Search on a model, with the
  defaults the tests share (float reference backend, every call eligible, small searches);
  ``summary`` is the run summary of the model's last run.
* ``live_dispatcher``: a patched model's dispatcher as inside a forward (for rule tests).
* ``models_folder``, ``table_in_models``, ``saved_and_loaded``: files in ComfyUI's models
  folders and what the nodes load from them.
* ``check_hunyuan_join_order``: which rows of HunyuanVideo's joint attention reach a kernel
  op, read off ComfyUI's own layers (``sample_seeing_hunyuan_layers``, ``value_rows``);
  ``hunyuan_non_video_tokens``: what ComfyUI put on the text side of that attention (HunyuanVideo
  1.5: vision, glyph and text tokens), from the same recording.
"""
from __future__ import annotations

import os

import torch

import comfyui_harness as H
from kernels.preset_file import save_preset


def patch(pack, model, **widgets):
    widgets.setdefault("backend", "reference")
    widgets.setdefault("min_tokens", 0)
    return pack.node_patch.SparseAttentionPatch.execute(model, **widgets).result[0]


def summary(pack, model):
    return pack.patching.run_summary(model)


def search(pack, model, name, **widgets):
    widgets.setdefault("tile", "1,2,2")
    widgets.setdefault("max_candidates", 24)
    widgets.setdefault("query_tiles", 0)
    widgets.setdefault("accumulate", False)
    return pack.node_search.PSAMaskSearch.execute(model, table_name=name, **widgets).result[0]


def live_dispatcher(pack, model):
    """The dispatcher with a forward in progress, as inside a real call (for rule tests)."""
    d = pack.patching.dispatcher_of(model)
    d.fwd.active, d.fwd.grid, d.fwd.block, d.fwd.role = True, (3, 4, 6), 1, "video"
    d.fwd.step, d.fwd.step_reason = 5, None
    return d


# ------------------------------------------------------------------------ files in models/

def models_folder(sub):
    """ComfyUI's first folder for the models subfolder ``sub``, created if missing."""
    import folder_paths
    path = folder_paths.get_folder_paths(sub)[0]
    os.makedirs(path, exist_ok=True)
    return path


def table_in_models(pack, name, grid=(3, 4, 6), tile=(1, 2, 2), heads=2, layers=2):
    """A small loss table of the tiny Wan model, saved where PSA Mask Select lists tables."""
    kernels = pack._kernels.kernels
    acc = kernels.PSASearchAccumulator(grid, tile, heads, candidates=kernels.candidate_space(grid, tile, max_candidates=8))
    g = torch.Generator().manual_seed(0)
    for layer in range(layers):
        q, k, v = (torch.randn(1, 72, heads, 8, generator=g) for _ in range(3))
        acc.add(q, k, v, layer=layer)
    t = acc.table()
    t.settings.update(family="wan", model_name="tiny", prompts=1,
                      fingerprint={"layers": layers, "heads": heads, "head_dim": 128, "hidden_size": 128 * heads})
    path = os.path.join(models_folder("psa_loss_tables"), f"{name}.safetensors")
    t.save(path)
    return path


def saved_and_loaded(pack, preset):
    """Write the preset into models/sparse_attention_presets and load it with the node."""
    save_preset(preset, os.path.join(models_folder(pack.presets.MODELS_SUBFOLDER), f"{preset.name}.json"))
    assert f"{preset.name}.json" in pack.presets.list_presets()
    node = pack.node_preset.LoadStripeMaskPreset
    return node.execute(f"{preset.name}.json").result[0]


# ------------------------------------------------------------------------ HunyuanVideo join order

def _hunyuan_truth_hooks(dm, seen):
    """Forward hooks on ComfyUI's own HunyuanVideo layers that record, in ComfyUI's order,
    what the joint attention is made of and what is made of its output: the double block's
    image/text value rows and the image/text rows of its output; the single block's input (whose
    video rows are the double block's image output), value rows and attention output."""
    double, single = dm.double_blocks[0], dm.single_blocks[0]
    hid = dm.hidden_size

    def keep(name, pick):  # a copy: the blocks add to their inputs in place
        return lambda module, args, out=None: seen.__setitem__(name, pick(args, out).clone())

    # the text side as the double block gets it, and the layers it is made of (the ByT5 and
    # vision embedders run only when the conditioning has glyph or image tokens)
    embedders = [module.register_forward_hook(keep(name, lambda a, o: o))
                 for name in ("txt_in", "byt5_in", "vision_in") if (module := getattr(dm, name, None)) is not None]
    txt_in_block = double.register_forward_pre_hook(
        lambda module, args, kwargs: seen.__setitem__("double_txt_in", kwargs["txt"].clone()), with_kwargs=True)
    return embedders + [txt_in_block,
        double.img_attn.qkv.register_forward_hook(keep("double_img_qkv", lambda a, o: o)),
        double.txt_attn.qkv.register_forward_hook(keep("double_txt_qkv", lambda a, o: o)),
        double.img_attn.proj.register_forward_pre_hook(keep("double_img_attn", lambda a, o: a[0])),
        double.txt_attn.proj.register_forward_pre_hook(keep("double_txt_attn", lambda a, o: a[0])),
        double.register_forward_hook(keep("double_img_out", lambda a, o: o[0])),
        single.register_forward_pre_hook(keep("single_in", lambda a, o: a[0])),
        single.linear1.register_forward_hook(keep("single_qkv", lambda a, o: o[..., :3 * hid])),
        single.linear2.register_forward_pre_hook(keep("single_attn", lambda a, o: a[0][..., :hid])),
    ]


def sample_seeing_hunyuan_layers(tiny, model):
    """One sampling step of ``model`` with ``_hunyuan_truth_hooks`` on the HunyuanVideo
    ``tiny``'s layers; returns what they recorded."""
    seen = {}
    hooks = _hunyuan_truth_hooks(tiny.patcher.model.diffusion_model, seen)
    try:
        H.sample(tiny, steps=1, model=model)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def hunyuan_non_video_tokens(tiny, seen) -> dict:
    """The text side of HunyuanVideo's joint attention, from ``sample_seeing_hunyuan_layers``'
    recording, checked against the layers it is made of: HunyuanVideo 1.5 joins [vision, glyph,
    text] (SigLIP through vision_in, ByT5 through byt5_in, Qwen through txt_in, each plus its
    cond_type_embedding row: text 0, glyph 1, vision 2). Returns the token count of each kind."""
    dm = tiny.patcher.model.diffusion_model
    kinds = [("vision", "vision_in", 2), ("glyph", "byt5_in", 1), ("text", "txt_in", 0)]
    parts, counts = [], {}
    for kind, layer, type_id in kinds:
        if layer not in seen:
            counts[kind] = 0
            continue
        rows = seen[layer]
        if dm.cond_type_embedding is not None:
            rows = rows + dm.cond_type_embedding.weight[type_id].to(rows.dtype)
        parts.append(rows)
        counts[kind] = rows.shape[1]
    torch.testing.assert_close(seen["double_txt_in"], torch.cat(parts, dim=1), rtol=0, atol=0)
    return counts


def spy_kernel_calls(pack, monkeypatch, op_name="sol_attention") -> list:
    """Record each call of the pack's kernel op ``op_name``: (its v, its ``grid``)."""
    calls = []
    real_op = getattr(pack.ops, op_name)

    def spy(q, k, v, **kw):
        calls.append((v, kw.get("grid")))
        return real_op(q, k, v, **kw)
    monkeypatch.setattr(pack.ops, op_name, spy)
    return calls


def value_rows(qkv, heads):
    """The value rows (B, L, H, D) of a fused q/k/v projection's output (B, L, 3·H·D)."""
    b, n, _ = qkv.shape
    return qkv.view(b, n, 3, heads, -1)[:, :, 2]


def check_hunyuan_join_order(pack, monkeypatch, tiny, op_name, model):
    """Sample ``model`` (a patch of the HunyuanVideo ``tiny``, one double and one single block)
    for one step, spying on the pack's kernel op ``op_name``, and check each kernel call: the
    video tokens first (they are the kernel's grid), the text after them, and the call's
    output handed back in ComfyUI's order. The order is read off the rows of ComfyUI's own
    image and text layers, not from the pack's idea of it: ComfyUI 0.3.75 joins HunyuanVideo's
    joint attention as [video, text], 0.33 as [text, video]. Returns the recording of ComfyUI's
    layers (for ``hunyuan_non_video_tokens``)."""
    kernel_calls = []
    real_op = getattr(pack.ops, op_name)

    def spy(q, k, v, **kw):
        result = real_op(q, k, v, **kw)
        kernel_calls.append((v, result[0] if isinstance(result, tuple) else result))
        return result
    monkeypatch.setattr(pack.ops, op_name, spy)
    seen = sample_seeing_hunyuan_layers(tiny, model)
    assert len(kernel_calls) == 2                       # the double block, then the single block
    (double_v, double_out), (single_v, single_out) = kernel_calls
    img_v, txt_v = (value_rows(seen[name], tiny.heads) for name in ("double_img_qkv", "double_txt_qkv"))
    n_video, n_text = img_v.shape[1], txt_v.shape[1]
    exact = dict(rtol=0, atol=0)
    torch.testing.assert_close(double_v[:, :n_video], img_v, **exact)
    torch.testing.assert_close(double_v[:, n_video:], txt_v, **exact)
    torch.testing.assert_close(seen["double_img_attn"], double_out[:, :n_video].flatten(2), **exact)
    torch.testing.assert_close(seen["double_txt_attn"], double_out[:, n_video:].flatten(2), **exact)

    x, img_out = seen["single_in"], seen["double_img_out"]
    start = 0 if torch.equal(x[:, :n_video], img_out) else n_text  # where this ComfyUI put the video
    torch.testing.assert_close(x[:, start:start + n_video], img_out, **exact)
    video_rows = slice(start, start + n_video)
    text_rows = slice(0, n_text) if start else slice(n_video, None)
    single_values = value_rows(seen["single_qkv"], tiny.heads)
    torch.testing.assert_close(single_v[:, :n_video], single_values[:, video_rows], **exact)
    torch.testing.assert_close(single_v[:, n_video:], single_values[:, text_rows], **exact)
    attn = seen["single_attn"]
    torch.testing.assert_close(attn[:, video_rows], single_out[:, :n_video].flatten(2), **exact)
    torch.testing.assert_close(attn[:, text_rows], single_out[:, n_video:].flatten(2), **exact)
    return seen
