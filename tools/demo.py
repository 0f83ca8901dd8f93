"""``make demo``: the pack's main job on an embedded default, through the real ComfyUI.

    python tools/demo.py [--demo sol|psa] [--out out/demo/<demo>] [--steps N] [--keep]

Starts ComfyUI's own server (main.py of the located ComfyUI, see tools/comfyui_env.py)
headless on a loopback port, with a temporary base directory whose custom_nodes/ holds this
pack, loads the demo's workflow (``DEMOS``: sol = workflows/wan2.1_t2v_14B_720p_sol_attn.json,
psa = workflows/wan2.1_t2v_14B_720p_psa.json with the shipped Wan2.1-14B 720p preset),
converts it to an API prompt the way the frontend does (tools/workflow_api.py) and runs it
through /prompt twice: once with the Sparse Attention Patch's method set to ``dense`` and once
as shipped (Sol-Attn or PSA). It prints
attention calls sparse/dense by reason, the achieved density, sampling and wall time of both
runs and the rel-L2 of the sparse run's sampled latent against the dense one's, and writes the
Sparse Attention Inspector's images as PNG files into ``--out``.

Model files: the workflow's real files are used when every one of them is found in a
configured models folder:

* ``SVATTN_MODELS_DIR``: a ComfyUI-style models folder (diffusion_models/ or unet/,
  text_encoders/ or clip/, vae/);
* ``SVATTN_EXTRA_MODEL_PATHS``: ComfyUI extra_model_paths.yaml files (os.pathsep-separated);
* with ``COMFYUI_PATH`` set: that ComfyUI's models/ and its extra_model_paths.yaml.

Otherwise tiny stand-ins are written under the official file names (tools/tiny_models.py:
ComfyUI's own Wan class in the real key layout, random weights; a small Wan VAE), the text
encoder is replaced by the stand-in node of tools/tiny_text_encode (UMT5-XXL cannot be made
tiny), and the latent size and step count are scaled down. The shipped PSA preset fits only
the real model (40 blocks x 40 heads) and the 720p grid, so the PSA demo gives the stand-in a
preset cut from it (its first blocks and heads, rescaled to the tiny grid:
tiny_models.standin_preset) under the same file name. With random weights the videos are
close to flat grey, and the report says so with their measured pixel spread. With CUDA,
ComfyUI runs on the GPU and the patch uses the Triton kernels; without it, ComfyUI runs with --cpu and the patch uses
the float32 reference of the same kernels. Exits non-zero with a message on any failure.
"""
from __future__ import annotations

import argparse
import copy
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

TOOLS = Path(__file__).resolve().parent
REPO = TOOLS.parent
# The repo root first, for the pack's `kernels` (tiny_models.standin_preset): transformers 5.x
# installs another top-level package of that name into the same environment.
for folder in (REPO, TOOLS):
    if str(folder) in sys.path:
        sys.path.remove(str(folder))
    sys.path.insert(0, str(folder))

import comfyui_server  # noqa: E402
import tiny_models  # noqa: E402
import workflow_api  # noqa: E402


# The choices of ``make demo DEMO=...``: the workflow each runs (both Wan 2.1 T2V 14B 720p).
DEMOS = {
    "sol": REPO / "workflows" / workflow_api.make_workflows.WAN_SOL_WORKFLOW,
    "psa": REPO / "workflows" / workflow_api.make_workflows.WAN_PSA_WORKFLOW,
}
FAMILY = "wan21_t2v"
DEFAULT_OUT = REPO / "out" / "demo"  # one folder per demo below it

