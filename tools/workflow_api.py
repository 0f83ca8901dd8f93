"""UI-format workflow -> API prompt, and the changes a run on tiny stand-in files needs.

Shared by tests/comfyui/test_workflows.py and ``make demo`` (tools/demo.py).

``ui_to_api`` does what the frontend's graphToPrompt does for the graphs in workflows/ (no
subgraphs, reroutes or bypassed nodes there): notes are dropped, widget values are matched to
input names in /object_info's ``input_order`` (skipping the frontend-only control_after_generate
and upload values; the inputs of a dynamic combo's chosen option, ComfyUI 0.33, follow it as
``combo.input``), and links become ``[source id, output slot]``. The web UI test checks
that it gives exactly what the real frontend gives.
"""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
FRONTEND_ONLY = {"Note", "MarkdownNote", "PrimitiveNode", "Reroute"}

_spec = importlib.util.spec_from_file_location("_svattn_make_workflows", REPO_ROOT / "tools" / "make_workflows.py")
make_workflows = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(make_workflows)
widget_layout = make_workflows.widget_layout
widget_specs = make_workflows.widget_specs
socket_inputs = make_workflows.socket_inputs
widget_default = make_workflows.widget_default


def ui_to_api(workflow: dict, object_info: dict, defaults_used: list | None = None) -> dict:
    """The API prompt of a UI-format workflow. A node with fewer widget values than
    /object_info has widgets is an error, unless ``defaults_used`` is a list: then, as the
    frontend does with a workflow saved before a node gained widgets, the missing trailing
    widgets take their defaults, and ``"<id> <type>.<widget> = <default>"`` is appended to it."""
    links = {link[0]: link for link in workflow["links"]}
    prompt = {}
    for node in workflow["nodes"]:
        if node["type"] in FRONTEND_ONLY or node.get("mode", 0) != 0:
            continue
        inputs = {}
        values = list(node.get("widgets_values", []))
        layout = widget_layout(object_info, node["type"], values)
        while defaults_used is not None and len(values) < len(layout):
            name, kind = layout[len(values)]
            values.append(None if kind in ("control", "upload") else
                          widget_default(object_info, node["type"], name, values))
            if kind not in ("control", "upload"):
                defaults_used.append(f"{node['id']} {node['type']}.{name} = {values[-1]!r}")
            layout = widget_layout(object_info, node["type"], values)  # a dynamic combo's inputs
        if len(values) != len(layout):
            raise ValueError(f"node {node['id']} {node['type']}: {len(values)} widget values, "
                             f"/object_info gives {len(layout)} widgets {[n for n, _ in layout]}")
        for (name, kind), value in zip(layout, values):
            if kind not in ("control", "upload"):
                inputs[name] = value
        for inp in node.get("inputs", []):
            if inp.get("link") is not None:
                _, src, slot, _, _, _ = links[inp["link"]]
                inputs[inp["name"]] = [str(src), slot]
        prompt[str(node["id"])] = {"inputs": inputs, "class_type": node["type"],
                                   "_meta": {"title": node.get("title") or object_info[node["type"]]["display_name"]}}
    return prompt


# --------------------------------------------------------------------------------------------
# The CPU run: same graph, tiny sizes, text encoders swapped for the test stub node
# --------------------------------------------------------------------------------------------

TEXT_ENCODER_LOADERS = {"CLIPLoader", "DualCLIPLoader"}
STUB_TEXT_ENCODE = "SVATestTextEncode"

