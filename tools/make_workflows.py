"""Write the example workflows in workflows/ (UI format, as the ComfyUI frontend saves them).

    python tools/make_workflows.py                       # starts ComfyUI (CPU) for /object_info
    python tools/make_workflows.py --object-info FILE    # or reads a saved /object_info
    python tools/make_workflows.py --only NAME ...       # these workflows only

Each workflow is written from the /object_info of the ComfyUI in ``WRITTEN_WITH`` (0.3.75,
the default ComfyUI, unless it lacks the workflow's nodes): the LTX-2.5 workflow needs LTXAV's
nodes, so it is written on 0.33.0:

    COMFYUI_PATH=$PWD/.cache/comfyui-src/ComfyUI-0.33.0 .venv-comfyui-0.33/bin/python \
        tools/make_workflows.py --only ltx2.5_t2v_720p_sol_attn.json

A workflow whose nodes the running ComfyUI lacks is skipped with a message.

Each node's ``widgets_values`` is laid out from the running ComfyUI's /object_info: one value
per widget input in ``input_order`` (required, then optional), plus the extra value the
frontend stores after an INT with ``control_after_generate`` ("fixed") and after a combo with
``image_upload`` ("image"). Inputs of other types become sockets. tests/comfyui/test_workflows.py
checks the files against /object_info and loads them in the real web UI.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "workflows"
if str(ROOT / "tools") not in sys.path:
    sys.path.insert(0, str(ROOT / "tools"))

import recommended_settings  # noqa: E402

WIDGET_TYPES = {"INT", "FLOAT", "STRING", "BOOLEAN", "COMBO"}
HF = "https://huggingface.co"
URLS = {
    "wan2.1_t2v_14B_fp8_e4m3fn.safetensors":
        f"{HF}/Comfy-Org/Wan_2.1_ComfyUI_repackaged/resolve/main/split_files/diffusion_models/wan2.1_t2v_14B_fp8_e4m3fn.safetensors",
    "umt5_xxl_fp8_e4m3fn_scaled.safetensors":
        f"{HF}/Comfy-Org/Wan_2.1_ComfyUI_repackaged/resolve/main/split_files/text_encoders/umt5_xxl_fp8_e4m3fn_scaled.safetensors",
    "wan_2.1_vae.safetensors":
        f"{HF}/Comfy-Org/Wan_2.1_ComfyUI_repackaged/resolve/main/split_files/vae/wan_2.1_vae.safetensors",
    "wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors":
        f"{HF}/Comfy-Org/Wan_2.2_ComfyUI_Repackaged/resolve/main/split_files/diffusion_models/wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors",
    "wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors":
        f"{HF}/Comfy-Org/Wan_2.2_ComfyUI_Repackaged/resolve/main/split_files/diffusion_models/wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors",
    "hunyuan_video_t2v_720p_bf16.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_repackaged/resolve/main/split_files/diffusion_models/hunyuan_video_t2v_720p_bf16.safetensors",
    "clip_l.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_repackaged/resolve/main/split_files/text_encoders/clip_l.safetensors",
    "llava_llama3_fp8_scaled.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_repackaged/resolve/main/split_files/text_encoders/llava_llama3_fp8_scaled.safetensors",
    "hunyuan_video_vae_bf16.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_repackaged/resolve/main/split_files/vae/hunyuan_video_vae_bf16.safetensors",
    "ltx-video-2b-v0.9.5.safetensors":
        f"{HF}/Lightricks/LTX-Video/resolve/main/ltx-video-2b-v0.9.5.safetensors",
    "t5xxl_fp16.safetensors":
        f"{HF}/comfyanonymous/flux_text_encoders/resolve/main/t5xxl_fp16.safetensors",
    "wan2.2_ti2v_5B_fp16.safetensors":
        f"{HF}/Comfy-Org/Wan_2.2_ComfyUI_Repackaged/resolve/main/split_files/diffusion_models/wan2.2_ti2v_5B_fp16.safetensors",
    "wan2.2_vae.safetensors":
        f"{HF}/Comfy-Org/Wan_2.2_ComfyUI_Repackaged/resolve/main/split_files/vae/wan2.2_vae.safetensors",
    "hunyuanvideo1.5_720p_t2v_fp16.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_1.5_repackaged/resolve/main/split_files/diffusion_models/hunyuanvideo1.5_720p_t2v_fp16.safetensors",
    "qwen_2.5_vl_7b_fp8_scaled.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_1.5_repackaged/resolve/main/split_files/text_encoders/qwen_2.5_vl_7b_fp8_scaled.safetensors",
    "byt5_small_glyphxl_fp16.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_1.5_repackaged/resolve/main/split_files/text_encoders/byt5_small_glyphxl_fp16.safetensors",
    "hunyuanvideo15_vae_fp16.safetensors":
        f"{HF}/Comfy-Org/HunyuanVideo_1.5_repackaged/resolve/main/split_files/vae/hunyuanvideo15_vae_fp16.safetensors",
    "ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors":
        f"{HF}/Lightricks/LTX-2.5/resolve/main/diffusion_models/ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors",
    "ltx-2.5-video-vae-bf16.safetensors": f"{HF}/Lightricks/LTX-2.5/resolve/main/vae/ltx-2.5-video-vae-bf16.safetensors",
    "ltx-2.5-audio-vae-bf16.safetensors": f"{HF}/Lightricks/LTX-2.5/resolve/main/vae/ltx-2.5-audio-vae-bf16.safetensors",
    "gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors":
        f"{HF}/Lightricks/LTX-2.5/resolve/main/text_encoders/gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors",
}
MODEL_DIRS = {"UNETLoader": "diffusion_models", "CLIPLoader": "text_encoders", "DualCLIPLoader": "text_encoders",
              "VAELoader": "vae", "CheckpointLoaderSimple": "checkpoints"}


def input_type(spec) -> str:
    """An input's type; a combo's options list is "COMBO", and an input of several types (ComfyUI
    0.33's MultiType, e.g. "FLOAT,INT") is the type of the widget the frontend gives it."""
    t = spec[0]
    if isinstance(t, list):
        return "COMBO"
    opts = spec[1] if len(spec) > 1 and isinstance(spec[1], dict) else {}
    return opts.get("widgetType", t)


# ComfyUI 0.33's DynamicCombo (SaveVideo's format and codec): a combo whose chosen option brings
# inputs of its own, shown right after it and named "<combo>.<input>" by the frontend.
DYNAMIC_COMBO = "COMFY_DYNAMICCOMBO_V3"


def _entries(inputs: dict, order: dict | None = None):
    """(name, type, options, is_widget) of an input dict ({"required": ..., "optional": ...}) in
    the order the frontend shows them; an input is a widget when its type has one and it is
    not forced to a socket."""
    specs = {**inputs.get("required", {}), **inputs.get("optional", {})}
    names = list(order.get("required", [])) + list(order.get("optional", [])) if order else list(specs)
    for name in names:
        s = specs[name]
        t = input_type(s)
        opts = s[1] if len(s) > 1 and isinstance(s[1], dict) else {}
        yield name, t, opts, t in WIDGET_TYPES | {DYNAMIC_COMBO} and not opts.get("forceInput")


def ordered_inputs(info: dict, node_type: str):
    """(name, type, options, is_widget) of every input of a node in the order the frontend shows them."""
    spec = info[node_type]
    yield from _entries(spec["input"], spec.get("input_order"))


def widget_specs(info: dict, node_type: str, values: list | None = None) -> list[tuple[str, str, dict]]:
    """[(name, kind, options)] in the order the frontend stores widgets_values; kind is the input
    type ("COMBO" for a dynamic combo too, its options then the option keys), or "control" /
    "upload" for the extra values the frontend adds. A dynamic combo is followed by the widgets
    of the option it holds in ``values`` (a node's widgets_values), else of its default."""
    out = []
    values = list(values or [])

    def walk(entries, prefix):
        for name, t, opts, is_widget in entries:
            if not is_widget:
                continue
            full = prefix + name
            if t == DYNAMIC_COMBO:
                keys = [o["key"] for o in opts.get("options", [])]
                held = values[len(out)] if len(out) < len(values) else None
                chosen = held if held in keys else opts.get("default", keys[0] if keys else None)
                out.append((full, "COMBO", {**opts, "options": keys}))
                option = next((o for o in opts.get("options", []) if o["key"] == chosen), {})
                walk(_entries(option.get("inputs", {})), full + ".")
                continue
            out.append((full, t, opts))
            if opts.get("control_after_generate"):
                out.append((full + ":control", "control", {}))
            if opts.get("image_upload"):
                out.append((full + ":upload", "upload", {}))

    walk(ordered_inputs(info, node_type), "")
    return out


def widget_layout(info: dict, node_type: str, values: list | None = None) -> list[tuple[str, str]]:
    """[(name, kind)] of ``widget_specs``."""
    return [(name, kind) for name, kind, _ in widget_specs(info, node_type, values)]


def socket_inputs(info: dict, node_type: str) -> list[tuple[str, str]]:
    return [(name, t) for name, t, _, is_widget in ordered_inputs(info, node_type) if not is_widget]


def widget_default(info: dict, node_type: str, name: str, values: list | None = None):
    """The value the frontend gives a new widget: its default, else a combo's first option
    (``values``: the node's widgets_values, which choose the inputs of a dynamic combo)."""
    opts = {n: o for n, _, o in widget_specs(info, node_type, values)}[name]
    if "default" in opts:
        return opts["default"]
    spec = {**info[node_type]["input"].get("required", {}), **info[node_type]["input"].get("optional", {})}.get(name)
    options = spec[0] if spec and isinstance(spec[0], list) else opts.get("options", [])
    return options[0] if options else None


def patch_widgets(info: dict, workflow: str) -> dict:
    """The Sparse Attention Patch widgets of a shipped workflow: the node's defaults, with the
    method and settings of the workflow's row in tools/recommended_settings.py."""
    widgets = {name: widget_default(info, "SparseAttentionPatch", name)
               for name, kind in widget_layout(info, "SparseAttentionPatch") if kind not in ("control", "upload")}
    widgets.update(recommended_settings.for_workflow(workflow).workflow_widgets())
    return widgets


class MissingNode(KeyError):
    """A node type the running ComfyUI does not have."""


class Graph:
    def __init__(self, info: dict):
        self.info = info
        self.nodes: list[dict] = []
        self.links: list[list] = []
        self.groups: list[dict] = []

    def node(self, node_type: str, pos, widgets: dict | None = None, size=(320, 130), title=None,
             color=None) -> dict:
        widgets = dict(widgets or {})
        nid = len(self.nodes) + 1
        if node_type not in ("Note", "MarkdownNote") and node_type not in self.info:
            raise MissingNode(node_type)
        if node_type in ("Note", "MarkdownNote"):
            n = {"id": nid, "type": node_type, "pos": list(pos), "size": list(size), "flags": {}, "order": 0,
                 "mode": 0, "inputs": [], "outputs": [], "properties": {}, "widgets_values": [widgets.pop("text")],
                 "color": "#432", "bgcolor": "#653"}
            if title:
                n["title"] = title
            self.nodes.append(n)
            return n
        values = []
        for name, kind in widget_layout(self.info, node_type):
            if kind == "control":
                values.append(widgets.pop(name, "fixed"))
            elif kind == "upload":
                values.append("image")
            else:
                if name not in widgets:
                    raise KeyError(f"{node_type}: no value given for widget {name!r}")
                values.append(widgets.pop(name))
        if widgets:
            raise KeyError(f"{node_type}: unknown widgets {sorted(widgets)}")
        outputs = self.info[node_type]["output"]
        out_names = self.info[node_type].get("output_name", outputs)
        n = {"id": nid, "type": node_type, "pos": list(pos), "size": list(size), "flags": {}, "order": 0, "mode": 0,
             "inputs": [{"name": name, "type": t, "link": None} for name, t in socket_inputs(self.info, node_type)],
             "outputs": [{"name": out_names[i], "type": t, "slot_index": i, "links": []} for i, t in enumerate(outputs)],
             "properties": {"Node name for S&R": node_type}, "widgets_values": values}
        if node_type in MODEL_DIRS:
            files = [v for v in values if isinstance(v, str) and v in URLS]
            n["properties"]["models"] = [{"name": f, "url": URLS[f] + "?download=true",
                                          "directory": MODEL_DIRS[node_type]} for f in files]
        if title:
            n["title"] = title
        if color:
            n["color"], n["bgcolor"] = color
        self.nodes.append(n)
        return n

    def link(self, src: dict, out_slot: int, dst: dict, in_name: str):
        lid = len(self.links) + 1
        slot = next(i for i, inp in enumerate(dst["inputs"]) if inp["name"] == in_name)
        t = src["outputs"][out_slot]["type"]
        self.links.append([lid, src["id"], out_slot, dst["id"], slot, t])
        src["outputs"][out_slot]["links"].append(lid)
        dst["inputs"][slot]["link"] = lid

    def group(self, title: str, bounding, color="#3f789e"):
        self.groups.append({"id": len(self.groups) + 1, "title": title, "bounding": list(bounding), "color": color,
                            "font_size": 24, "flags": {}})

    def _order(self):
        deps = {n["id"]: set() for n in self.nodes}
        for _, src, _, dst, _, _ in self.links:
            deps[dst].add(src)
        done, order = set(), []
        while len(order) < len(self.nodes):
            for n in self.nodes:
                if n["id"] not in done and deps[n["id"]] <= done:
                    done.add(n["id"])
                    order.append(n["id"])
        for i, nid in enumerate(order):
            next(n for n in self.nodes if n["id"] == nid)["order"] = i
        # unused optional sockets are kept with link null, as the frontend saves them

    def to_json(self) -> dict:
        self._order()
        return {"last_node_id": len(self.nodes), "last_link_id": len(self.links), "nodes": self.nodes,
                "links": self.links, "groups": self.groups, "config": {},
                "extra": {"ds": {"scale": 0.6, "offset": [40, 60]}}, "version": 0.4}


PATCH_COLOR = ("#233", "#355")

NEGATIVE_WAN = ("blurry, low quality, static frame, overexposed, jpeg artifacts, deformed hands, "
                "extra fingers, watermark, subtitles")

def settings_line(workflow: str) -> str:
    """The note's line on the patch settings: the README's recommendation for this workflow."""
    row = recommended_settings.for_workflow(workflow)
    line = f"method {row.method}: {row.settings_text(code='')} (README, 'Recommended settings')"
    ranges = [f"{k} {v[0]}" for k, v in row.settings.items() if isinstance(v, tuple)]
    if ranges:
        line += f"; set here: {', '.join(ranges)}, the start of the range: compare a few frames with method dense " \
                "before going higher"
    if "target_sparsity" in row.settings:
        line += "; beta is not used while target_sparsity > 0 (beta = Φ⁻¹(target_sparsity))"
    return line


WARMUP_AND_DENSE_BLOCKS = ("warmup is the fraction of the first steps that stay dense; dense_blocks lists the "
                           "transformer blocks that stay dense (0 = the first)")


def note_text(model: str, method: str, workflow: str, lines: list[str]) -> str:
    body = "\n".join(f"- {line}" for line in [settings_line(workflow), *lines])
    return (f"Sparse attention for {model} ({method})\n\n"
            f"Recommended settings:\n{body}\n"
            "- the patch can sit anywhere between the model loader and the sampler: model nodes after it "
            "(ModelSamplingSD3, LoRA loaders) keep it\n\n"
            "Speed: the kernels' measured speed-ups over cuDNN attention (H200) are in BENCHMARKS.md of the "
            "sparse-video-attention pack; nothing has been measured on a full video of this model yet, so compare "
            "with the patch node bypassed (Ctrl+B) on your own GPU.\n\n"
            "backend 'auto' runs the Triton kernels on CUDA and plain attention elsewhere. The console logs one "
            "line per sampling run: attention calls sparse/dense and the achieved density.")


WAN_SOL_WORKFLOW = "wan2.1_t2v_14B_720p_sol_attn.json"
WAN_PSA_WORKFLOW = "wan2.1_t2v_14B_720p_psa.json"
WAN_PRESET = "wan2.1_14b_720p_81f.json"


def wan21_t2v(info, method: str) -> dict:
    """Wan 2.1 T2V 14B at 720p, with Sol-Attn (method sol_attn) or PSA and the shipped preset."""
    psa = method == "psa"
    workflow = WAN_PSA_WORKFLOW if psa else WAN_SOL_WORKFLOW
    g = Graph(info)
    unet = g.node("UNETLoader", (0, 0), {"unet_name": "wan2.1_t2v_14B_fp8_e4m3fn.safetensors", "weight_dtype": "default"}, (380, 90))
    clip = g.node("CLIPLoader", (0, 140), {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan", "device": "default"}, (380, 110))
    vae = g.node("VAELoader", (0, 300), {"vae_name": "wan_2.1_vae.safetensors"}, (380, 60))
    if psa:
        preset = g.node("LoadStripeMaskPreset", (440, -40), {"preset_name": WAN_PRESET}, (340, 60), color=PATCH_COLOR)
    patch = g.node("SparseAttentionPatch", (440, 40 if psa else 0), patch_widgets(info, workflow), (340, 320), color=PATCH_COLOR)
    shift = g.node("ModelSamplingSD3", (440, 400 if psa else 360), {"shift": 8.0}, (340, 60))
    pos = g.node("CLIPTextEncode", (820, 0), {"text": "A red fox trotting through fresh snow between pine trees at dawn, "
                                              "low tracking shot, soft golden light, breath visible in the cold air"},
                 (420, 160), title="Positive prompt")
    neg = g.node("CLIPTextEncode", (820, 200), {"text": NEGATIVE_WAN}, (420, 130), title="Negative prompt")
    latent = g.node("EmptyHunyuanLatentVideo", (820, 370), {"width": 1280, "height": 720, "length": 81, "batch_size": 1}, (320, 130))
    ks = g.node("KSampler", (1280, 0), {"seed": 20251129, "seed:control": "fixed", "steps": 30, "cfg": 5.0,
                                        "sampler_name": "uni_pc", "scheduler": "simple", "denoise": 1.0}, (320, 270))
    dec = g.node("VAEDecode", (1280, 310), {}, (220, 50))
    vid = g.node("CreateVideo", (1280, 400), {"fps": 16.0}, (220, 80))
    save = g.node("SaveVideo", (1640, 0), {"filename_prefix": f"video/wan21_t2v_{'psa' if psa else 'sparse'}", "format": "auto", "codec": "auto"}, (420, 420))
    insp = g.node("SparseAttentionInspector", (1640, 460), {"mask_layer": 0}, (420, 520), color=PATCH_COLOR)
    method_lines = [
        f"preset {WAN_PRESET} from 'Load Stripe Mask Preset': made for this resolution and length (token grid "
        "21 x 45 x 80); another size needs another preset (or preset_grid rescale, approximate)",
        "the other widgets (beta, target_sparsity, estimator, sol_tile) are Sol-Attn settings and are ignored by psa",
    ] if psa else [
        "min_tokens 4096: short sequences stay dense (720p x 81 frames is 75,600 tokens)",
        "sol_tile auto: each 64-token block is a 3D tile of the latent grid (1,8,8 at 720p); off = row-major blocks, "
        "faster at the same sparsity, less accurate (BENCHMARKS.md)",
    ]
    g.node("Note", (0, 400), {"text": note_text("Wan 2.1 T2V 14B, 1280x720, 81 frames",
                                                "PSA with a stripe-mask preset" if psa else "Sol-Attn", workflow, [
        WARMUP_AND_DENSE_BLOCKS,
        *method_lines,
        "sampler as Wan recommends for 14B T2V: 30 steps, cfg 5, shift 8",
        "Sparse Attention Inspector (after the sampler): achieved density per block x step and per head of "
        "the last run, grey = dense" + (", and the preset's per-head masks" if psa else "")
        + "; its summary output is the same as JSON"])}, (380, 360), title="Read me")
    g.link(unet, 0, shift, "model")
    g.link(shift, 0, patch, "model")
    if psa:
        g.link(preset, 0, patch, "preset")
    g.link(patch, 0, ks, "model")
    g.link(clip, 0, pos, "clip")
    g.link(clip, 0, neg, "clip")
    g.link(pos, 0, ks, "positive")
    g.link(neg, 0, ks, "negative")
    g.link(latent, 0, ks, "latent_image")
    g.link(ks, 0, dec, "samples")
    g.link(vae, 0, dec, "vae")
    g.link(dec, 0, vid, "images")
    g.link(vid, 0, save, "video")
    g.link(patch, 0, insp, "model")
    g.link(ks, 0, insp, "samples")
    g.group("Models", (-20, -60, 420, 440))
    g.group("Sparse attention" + (" (PSA)" if psa else ""), (420, -100, 380, 580) if psa else (420, -60, 380, 500),
            color="#3f8f6e")
    return g.to_json()


WAN22_WORKFLOW = "wan2.2_i2v_A14B_two_stage_sol_attn.json"


def wan22_i2v(info) -> dict:
    g = Graph(info)
    hi = g.node("UNETLoader", (0, 0), {"unet_name": "wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors", "weight_dtype": "default"}, (400, 90), title="High-noise model")
    lo = g.node("UNETLoader", (0, 130), {"unet_name": "wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors", "weight_dtype": "default"}, (400, 90), title="Low-noise model")
    clip = g.node("CLIPLoader", (0, 260), {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan", "device": "default"}, (400, 110))
    vae = g.node("VAELoader", (0, 410), {"vae_name": "wan_2.1_vae.safetensors"}, (400, 60))
    img = g.node("LoadImage", (0, 510), {"image": "sparse_attention_i2v_start.png"}, (400, 360), title="Start frame")
    p_hi = g.node("SparseAttentionPatch", (460, 0), patch_widgets(info, WAN22_WORKFLOW), (340, 320), title="Sparse Attention Patch (high noise)", color=PATCH_COLOR)
    p_lo = g.node("SparseAttentionPatch", (460, 360), patch_widgets(info, WAN22_WORKFLOW), (340, 320), title="Sparse Attention Patch (low noise)", color=PATCH_COLOR)
    s_hi = g.node("ModelSamplingSD3", (460, 720), {"shift": 8.0}, (340, 60))
    s_lo = g.node("ModelSamplingSD3", (460, 820), {"shift": 8.0}, (340, 60))
    pos = g.node("CLIPTextEncode", (840, 0), {"text": "The lighthouse keeper turns toward the sea as waves break on the rocks below, "
                                              "the camera slowly pushes in, wind moves his coat"}, (420, 160), title="Positive prompt")
    neg = g.node("CLIPTextEncode", (840, 200), {"text": NEGATIVE_WAN}, (420, 130), title="Negative prompt")
    i2v = g.node("WanImageToVideo", (840, 370), {"width": 1280, "height": 720, "length": 81, "batch_size": 1}, (340, 210))
    steps, warmup = 20, patch_widgets(info, WAN22_WORKFLOW)["warmup"]
    common = {"steps": steps, "cfg": 3.5, "sampler_name": "euler", "scheduler": "simple"}
    k1 = g.node("KSamplerAdvanced", (1300, 0), {"add_noise": "enable", "noise_seed": 20251129, "noise_seed:control": "fixed",
                                                **common, "start_at_step": 0, "end_at_step": 10,
                                                "return_with_leftover_noise": "enable"}, (320, 340), title="Stage 1: high noise (steps 0-10)")
    k2 = g.node("KSamplerAdvanced", (1660, 0), {"add_noise": "disable", "noise_seed": 0, "noise_seed:control": "fixed",
                                                **common, "start_at_step": 10, "end_at_step": 10000,
                                                "return_with_leftover_noise": "disable"}, (320, 340), title="Stage 2: low noise (steps 10-20)")
    dec = g.node("VAEDecode", (1660, 380), {}, (220, 50))
    vid = g.node("CreateVideo", (1660, 470), {"fps": 16.0}, (220, 80))
    save = g.node("SaveVideo", (2020, 0), {"filename_prefix": "video/wan22_i2v_sparse", "format": "auto", "codec": "auto"}, (420, 420))
    g.node("Note", (840, 620), {"text": note_text("Wan 2.2 I2V A14B, 1280x720, 81 frames, two stages", "Sol-Attn on both models", WAN22_WORKFLOW, [
        "one Sparse Attention Patch per model; both use the same settings",
        f"warmup {warmup} counts steps of the whole {steps}-step schedule, across both KSamplerAdvanced nodes: "
        f"steps 0-{round(warmup * steps) - 1} of the high-noise stage stay dense, every later step is sparse",
        "dense_blocks lists the transformer blocks that stay dense (0 = the first); min_tokens: shorter "
        "sequences stay dense",
        "put your start image in ComfyUI/input and pick it in 'Start frame'",
        "sampler: 20 steps, cfg 3.5, shift 8, switch models at step 10"])}, (420, 380), title="Read me")
    g.link(hi, 0, s_hi, "model")
    g.link(lo, 0, s_lo, "model")
    g.link(s_hi, 0, p_hi, "model")
    g.link(s_lo, 0, p_lo, "model")
    g.link(p_hi, 0, k1, "model")
    g.link(p_lo, 0, k2, "model")
    g.link(clip, 0, pos, "clip")
    g.link(clip, 0, neg, "clip")
    g.link(pos, 0, i2v, "positive")
    g.link(neg, 0, i2v, "negative")
    g.link(vae, 0, i2v, "vae")
    g.link(img, 0, i2v, "start_image")
    g.link(i2v, 0, k1, "positive")
    g.link(i2v, 1, k1, "negative")
    g.link(i2v, 2, k1, "latent_image")
    g.link(i2v, 0, k2, "positive")
    g.link(i2v, 1, k2, "negative")
    g.link(k1, 0, k2, "latent_image")
    g.link(k2, 0, dec, "samples")
    g.link(vae, 0, dec, "vae")
    g.link(dec, 0, vid, "images")
    g.link(vid, 0, save, "video")
    g.group("Models", (-20, -60, 440, 950))
    g.group("Sparse attention", (440, -60, 380, 960), color="#3f8f6e")
    g.group("Two-stage sampling", (1280, -60, 720, 420), color="#a1309b")
    return g.to_json()


HUNYUAN_PRESET = "hunyuan_video_720p_129f.json"
HUNYUAN_WORKFLOW = "hunyuan_video_t2v_720p_psa.json"


def hunyuan_t2v(info) -> dict:
    g = Graph(info)
    unet = g.node("UNETLoader", (0, 0), {"unet_name": "hunyuan_video_t2v_720p_bf16.safetensors", "weight_dtype": "default"}, (400, 90))
    clip = g.node("DualCLIPLoader", (0, 130), {"clip_name1": "clip_l.safetensors", "clip_name2": "llava_llama3_fp8_scaled.safetensors",
                                                "type": "hunyuan_video", "device": "default"}, (400, 130))
    vae = g.node("VAELoader", (0, 300), {"vae_name": "hunyuan_video_vae_bf16.safetensors"}, (400, 60))
    preset = g.node("LoadStripeMaskPreset", (460, 0), {"preset_name": HUNYUAN_PRESET}, (340, 60), color=PATCH_COLOR)
    patch = g.node("SparseAttentionPatch", (460, 100), patch_widgets(info, HUNYUAN_WORKFLOW), (340, 340), color=PATCH_COLOR)
    shift = g.node("ModelSamplingSD3", (460, 480), {"shift": 7.0}, (340, 60))
    pos = g.node("CLIPTextEncode", (840, 0), {"text": "A paper boat drifts down a rain-filled street gutter, close-up, reflections "
                                              "of neon signs ripple on the water, shallow depth of field"}, (420, 160), title="Prompt")
    neg = g.node("CLIPTextEncode", (840, 200), {"text": ""}, (420, 100), title="Negative (unused at cfg 1)")
    guid = g.node("FluxGuidance", (840, 340), {"guidance": 6.0}, (320, 60))
    latent = g.node("EmptyHunyuanLatentVideo", (840, 440), {"width": 1280, "height": 720, "length": 129, "batch_size": 1}, (320, 130))
    ks = g.node("KSampler", (1300, 0), {"seed": 20251129, "seed:control": "fixed", "steps": 30, "cfg": 1.0,
                                        "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}, (320, 270))
    dec = g.node("VAEDecodeTiled", (1300, 310), {"tile_size": 256, "overlap": 64, "temporal_size": 64, "temporal_overlap": 8}, (320, 150))
    vid = g.node("CreateVideo", (1300, 500), {"fps": 24.0}, (220, 80))
    save = g.node("SaveVideo", (1660, 0), {"filename_prefix": "video/hunyuan_t2v_sparse", "format": "auto", "codec": "auto"}, (420, 420))
    g.node("Note", (0, 400), {"text": note_text("HunyuanVideo T2V, 1280x720, 129 frames", "PSA with a stripe-mask preset", HUNYUAN_WORKFLOW, [
        f"preset {HUNYUAN_PRESET} from 'Load Stripe Mask Preset': it was made for this "
        "resolution and length (token grid 33 x 45 x 80); another size needs another preset",
        WARMUP_AND_DENSE_BLOCKS + "; text tokens always attend densely",
        "the other widgets (beta, target_sparsity, estimator, sol_tile) are Sol-Attn settings and are ignored by psa",
        "sampler: 30 steps, cfg 1 with FluxGuidance 6 (HunyuanVideo is guidance-distilled), shift 7",
        "decode tiled: the 129-frame 720p decode does not fit most GPUs untiled"])}, (400, 360), title="Read me")
    g.link(unet, 0, shift, "model")
    g.link(shift, 0, patch, "model")
    g.link(preset, 0, patch, "preset")
    g.link(patch, 0, ks, "model")
    g.link(clip, 0, pos, "clip")
    g.link(clip, 0, neg, "clip")
    g.link(pos, 0, guid, "conditioning")
    g.link(guid, 0, ks, "positive")
    g.link(neg, 0, ks, "negative")
    g.link(latent, 0, ks, "latent_image")
    g.link(ks, 0, dec, "samples")
    g.link(vae, 0, dec, "vae")
    g.link(dec, 0, vid, "images")
    g.link(vid, 0, save, "video")
    g.group("Models", (-20, -60, 440, 440))
    g.group("Sparse attention (PSA)", (440, -60, 380, 620), color="#3f8f6e")
    return g.to_json()


HUNYUAN15_PRESET = "hunyuan_video1.5_720p_121f.json"
HUNYUAN15_WORKFLOW = "hunyuan_video1.5_t2v_720p_psa.json"


def hunyuan15_t2v(info) -> dict:
    """HunyuanVideo 1.5 T2V at 720p (the 720p stage of ComfyUI's own template), PSA with the
    shipped preset."""
    g = Graph(info)
    unet = g.node("UNETLoader", (0, 0), {"unet_name": "hunyuanvideo1.5_720p_t2v_fp16.safetensors", "weight_dtype": "default"}, (400, 90))
    clip = g.node("DualCLIPLoader", (0, 130), {"clip_name1": "qwen_2.5_vl_7b_fp8_scaled.safetensors",
                                                "clip_name2": "byt5_small_glyphxl_fp16.safetensors",
                                                "type": "hunyuan_video_15", "device": "default"}, (400, 130))
    vae = g.node("VAELoader", (0, 300), {"vae_name": "hunyuanvideo15_vae_fp16.safetensors"}, (400, 60))
    preset = g.node("LoadStripeMaskPreset", (460, 0), {"preset_name": HUNYUAN15_PRESET}, (340, 60), color=PATCH_COLOR)
    patch = g.node("SparseAttentionPatch", (460, 100), patch_widgets(info, HUNYUAN15_WORKFLOW), (340, 340), color=PATCH_COLOR)
    shift = g.node("ModelSamplingSD3", (460, 480), {"shift": 7.0}, (340, 60))
    pos = g.node("CLIPTextEncode", (840, 0), {"text": "A paper lantern drifts up from a night market into the dark sky, the camera "
                                              "follows it past strings of lights and steaming food stalls, warm glow, gentle "
                                              "breeze, cinematic"}, (420, 160), title="Positive prompt")
    neg = g.node("CLIPTextEncode", (840, 200), {"text": ""}, (420, 100), title="Negative prompt")
    latent = g.node("EmptyHunyuanVideo15Latent", (840, 340), {"width": 1280, "height": 720, "length": 121, "batch_size": 1}, (320, 130))
    ks = g.node("KSampler", (1300, 0), {"seed": 20251129, "seed:control": "fixed", "steps": 20, "cfg": 6.0,
                                        "sampler_name": "euler", "scheduler": "simple", "denoise": 1.0}, (320, 270))
    dec = g.node("VAEDecodeTiled", (1300, 310), {"tile_size": 512, "overlap": 64, "temporal_size": 64, "temporal_overlap": 8}, (320, 150))
    vid = g.node("CreateVideo", (1300, 500), {"fps": 24.0}, (220, 80))
    save = g.node("SaveVideo", (1660, 0), {"filename_prefix": "video/hunyuan_video15_t2v_sparse", "format": "auto", "codec": "auto"}, (420, 420))
    g.node("Note", (0, 400), {"text": note_text("HunyuanVideo 1.5 T2V, 1280x720, 121 frames", "PSA with a stripe-mask preset", HUNYUAN15_WORKFLOW, [
        f"preset {HUNYUAN15_PRESET} from 'Load Stripe Mask Preset': made for this resolution and length (token grid "
        "31 x 45 x 80); another size needs another preset (or preset_grid rescale, approximate)",
        WARMUP_AND_DENSE_BLOCKS + "; the text tokens (and with image-to-video the SigLIP vision tokens) always "
        "attend densely",
        "image-to-video (hunyuanvideo1.5_720p_i2v_fp16.safetensors with HunyuanVideo15ImageToVideo and "
        "CLIPVisionEncode) takes the same patch and preset",
        "the other widgets (beta, target_sparsity, estimator, sol_tile) are Sol-Attn settings and are ignored by psa",
        "sampler as ComfyUI's HunyuanVideo 1.5 template: 20 steps, cfg 6, euler, shift 7"])}, (400, 360), title="Read me")
    g.link(unet, 0, shift, "model")
    g.link(shift, 0, patch, "model")
    g.link(preset, 0, patch, "preset")
    g.link(patch, 0, ks, "model")
    g.link(clip, 0, pos, "clip")
    g.link(clip, 0, neg, "clip")
    g.link(pos, 0, ks, "positive")
    g.link(neg, 0, ks, "negative")
    g.link(latent, 0, ks, "latent_image")
    g.link(ks, 0, dec, "samples")
    g.link(vae, 0, dec, "vae")
    g.link(dec, 0, vid, "images")
    g.link(vid, 0, save, "video")
    g.group("Models", (-20, -60, 440, 440))
    g.group("Sparse attention (PSA)", (440, -60, 380, 620), color="#3f8f6e")
    return g.to_json()


WAN22_5B_WORKFLOW = "wan2.2_ti2v_5B_720p_sol_attn.json"


def wan22_ti2v_5b(info) -> dict:
    """Wan 2.2 TI2V 5B at 1280x704, 121 frames (ComfyUI's own template), Sol-Attn; text-to-video
    as shipped, image-to-video with a start image."""
    g = Graph(info)
    unet = g.node("UNETLoader", (0, 0), {"unet_name": "wan2.2_ti2v_5B_fp16.safetensors", "weight_dtype": "default"}, (380, 90))
    clip = g.node("CLIPLoader", (0, 140), {"clip_name": "umt5_xxl_fp8_e4m3fn_scaled.safetensors", "type": "wan", "device": "default"}, (380, 110))
    vae = g.node("VAELoader", (0, 300), {"vae_name": "wan2.2_vae.safetensors"}, (380, 60))
    patch = g.node("SparseAttentionPatch", (440, 0), patch_widgets(info, WAN22_5B_WORKFLOW), (340, 320), color=PATCH_COLOR)
    shift = g.node("ModelSamplingSD3", (440, 360), {"shift": 8.0}, (340, 60))
    pos = g.node("CLIPTextEncode", (820, 0), {"text": "A street musician plays guitar in a retro subway station, commuters hurry by and "
                                              "a small crowd gathers, the camera slowly moves right, warm dim light"},
                 (420, 160), title="Positive prompt")
    neg = g.node("CLIPTextEncode", (820, 200), {"text": NEGATIVE_WAN}, (420, 130), title="Negative prompt")
    latent = g.node("Wan22ImageToVideoLatent", (820, 370), {"width": 1280, "height": 704, "length": 121, "batch_size": 1}, (340, 170))
    ks = g.node("KSampler", (1280, 0), {"seed": 20251129, "seed:control": "fixed", "steps": 20, "cfg": 5.0,
                                        "sampler_name": "uni_pc", "scheduler": "simple", "denoise": 1.0}, (320, 270))
    dec = g.node("VAEDecode", (1280, 310), {}, (220, 50))
    vid = g.node("CreateVideo", (1280, 400), {"fps": 24.0}, (220, 80))
    save = g.node("SaveVideo", (1640, 0), {"filename_prefix": "video/wan22_ti2v_5b_sparse", "format": "auto", "codec": "auto"}, (420, 420))
    g.node("Note", (0, 400), {"text": note_text("Wan 2.2 TI2V 5B, 1280x704, 121 frames", "Sol-Attn", WAN22_5B_WORKFLOW, [
        WARMUP_AND_DENSE_BLOCKS,
        "min_tokens 4096: short sequences stay dense (1280x704 x 121 frames is 27,280 tokens: the 5B's VAE "
        "compresses 16x in space)",
        "image-to-video: connect a Load Image node to the start_image input of Wan22ImageToVideoLatent; the "
        "patch needs no other change",
        "sampler as ComfyUI's Wan 2.2 5B template: 20 steps, cfg 5, uni_pc, shift 8"])}, (380, 360), title="Read me")
    g.link(unet, 0, shift, "model")
    g.link(shift, 0, patch, "model")
    g.link(patch, 0, ks, "model")
    g.link(clip, 0, pos, "clip")
    g.link(clip, 0, neg, "clip")
    g.link(pos, 0, ks, "positive")
    g.link(neg, 0, ks, "negative")
    g.link(vae, 0, latent, "vae")
    g.link(latent, 0, ks, "latent_image")
    g.link(ks, 0, dec, "samples")
    g.link(vae, 0, dec, "vae")
    g.link(dec, 0, vid, "images")
    g.link(vid, 0, save, "video")
    g.group("Models", (-20, -60, 420, 440))
    g.group("Sparse attention", (420, -60, 380, 500), color="#3f8f6e")
    return g.to_json()


LTXV_WORKFLOW = "ltxv_t2v_sol_attn.json"


def ltxv_t2v(info) -> dict:
    g = Graph(info)
    ckpt = g.node("CheckpointLoaderSimple", (0, 0), {"ckpt_name": "ltx-video-2b-v0.9.5.safetensors"}, (400, 100))
    clip = g.node("CLIPLoader", (0, 150), {"clip_name": "t5xxl_fp16.safetensors", "type": "ltxv", "device": "default"}, (400, 110))
    patch = g.node("SparseAttentionPatch", (460, 0), patch_widgets(info, LTXV_WORKFLOW), (340, 320), color=PATCH_COLOR)
    pos = g.node("CLIPTextEncode", (840, 0), {"text": "A slow aerial shot over a coastal village at sunset: white houses with blue "
                                              "doors, narrow stairs winding down to a small harbour, fishing boats rocking "
                                              "on calm water, warm light on the walls, long shadows"}, (420, 180), title="Positive prompt")
    neg = g.node("CLIPTextEncode", (840, 220), {"text": "low quality, worst quality, deformed, distorted, motion smear, "
                                                "flicker, watermark"}, (420, 120), title="Negative prompt")
    cond = g.node("LTXVConditioning", (840, 380), {"frame_rate": 25.0}, (320, 80))
    latent = g.node("EmptyLTXVLatentVideo", (840, 500), {"width": 768, "height": 512, "length": 97, "batch_size": 1}, (320, 130))
    sched = g.node("LTXVScheduler", (1300, 0), {"steps": 30, "max_shift": 2.05, "base_shift": 0.95, "stretch": True,
                                                "terminal": 0.1}, (320, 160))
    sampler = g.node("KSamplerSelect", (1300, 200), {"sampler_name": "euler"}, (320, 60))
    sc = g.node("SamplerCustom", (1660, 0), {"add_noise": True, "noise_seed": 20251129, "noise_seed:control": "fixed",
                                             "cfg": 3.0}, (340, 230))
    dec = g.node("VAEDecode", (1660, 280), {}, (220, 50))
    vid = g.node("CreateVideo", (1660, 370), {"fps": 25.0}, (220, 80))
    save = g.node("SaveVideo", (2040, 0), {"filename_prefix": "video/ltxv_t2v_sparse", "format": "auto", "codec": "auto"}, (420, 420))
    g.node("Note", (0, 310), {"text": note_text("LTX-Video 2B v0.9.5, 768x512, 97 frames", "Sol-Attn", LTXV_WORKFLOW, [
        "LTX-Video compresses 32x in space and 8x in time: 768x512x97 is only 4,992 tokens, just above "
        "min_tokens 4096; longer or larger videos benefit more",
        "keep the frame rate of LTXVConditioning and CreateVideo equal",
        "sampler: LTXVScheduler 30 steps, cfg 3, euler"])}, (400, 330), title="Read me")
    g.link(ckpt, 0, patch, "model")
    g.link(patch, 0, sc, "model")
    g.link(clip, 0, pos, "clip")
    g.link(clip, 0, neg, "clip")
    g.link(pos, 0, cond, "positive")
    g.link(neg, 0, cond, "negative")
    g.link(cond, 0, sc, "positive")
    g.link(cond, 1, sc, "negative")
    g.link(sampler, 0, sc, "sampler")
    g.link(sched, 0, sc, "sigmas")
    g.link(latent, 0, sched, "latent")
    g.link(latent, 0, sc, "latent_image")
    g.link(sc, 0, dec, "samples")
    g.link(ckpt, 2, dec, "vae")
    g.link(dec, 0, vid, "images")
    g.link(vid, 0, save, "video")
    g.group("Models", (-20, -60, 440, 360))
    g.group("Sparse attention", (440, -60, 380, 400), color="#3f8f6e")
    return g.to_json()


LTX25_WORKFLOW = "ltx2.5_t2v_720p_sol_attn.json"
LTX25_DISTILLED_SIGMAS = "1.0, 0.99375, 0.9875, 0.98125, 0.975, 0.909375, 0.725, 0.421875, 0.0"


def ltx25_t2v(info) -> dict:
    """LTX-2.5 text-to-video with audio, 1280x720, 121 frames at 24 fps, in one stage (ComfyUI's
    template samples half the size, then upscales and refines), Sol-Attn; the distilled
    model's 8 sigmas."""
    g = Graph(info)
    unet = g.node("UNETLoader", (0, 0), {"unet_name": "ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors",
                                         "weight_dtype": "default"}, (400, 90))
    clip = g.node("CLIPLoader", (0, 130), {"clip_name": "gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors",
                                            "type": "ltxv", "device": "default"}, (400, 110))
    vae = g.node("VAELoader", (0, 280), {"vae_name": "ltx-2.5-video-vae-bf16.safetensors"}, (400, 60), title="Video VAE")
    audio_vae = g.node("VAELoader", (0, 380), {"vae_name": "ltx-2.5-audio-vae-bf16.safetensors"}, (400, 60), title="Audio VAE")
    patch = g.node("SparseAttentionPatch", (460, 0), patch_widgets(info, LTX25_WORKFLOW), (340, 320), color=PATCH_COLOR)
    pos = g.node("CLIPTextEncode", (840, 0), {"text": "A lighthouse on a rocky coast at dusk, waves crash against the rocks and "
                                              "spray drifts in the wind, the beam sweeps over the water, gulls call, the "
                                              "camera slowly pushes in"}, (420, 160), title="Positive prompt")
    neg = g.node("CLIPTextEncode", (840, 200), {"text": "pc game, console game, video game, cartoon, childish, ugly"},
                 (420, 100), title="Negative prompt")
    cond = g.node("LTXVConditioning", (840, 340), {"frame_rate": 24.0}, (320, 80))
    video = g.node("EmptyLTXVLatentVideo", (840, 460), {"width": 1280, "height": 720, "length": 121, "batch_size": 1}, (320, 130))
    audio = g.node("LTXVEmptyLatentAudio", (840, 630), {"frames_number": 121, "frame_rate": 24, "batch_size": 1}, (320, 130))
    av = g.node("LTXVConcatAVLatent", (1200, 460), {}, (260, 60))
    guider = g.node("CFGGuider", (1300, 0), {"cfg": 1.0}, (320, 100))
    noise = g.node("RandomNoise", (1300, 140), {"noise_seed": 20251129, "noise_seed:control": "fixed"}, (320, 90))
    sampler = g.node("KSamplerSelect", (1300, 270), {"sampler_name": "euler"}, (320, 60))
    sigmas = g.node("ManualSigmas", (1300, 370), {"sigmas": LTX25_DISTILLED_SIGMAS}, (320, 80))
    sca = g.node("SamplerCustomAdvanced", (1660, 0), {}, (300, 120))
    split = g.node("LTXVSeparateAVLatent", (1660, 160), {}, (300, 60))
    dec = g.node("VAEDecodeTiled", (1660, 260), {"tile_size": 512, "overlap": 64, "temporal_size": 64,
                                                 "temporal_overlap": 16}, (300, 150))
    adec = g.node("LTXVAudioVAEDecode", (1660, 450), {}, (300, 60))
    vid = g.node("CreateVideo", (1660, 550), {"fps": 24.0, "bit_depth": 8}, (260, 100))
    save = g.node("SaveVideo", (2000, 0), {"filename_prefix": "video/ltx25_t2v_sparse", "format": "auto", "format.codec": "auto",
                                           "codec": "auto"}, (420, 420))  # 0.33: format is a dynamic combo
    g.node("Note", (0, 480), {"text": note_text("LTX-2.5 T2V with audio, 1280x720, 121 frames at 24 fps", "Sol-Attn", LTX25_WORKFLOW, [
        "only the video self-attention goes sparse; the audio, text and audio-video attention stay dense",
        WARMUP_AND_DENSE_BLOCKS + "; warmup counts the 8 steps of the distilled sigmas (2 dense)",
        "1280x720 x 121 frames is 14,080 video tokens (LTX-2's VAE compresses 32x in space, 8x in time)",
        "LTX-2.3: the same graph with its transformer, video and audio VAE and Gemma text encoder files",
        "one stage at 1280x720 with the distilled sigmas, cfg 1; ComfyUI's own LTX-2.5 template samples at "
        "half size and upscales: patch each sampling model the same way"])}, (400, 360), title="Read me")
    g.link(unet, 0, patch, "model")
    g.link(patch, 0, guider, "model")
    g.link(clip, 0, pos, "clip")
    g.link(clip, 0, neg, "clip")
    g.link(pos, 0, cond, "positive")
    g.link(neg, 0, cond, "negative")
    g.link(cond, 0, guider, "positive")
    g.link(cond, 1, guider, "negative")
    g.link(audio_vae, 0, audio, "audio_vae")
    g.link(video, 0, av, "video_latent")
    g.link(audio, 0, av, "audio_latent")
    g.link(noise, 0, sca, "noise")
    g.link(guider, 0, sca, "guider")
    g.link(sampler, 0, sca, "sampler")
    g.link(sigmas, 0, sca, "sigmas")
    g.link(av, 0, sca, "latent_image")
    g.link(sca, 0, split, "av_latent")
    g.link(split, 0, dec, "samples")
    g.link(vae, 0, dec, "vae")
    g.link(split, 1, adec, "samples")
    g.link(audio_vae, 0, adec, "audio_vae")
    g.link(dec, 0, vid, "images")
    g.link(adec, 0, vid, "audio")
    g.link(vid, 0, save, "video")
    g.group("Models", (-20, -60, 440, 520))
    g.group("Sparse attention", (440, -60, 380, 400), color="#3f8f6e")
    return g.to_json()


WORKFLOWS = {
    WAN_SOL_WORKFLOW: lambda info: wan21_t2v(info, "sol_attn"),
    WAN_PSA_WORKFLOW: lambda info: wan21_t2v(info, "psa"),
    WAN22_WORKFLOW: wan22_i2v,
    HUNYUAN_WORKFLOW: hunyuan_t2v,
    LTXV_WORKFLOW: ltxv_t2v,
    HUNYUAN15_WORKFLOW: hunyuan15_t2v,
    WAN22_5B_WORKFLOW: wan22_ti2v_5b,
    LTX25_WORKFLOW: ltx25_t2v,
}
# The ComfyUI whose /object_info a workflow is written from (the oldest that has its nodes).
WRITTEN_WITH = {name: "0.3.75" for name in WORKFLOWS} | {LTX25_WORKFLOW: "0.33.0"}


def fetch_object_info() -> dict:
    import tempfile
    sys.path.insert(0, str(ROOT / "tests"))
    import comfyui_harness as h
    with tempfile.TemporaryDirectory() as tmp:
        server = h.start_server(Path(tmp))
        try:
            return server.get_json("/object_info", timeout=120)
        finally:
            server.stop()


def workflow_text(value, indent: str = "") -> str:
    """``value`` as JSON laid out for reading and diffing: a list of plain values (a link, a
    position, a node's widget values) or any part that fits in 100 characters on one line,
    everything else one entry a line, indented by one space a level."""
    flat = json.dumps(value, ensure_ascii=False)
    plain_list = isinstance(value, list) and not any(isinstance(v, (dict, list)) for v in value)
    if not isinstance(value, (dict, list)) or not value or plain_list or len(flat) <= 100:
        return flat
    inner = indent + " "
    if isinstance(value, dict):
        items = [f"{inner}{json.dumps(k, ensure_ascii=False)}: {workflow_text(v, inner)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + indent + "}"
    return "[\n" + ",\n".join(inner + workflow_text(v, inner) for v in value) + "\n" + indent + "]"


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--object-info", type=Path, help="a saved /object_info JSON (default: start ComfyUI)")
    ap.add_argument("--only", nargs="+", choices=sorted(WORKFLOWS), help="write these workflows only")
    args = ap.parse_args(argv)
    info = json.loads(args.object_info.read_text()) if args.object_info else fetch_object_info()
    OUT.mkdir(exist_ok=True)
    for name in args.only or WORKFLOWS:
        try:
            wf = WORKFLOWS[name](info)
        except MissingNode as e:
            print(f"skipped {name}: this ComfyUI has no node {e.args[0]} (written with ComfyUI {WRITTEN_WITH[name]})")
            continue
        path = OUT / name
        path.write_text(workflow_text(wf) + "\n")
        print("wrote", path.relative_to(ROOT))


if __name__ == "__main__":
    main()