# The tiny run: a Wan 2.1 T2V stand-in with 4 blocks of 2 heads (head dim 128, as the real
# model), a 256x160, 17-frame video: latent 5 x 20 x 32, 5 x 10 x 16 = 800 tokens (13 key
# blocks of 64 per query block), 10 steps (the first 2 dense: warm-up 0.2); a Wan VAE of base
# width 8 (decoding dominates the CPU run's time). PSA: tile 1 x 2 x 4 makes the 5 x 10 x 16 grid
# a 5 x 5 x 4 block grid, close in shape to the shipped 720p preset's 7 x 6 x 5.
TINY_LAYERS, TINY_HEADS, TINY_VAE_DIM = 4, 2, 8
TINY_SIZE = {"width": 256, "height": 160, "length": 17}
TINY_GRID = (5, 10, 16)  # TINY_SIZE's token grid: frames (17 - 1) / 4 + 1, height / 16, width / 16
TINY_PSA_TILE = (1, 2, 4)
TINY_STEPS = 10
INSPECTOR_IMAGES = ("density_map", "head_density", "psa_masks")  # the node's IMAGE outputs, in order
LOADER_FOLDERS = workflow_api.make_workflows.MODEL_DIRS  # loader node -> models/ sub-folder
FILE_INPUTS = ("unet_name", "clip_name", "clip_name1", "clip_name2", "vae_name", "ckpt_name")


class DemoError(RuntimeError):
    pass


# --------------------------------------------------------------------------------------------
# Where the model files come from
# --------------------------------------------------------------------------------------------

def configured_model_paths(base: Path) -> tuple[list[Path], list[str]]:
    """(extra_model_paths.yaml files for the configured models folders, written into ``base``
    for a plain models folder; where each setting came from, for the report)."""
    configs = [Path(p) for p in os.environ.get("SVATTN_EXTRA_MODEL_PATHS", "").split(os.pathsep) if p]
    for path in configs:
        if not path.is_file():
            raise DemoError(f"SVATTN_EXTRA_MODEL_PATHS: {path} is not a file")
    sources = [f"SVATTN_EXTRA_MODEL_PATHS={p}" for p in configs]
    folders = [(Path(p), f"SVATTN_MODELS_DIR={p}") for p in [os.environ.get("SVATTN_MODELS_DIR")] if p]
    comfy_path = os.environ.get("COMFYUI_PATH")
    if comfy_path:
        if (Path(comfy_path) / "models").is_dir():
            folders.append((Path(comfy_path) / "models", f"COMFYUI_PATH models {Path(comfy_path) / 'models'}"))
        if (Path(comfy_path) / "extra_model_paths.yaml").is_file():
            configs.append(Path(comfy_path) / "extra_model_paths.yaml")
            sources.append(f"COMFYUI_PATH {configs[-1]}")
    for folder, source in folders:
        if not folder.is_dir():
            raise DemoError(f"{source}: not a folder")
    for i, (folder, source) in enumerate(folders):
        sources.append(source)
        # ComfyUI's extra_model_paths.yaml format; JSON strings are valid YAML scalars
        lines = [f"svattn_models_{i}:", f"  base_path: {json.dumps(str(folder.resolve()))}"]
        for key, subs in (("diffusion_models", "diffusion_models\nunet"), ("text_encoders", "text_encoders\nclip"),
                          ("vae", "vae"), ("checkpoints", "checkpoints")):
            lines.append(f"  {key}: {json.dumps(subs)}")
        path = base / f"svattn_models_{i}.yaml"
        path.write_text("\n".join(lines) + "\n")
        configs.append(path)
    return configs, sources


def model_files(prompt: dict) -> list[tuple[str, str, str]]:
    """(loader node id, models/ sub-folder, file name) of every model file the prompt loads."""
    out = []
    for nid, node in prompt.items():
        folder = LOADER_FOLDERS.get(node["class_type"])
        for key in FILE_INPUTS:
            if folder and key in node["inputs"]:
                out.append((nid, folder, node["inputs"][key]))
    return out


def missing_files(prompt: dict, object_info: dict) -> list[str]:
    """Files the prompt loads that the server does not offer (ComfyUI's own folder search)."""
    missing = []
    for nid, folder, name in model_files(prompt):
        node = prompt[nid]
        spec = object_info[node["class_type"]]["input"]["required"]
        for key in FILE_INPUTS:
            if node["inputs"].get(key) == name and key in spec:
                options = spec[key][0] if isinstance(spec[key][0], list) else spec[key][1].get("options", [])
                if name not in options:
                    missing.append(f"{folder}/{name}")
    return missing


# --------------------------------------------------------------------------------------------
# The two prompts
# --------------------------------------------------------------------------------------------