# Small latent sizes that keep every model's token grid a few dozen tokens.
TINY_SIZES = {
    "EmptyHunyuanLatentVideo": {"width": 96, "height": 64, "length": 9},     # Wan: 3 x 4 x 6 tokens
    "WanImageToVideo": {"width": 96, "height": 64, "length": 9},
    "Wan22ImageToVideoLatent": {"width": 192, "height": 128, "length": 9},   # Wan 2.2 5B (16x VAE): 3 x 4 x 6
    "EmptyHunyuanVideo15Latent": {"width": 96, "height": 64, "length": 9},   # HunyuanVideo 1.5 (16x, patch 1): 3 x 4 x 6
    "EmptyLTXVLatentVideo": {"width": 192, "height": 128, "length": 17},     # LTXV: 3 x 4 x 6 tokens
}
WAN_TINY_GRID = (3, 4, 6)
HUNYUAN_TINY_SIZE = {"width": 128, "height": 64, "length": 9}                 # 3 x 4 x 8 tokens
HUNYUAN_TINY_GRID = (3, 4, 8)


def tiny_run_prompt(prompt: dict, family: str, steps: int = 3, *, sizes: dict | None = None,
                    backend: str = "reference") -> tuple[dict, list[str]]:
    """The prompt a run on tiny stand-in files submits, and a list of what was changed.

    Changes: text encoders -> stand-in (see tools/tiny_text_encode); latent sizes -> TINY_SIZES
    (or ``sizes``: width/height/length for every latent node; LTX-2's audio latent as long as
    the video); sampling steps -> ``steps``
    (KSamplerAdvanced keeps its stage split at the same fraction); Sparse Attention Patch:
    ``backend`` ('reference': the float reference of the same kernels, which runs on the CPU)
    and min_tokens 0 (the tiny videos are a few dozen tokens).
    Every other node and widget, model file names included, is as shipped."""
    p = copy.deepcopy(prompt)
    changed = []
    for nid, node in list(p.items()):
        ct, inputs = node["class_type"], node["inputs"]
        if ct == "CLIPTextEncode":
            loader = p[inputs["clip"][0]]
            # LTX-2.x's Gemma encoder loads with CLIPLoader type "ltxv", as LTX-Video's T5 does
            encoder = "ltxav" if family == "ltx25" else loader["inputs"]["type"]
            node["class_type"] = STUB_TEXT_ENCODE
            node["inputs"] = {"text": inputs["text"], "encoder": encoder, "tokens": 16}
            changed.append(f"{nid} CLIPTextEncode -> {STUB_TEXT_ENCODE}({encoder})")
        elif ct == "LTXVEmptyLatentAudio":  # LTX-2: as long as the video
            inputs["frames_number"] = (sizes or TINY_SIZES["EmptyLTXVLatentVideo"])["length"]
            changed.append(f"{nid} {ct} frames_number -> {inputs['frames_number']}")
        elif ct in TINY_SIZES:
            size = sizes or (HUNYUAN_TINY_SIZE if family == "hunyuan_video" else TINY_SIZES[ct])
            inputs.update(size)
            changed.append(f"{nid} {ct} size -> {size}")
        elif ct == "KSampler":
            if inputs["steps"] != steps:
                changed.append(f"{nid} KSampler steps {inputs['steps']} -> {steps}")
            inputs["steps"] = steps
        elif ct == "KSamplerAdvanced":
            total = inputs["steps"]
            scale = lambda s: s if s >= total else round(s * (steps + 1) / total)  # noqa: E731
            inputs["start_at_step"], inputs["end_at_step"] = scale(inputs["start_at_step"]), scale(inputs["end_at_step"])
            inputs["steps"] = steps + 1
            changed.append(f"{nid} KSamplerAdvanced steps {total} -> {steps + 1}, "
                           f"start/end {inputs['start_at_step']}/{inputs['end_at_step']}")
        elif ct == "LTXVScheduler":
            inputs["steps"] = steps
        elif ct == "SparseAttentionPatch":
            inputs["backend"] = backend
            inputs["min_tokens"] = 0
            changed.append(f"{nid} SparseAttentionPatch backend {backend}, min_tokens 0")
    for nid in [n for n, node in p.items() if node["class_type"] in TEXT_ENCODER_LOADERS]:
        del p[nid]
        changed.append(f"{nid} text encoder loader removed")
    return p, changed