def only(prompt: dict, class_type: str) -> str:
    ids = [nid for nid, n in prompt.items() if n["class_type"] == class_type]
    if len(ids) != 1:
        raise DemoError(f"the workflow has {len(ids)} {class_type} nodes, expected one")
    return ids[0]


def demo_prompts(prompt: dict) -> tuple[dict, dict, dict]:
    """(dense prompt, sparse prompt, node ids): SaveLatent added to both, the Inspector to the
    sparse one (unless the workflow has it), the patch's method set to dense in the first."""
    ids = {"patch": only(prompt, "SparseAttentionPatch"), "sampler": only(prompt, "KSampler")}
    sparse = copy.deepcopy(prompt)
    used = {int(n) for n in sparse if n.isdigit()}
    next_id = iter(str(i) for i in range(max(used, default=0) + 1, 10**6))
    ids["latent"] = next(next_id)
    sparse[ids["latent"]] = {"class_type": "SaveLatent", "_meta": {"title": "Save Latent (demo)"},
                             "inputs": {"samples": [ids["sampler"], 0], "filename_prefix": "svattn_demo/sparse"}}
    inspectors = [nid for nid, n in sparse.items() if n["class_type"] == "SparseAttentionInspector"]
    if inspectors:
        ids["inspector"] = inspectors[0]
    else:
        ids["inspector"] = next(next_id)
        sparse[ids["inspector"]] = {"class_type": "SparseAttentionInspector",
                                    "_meta": {"title": "Sparse Attention Inspector (demo)"},
                                    "inputs": {"model": [ids["patch"], 0], "samples": [ids["sampler"], 0],
                                               "mask_layer": 0}}
    for n in sparse.values():
        if n["class_type"] == "SaveVideo":
            n["inputs"]["filename_prefix"] = "svattn_demo/sparse"
    dense = copy.deepcopy(sparse)
    dense[ids["patch"]]["inputs"]["method"] = "dense"
    del dense[ids["inspector"]]
    dense[ids["latent"]]["inputs"]["filename_prefix"] = "svattn_demo/dense"
    for n in dense.values():
        if n["class_type"] == "SaveVideo":
            n["inputs"]["filename_prefix"] = "svattn_demo/dense"
    return dense, sparse, ids


def warmup_prompt(sparse: dict, ids: dict) -> dict:
    """The sparse prompt cut down to loaders -> 2 sampling steps without warm-up -> SaveLatent:
    loads the models and runs (compiles) the sparse kernels once, so that neither timed run
    pays a one-time cost the other does not. Its KSampler and patch inputs differ from the
    timed runs', so ComfyUI's cache keeps only the loaders and text encoding."""
    p = copy.deepcopy(sparse)
    keep, todo = set(), [ids["latent"]]
    while todo:  # the nodes SaveLatent depends on
        nid = todo.pop()
        if nid not in keep:
            keep.add(nid)
            todo += [v[0] for v in p[nid]["inputs"].values() if isinstance(v, list) and len(v) == 2]
    p = {nid: n for nid, n in p.items() if nid in keep}
    p[ids["sampler"]]["inputs"]["steps"] = 2
    p[ids["patch"]]["inputs"]["warmup"] = 0.0
    p[ids["latent"]]["inputs"]["filename_prefix"] = "svattn_demo/warmup"
    return p


def output_files(server, entry: dict, nid: str) -> list[Path]:
    """The files a node's UI output names (images, latents, videos), in order."""
    files = [f for v in entry["outputs"].get(nid, {}).values() if isinstance(v, list)
             for f in v if isinstance(f, dict) and "filename" in f]
    return [server.base_dir / f.get("type", "output") / f.get("subfolder", "") / f["filename"] for f in files]


def run(server, prompt: dict, ids: dict, label: str, timeout_s: float) -> dict:
    log_start = len(server.log_text())
    try:
        entry = server.run_prompt(prompt, timeout_s=timeout_s)
    except (comfyui_server.PromptFailed, TimeoutError) as e:
        raise DemoError(f"the {label} run failed: {e}") from None
    summaries = comfyui_server.parse_run_summaries(server.log_text()[log_start:])
    if len(summaries) != 1:
        raise DemoError(f"the {label} run logged {len(summaries)} run summaries of the patch node, expected 1 "
                        f"(server log: {server.log_path})")
    latents = output_files(server, entry, ids["latent"])
    if len(latents) != 1 or not latents[0].is_file():
        raise DemoError(f"the {label} run saved no latent: {entry['outputs'].get(ids['latent'])}")
    videos = [p for nid, n in prompt.items() if n["class_type"] == "SaveVideo"
              for p in output_files(server, entry, nid)]
    return {"entry": entry, "summary": summaries[0], "latent": latents[0], "videos": videos,
            "sampling_s": entry["node_seconds"].get(ids["sampler"]), "wall_s": entry["wall_s"]}


def rel_l2(a_path: Path, b_path: Path) -> float:
    from safetensors.torch import load_file
    a = load_file(str(a_path))["latent_tensor"].double()
    b = load_file(str(b_path))["latent_tensor"].double()
    if a.shape != b.shape:
        raise DemoError(f"the two runs' latents differ in shape: {tuple(a.shape)} vs {tuple(b.shape)}")
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


# --------------------------------------------------------------------------------------------
# The report
# --------------------------------------------------------------------------------------------

def video_pixel_spread(path: Path) -> tuple[float, float]:
    """Mean and standard deviation of every pixel value (0-255) of every frame of a video."""
    import av
    import numpy as np
    with av.open(str(path)) as container:
        frames = np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)]).astype(np.float64)
    return float(frames.mean()), float(frames.std())


def _secs(x) -> str:
    return "n/a" if x is None else f"{x:.2f} s"


def report_lines(ctx: dict, dense: dict, sparse: dict, rel: float, images: list[Path]) -> list[str]:
    d, s = dense["summary"], sparse["summary"]
    patch = ctx["patch_inputs"]

    def reasons(summary):
        return ", ".join(f"{k} {v}" for k, v in sorted(summary["dense"].items())) or "none"

    speed = ""
    if dense["sampling_s"] and sparse["sampling_s"]:
        speed = f"  ({dense['sampling_s'] / sparse['sampling_s']:.2f}x)"
    density = s["mean_density"]
    method = (f"beta {patch['beta']}, target_sparsity {patch['target_sparsity']}, " if s["method"] == "sol_attn"
              else "")
    lines = [
        f"== sparse-video-attention demo: {ctx['workflow'].relative_to(REPO)} through ComfyUI "
        f"{ctx['comfyui_version']} (main.py, headless) on {ctx['device']}",
        f"models: {ctx['models']}",
        *[f"  changed: {c}" for c in ctx["changes"]],
        f"patch: {s['method']}, {method}warmup {patch['warmup']}, dense_blocks {patch['dense_blocks']!r}, "
        f"min_tokens {patch['min_tokens']}, backend {patch['backend']}; {s['forwards']} model forwards per run",
        *([f"preset: {ctx['preset']}"] if ctx["preset"] else []),
        "",
        f"{'':26}{'dense (method=dense)':>24}{'sparse (as shipped)':>24}",
        f"{'attention calls':26}{d['calls']:>24}{s['calls']:>24}",
        f"{'  sparse':26}{d['sparse']:>24}{s['sparse']:>24}",
        f"{'  dense':26}{d['calls'] - d['sparse']:>24}{s['calls'] - s['sparse']:>24}",
        f"  dense by reason, dense run:  {reasons(d)}",
        f"  dense by reason, sparse run: {reasons(s)}",
        f"{'achieved density':26}{'1 (all dense)':>24}"
        f"{'n/a' if density is None else f'{density:.3f}':>24}   (key blocks computed exactly, mean over sparse calls)",
        f"{'sampling (KSampler)':26}{_secs(dense['sampling_s']):>24}{_secs(sparse['sampling_s']):>24}{speed}",
        f"{'whole prompt (wall)':26}{_secs(dense['wall_s']):>24}{_secs(sparse['wall_s']):>24}"
        "   (sampling, VAE decode, video and latent saved)",
        f"output vs dense: rel-L2 of the sampled latent {rel:.4f}",
    ]
    if ctx["cpu"]:
        lines.append("note: on the CPU the sparse path is the float32 reference of the kernels, not meant to be fast;"
                     " the speed-up needs the Triton kernels on a GPU (BENCHMARKS.md)")
    if ctx["tiny"]:
        spread = "; ".join(f"{Path(v).stem} mean {m:.0f}, std {sd:.1f}"
                           for v, (m, sd) in ((v, video_pixel_spread(Path(v))) for v in ctx["videos"]))
        lines.append("note: the videos are close to flat grey by design (pixel values 0-255: " + spread + "): "
                     "the stand-in models' weights are random (no real model files), so nothing is drawn; what "
                     "the demo shows is the pipeline, the attention counts and densities and the Inspector "
                     "images. SVATTN_MODELS_DIR runs real files")
    lines += ["", "inspector images:", *[f"  {p}" for p in images]]
    if s["method"] != "psa":
        lines.append("  (psa_masks.png says NO PSA PRESET: Sol-Attn has no stripe masks; make demo DEMO=psa draws "
                     "a preset's masks)")
    lines += ["videos:", *[f"  {p}" for p in ctx["videos"]]]
    return lines


# --------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------

def demo(workflow: Path, out_dir: Path, base: Path, steps: int | None, timeout_s: float) -> list[str]:
    import torch
    cuda = torch.cuda.is_available()
    if not cuda:
        # the server (and this process) must see it before triton is imported
        os.environ.setdefault("TRITON_INTERPRET", "1")
    if not workflow.is_file():
        raise DemoError(f"{workflow} is missing")
    extra_model_paths, sources = configured_model_paths(base)
    # On the CPU ComfyUI would pick its chunked sub-quadratic attention, which is far slower
    # than PyTorch's SDPA; the dense baseline uses SDPA, as ComfyUI does on CUDA by default.
    extra_args = [] if cuda else ["--use-pytorch-cross-attention"]
    print(f"== starting ComfyUI (main.py{'' if cuda else ' --cpu'} {' '.join(extra_args)}) in {base} ...", flush=True)
    t0 = time.perf_counter()
    try:
        server = comfyui_server.start_server(
            base, cpu=not cuda, extra_model_paths=extra_model_paths, extra_args=extra_args,
            extra_nodes={tiny_models.TEXT_ENCODE_NODE_FOLDER: tiny_models.TEXT_ENCODE_NODE_DIR})
    except (RuntimeError, TimeoutError) as e:
        raise DemoError(f"ComfyUI did not start: {e}") from None
    try:
        info = server.get_json("/object_info", timeout=120)
        for node in ("SparseAttentionPatch", "SparseAttentionInspector"):
            if node not in info:
                raise DemoError(f"the pack did not load into ComfyUI (no {node} node); see {server.log_path}")
        print(f"== ComfyUI up in {time.perf_counter() - t0:.1f} s ({server.url})", flush=True)
        defaults_used = []
        try:
            prompt = workflow_api.ui_to_api(json.loads(workflow.read_text()), info, defaults_used)
        except (ValueError, KeyError) as e:
            raise DemoError(f"{workflow.name} does not match this ComfyUI's nodes: {e}") from None
        missing = missing_files(prompt, info)
        backend = "triton" if cuda else "reference"
        presets = [n["inputs"]["preset_name"] for n in prompt.values() if n["class_type"] == "LoadStripeMaskPreset"]
        ctx = {"cpu": not cuda, "workflow": workflow, "tiny": bool(missing),
               "preset": f"{presets[0]} (shipped, mask_presets/)" if presets else None,
               "changes": [f"widget missing in the workflow file, default used: {d}" for d in defaults_used],
               "comfyui_version": server.get_json("/system_stats")["system"].get("comfyui_version", "?"),
               "device": torch.cuda.get_device_name(0) if cuda else "the CPU (--cpu --use-pytorch-cross-attention)"}
        if not missing:
            ctx["models"] = "the workflow's real files, found through " + ", ".join(sources)
            patch = prompt[only(prompt, "SparseAttentionPatch")]["inputs"]
            if patch["backend"] != backend:
                ctx["changes"].append(f"SparseAttentionPatch backend {patch['backend']} -> {backend}")
                patch["backend"] = backend
            if steps:
                sampler = prompt[only(prompt, "KSampler")]["inputs"]
                ctx["changes"].append(f"KSampler steps {sampler['steps']} -> {steps}")
                sampler["steps"] = steps
        else:
            where = "no models folder configured" if not sources else f"not found through {', '.join(sources)}"
            written = write_tiny_models(base, cuda)
            if presets:
                ctx["preset"] = write_standin_preset(base, presets[0])
            ctx["models"] = (f"tiny stand-ins under the official names ({where}: {', '.join(missing)}): "
                             f"{', '.join(p.name for p in written)} (Wan 2.1 T2V class, {TINY_LAYERS} blocks x "
                             f"{TINY_HEADS} heads of 128, random weights; Wan VAE of base width {TINY_VAE_DIM}); text encoder: stand-in node "
                             f"{workflow_api.STUB_TEXT_ENCODE} (UMT5-XXL cannot be made tiny)")
            prompt, changes = workflow_api.tiny_run_prompt(prompt, FAMILY, steps=steps or TINY_STEPS,
                                                           sizes=TINY_SIZE, backend=backend)
            ctx["changes"] += [c.split(" ", 1)[1] for c in changes]
        dense_prompt, sparse_prompt, ids = demo_prompts(prompt)
        ctx["patch_inputs"] = sparse_prompt[ids["patch"]]["inputs"]

        print("== warm-up: load the models, run the sparse path once (2 steps, not timed) ...", flush=True)
        warm = run(server, warmup_prompt(sparse_prompt, ids), ids, "warm-up", timeout_s)
        print(f"   done in {warm['wall_s']:.1f} s", flush=True)
        print("== run 1/2: method dense ...", flush=True)
        dense = run(server, dense_prompt, ids, "dense", timeout_s)
        print(f"   done in {dense['wall_s']:.1f} s", flush=True)
        print("== run 2/2: as shipped (sparse) ...", flush=True)
        sparse = run(server, sparse_prompt, ids, "sparse", timeout_s)
        print(f"   done in {sparse['wall_s']:.1f} s", flush=True)

        if sparse["summary"]["sparse"] == 0:
            raise DemoError(f"the sparse run took no sparse attention call (dense by reason: "
                            f"{sparse['summary']['dense']}); see {server.log_path}")
        if dense["summary"]["sparse"] != 0:
            raise DemoError(f"the dense run took {dense['summary']['sparse']} sparse calls")
        rel = rel_l2(sparse["latent"], dense["latent"])
        pngs = output_files(server, sparse["entry"], ids["inspector"])
        if len(pngs) != len(INSPECTOR_IMAGES) or not all(p.is_file() for p in pngs):
            raise DemoError(f"the Sparse Attention Inspector wrote {pngs}, expected {len(INSPECTOR_IMAGES)} images")
        out_dir.mkdir(parents=True, exist_ok=True)
        images = []
        for name, src in zip(INSPECTOR_IMAGES, pngs):
            images.append(out_dir / f"{name}.png")
            shutil.copyfile(src, images[-1])
        ctx["videos"] = []
        for label, r in (("dense", dense), ("sparse", sparse)):
            for src in r["videos"]:
                ctx["videos"].append(out_dir / f"{label}{src.suffix}")
                shutil.copyfile(src, ctx["videos"][-1])
        lines = report_lines(ctx, dense, sparse, rel, images)
        (out_dir / "report.txt").write_text("\n".join(lines) + "\n")
        times = {label: {f"{nid} {p[nid]['class_type']}": round(t, 3) for nid, t in r["entry"]["node_seconds"].items()}
                 for label, r, p in (("warm-up", warm, warmup_prompt(sparse_prompt, ids)),
                                     ("dense", dense, dense_prompt), ("sparse", sparse, sparse_prompt))}
        doc = {"workflow": str(workflow.relative_to(REPO)), "device": ctx["device"], "models": ctx["models"],
               "preset": ctx["preset"],
               "changes": ctx["changes"], "patch": ctx["patch_inputs"],
               "run_summary": {"dense": dense["summary"], "sparse": sparse["summary"]},
               "sampling_s": {"dense": dense["sampling_s"], "sparse": sparse["sampling_s"]},
               "wall_s": {"dense": dense["wall_s"], "sparse": sparse["wall_s"]}, "node_seconds": times,
               "rel_l2_latent": rel, "inspector_images": [str(p) for p in images],
               "videos": [str(p) for p in ctx["videos"]]}
        (out_dir / "report.json").write_text(json.dumps(doc, indent=1, default=str) + "\n")
        return lines
    finally:
        server.stop()


def write_tiny_models(base: Path, cuda: bool) -> list[Path]:
    """The tiny Wan 2.1 T2V files under the official names in ``base/models``."""
    comfyui_server.import_comfy(cpu=not cuda)
    try:
        return tiny_models.write_models(base / "models", FAMILY, wan_layers=TINY_LAYERS, wan_heads=TINY_HEADS,
                                        wan_vae_dim=TINY_VAE_DIM)
    except Exception as e:
        raise DemoError(f"could not write the tiny model files: {type(e).__name__}: {e}") from None


def write_standin_preset(base: Path, name: str) -> str:
    """The tiny run's PSA preset (see the module docstring), saved as ``name`` in
    base/models/sparse_attention_presets/; returns its description for the report."""
    from kernels.preset_file import save_preset
    shipped = REPO / "mask_presets" / name
    if not shipped.is_file():
        raise DemoError(f"the workflow loads the preset {name}, which is not in mask_presets/")
    preset = tiny_models.standin_preset(shipped, layers=TINY_LAYERS, heads=TINY_HEADS, hidden_size=tiny_models.wan_hidden_size(TINY_HEADS),
                                        grid=TINY_GRID, tile=TINY_PSA_TILE)
    folder = base / "models" / "sparse_attention_presets"
    folder.mkdir(parents=True, exist_ok=True)
    save_preset(preset, folder / name)
    return (f"{name}: a stand-in in models/sparse_attention_presets/ (the shipped one fits only the real 40 x 40 "
            f"model on the 720p grid): its masks of blocks 0-{TINY_LAYERS - 1}, heads 0-{TINY_HEADS - 1}, rescaled "
            f"to token grid {TINY_GRID} with tile {TINY_PSA_TILE} (block grid {preset.block_grid}), "
            f"{preset.stats['sparsity']:.0%} block-sparse")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--demo", choices=sorted(DEMOS), default="sol",
                    help="sol: Sol-Attn (workflows/wan2.1_t2v_14B_720p_sol_attn.json); psa: PSA with the shipped "
                         "Wan 720p preset (workflows/wan2.1_t2v_14B_720p_psa.json). Default: sol")
    ap.add_argument("--out", type=Path, default=None, help="where the PNGs, videos and report go "
                    "(default: out/demo/<demo>)")
    ap.add_argument("--steps", type=int, default=None,
                    help=f"sampling steps (default: {TINY_STEPS} with the tiny model, the workflow's with real files)")
    ap.add_argument("--timeout", type=float, default=1800, help="seconds allowed per run (default 1800)")
    ap.add_argument("--keep", action="store_true", help="keep ComfyUI's temporary base directory")
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    base = Path(tempfile.mkdtemp(prefix="svattn-demo-"))
    ok = False
    try:
        out = (args.out or DEFAULT_OUT / args.demo).resolve()
        lines = demo(DEMOS[args.demo], out, base, args.steps, args.timeout)
        ok = True
    except DemoError as e:
        print(f"\nmake demo FAILED: {e}\n(ComfyUI's base directory with its server.log is kept: {base})",
              file=sys.stderr)
        return 1
    except Exception as e:  # a bug of the demo or of ComfyUI: the traceback, then the same message
        import traceback
        traceback.print_exc()
        print(f"\nmake demo FAILED: unexpected {type(e).__name__}: {e}\n(ComfyUI's base directory with its "
              f"server.log is kept: {base})", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"\nmake demo interrupted (base directory kept: {base})", file=sys.stderr)
        return 130
    finally:
        if ok and not args.keep:
            shutil.rmtree(base, ignore_errors=True)
    print()
    print("\n".join(lines))
    print(f"\nreport: {out / 'report.txt'} (and report.json); demo took {time.perf_counter() - t0:.0f} s"
          + (f"; ComfyUI base directory kept: {base}" if args.keep else ""))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
