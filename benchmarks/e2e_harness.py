"""The harness of benchmarks/e2e_comfyui.py: the model configurations, ComfyUI started with this
pack loaded, full-size models with random weights, the attention overrides (dense, stub) and
the forward timer. The CLI, the kernel timings and the report are in e2e_comfyui.py."""
from __future__ import annotations

import asyncio
import dataclasses
import functools
import importlib
import importlib.util
import math
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from results_file import write_results  # benchmarks/ is on sys.path (e2e_comfyui.py)

REPO = Path(__file__).resolve().parents[1]
PACK_NAME = "sparse-video-attention"
TIMER_KEY = "e2e_forward_timer"
GiB = float(2 ** 30)


# ============================================================================ model specs

@dataclasses.dataclass
class ModelSpec:
    key: str                 # --models name
    name: str                # what the JSON calls it
    seed: str                # tools/tiny_models.py function giving what ComfyUI's detection reads
    size: dict               # its arguments (the architecture's sizes)
    latent_shape: tuple      # (1, C, T, H, W) video latent
    text_tokens: int
    cond: str                # "wan" | "hunyuan" | "hunyuan15" | "ltxv": the conditioning's kind
    psa_tile: tuple
    note: str = ""
    patch: tuple = (1, 2, 2)  # what detection sets: 1x2x2 for Wan and HunyuanVideo, 1x1x1 for HunyuanVideo 1.5

    @property
    def family(self) -> str:
        """The nodes' adapter name."""
        return {"wan": "wan", "hunyuan": "hunyuan_video", "hunyuan15": "hunyuan_video", "ltxv": "ltxv"}[self.cond]

    def seed_state_dict(self) -> tuple:
        """(meta state dict, file metadata) that ComfyUI's detection turns into this model: the
        class and every constructor argument are ComfyUI's own, as for a real file."""
        tiny_models = comfyui_harness().tiny_models
        out = getattr(tiny_models, self.seed)(**self.size)
        return out if isinstance(out, tuple) else (out, None)

    def patch_size(self):
        # the patchifier's 1 for LTXV
        return (1, 1, 1) if self.cond == "ltxv" else self.patch

    def grid(self):
        _, _, t, h, w = self.latent_shape
        pt, ph, pw = self.patch_size()
        return (math.ceil(t / pt), math.ceil(h / ph), math.ceil(w / pw))

    def video_tokens(self):
        t, h, w = self.grid()
        return t * h * w

    def extra_tokens(self):
        """Non-grid tokens in the self-attention sequence (HunyuanVideo: text, after video)."""
        return self.text_tokens if self.family == "hunyuan_video" else 0

    def heads(self):
        c = self.size
        if self.cond == "ltxv":
            return int(c["num_heads"])
        return int(c.get("dim", c.get("hidden_size", 0)) // 128)   # detection: heads = width // 128

    def head_dim(self):
        return int(self.size["head_dim"]) if self.cond == "ltxv" else 128

    def blocks(self):
        c = self.size
        if self.family == "hunyuan_video":
            return int(c["depth"] + c["depth_single_blocks"])
        return int(c["num_layers"])


FULL = {
    # Wan2.1-T2V-14B: dim 5120, 40 heads × 128, 40 blocks; 720p (1280×720) 81 frames →
    # latent 16×21×90×160 → 21×45×80 = 75,600 tokens; umT5 context padded to 512 tokens.
    "wan": ModelSpec("wan", "wan21_t2v_14b", "wan_seed", dict(dim=5120, ffn_dim=13824, num_layers=40),
                     (1, 16, 21, 90, 160), 512, "wan", (3, 8, 16),
                     "Wan2.1-T2V-14B architecture, 720p 81 frames"),
    # HunyuanVideo 13B: hidden 3072, 24 heads × 128, 20 double + 40 single blocks; 720p 129
    # frames → latent 16×33×90×160 → 33×45×80 = 118,800 video tokens (+ 256 text tokens).
    "hunyuan": ModelSpec("hunyuan", "hunyuan_video_13b", "hunyuan_video_seed",
                         dict(hidden_size=3072, depth=20, depth_single_blocks=40), (1, 16, 33, 90, 160), 256,
                         "hunyuan", (3, 8, 16),
                         "HunyuanVideo 13B architecture, 720p 129 frames, 256 text tokens"),
    # LTX-Video 0.9 (2B): 28 blocks, 32 heads × 64; 1280×704 (LTX needs multiples of 32) 121
    # frames → latent 128×16×22×40 → 14,080 tokens (patch size 1). PSA tile 8×2×8 = 128
    # tokens divides the grid exactly (the kernel's unmasked path wants multiples of 128).
    "ltxv": ModelSpec("ltxv", "ltxv_2b", "ltxv_seed", dict(num_layers=28, num_heads=32, head_dim=64),
                      (1, 128, 16, 22, 40), 128, "ltxv", (8, 2, 8),
                      "LTX-Video 0.9 2B architecture, 1280x704 121 frames"),
    # HunyuanVideo 1.5 (8.3B): hidden 2048, 16 heads × 128, 54 double blocks, no single block,
    # patch 1x1x1 on the 32-channel latent of its 16x VAE; 720p 121 frames (ComfyUI's template,
    # EmptyHunyuanVideo15Latent) → latent 32×31×45×80 → 111,600 video tokens (+ 256 Qwen2.5-VL
    # text tokens). PSA: the shipped hunyuan_video1.5_720p_121f preset fits this grid.
    "hunyuan15": ModelSpec("hunyuan15", "hunyuan_video15_8b", "hunyuan_video15_seed",
                           dict(hidden_size=2048, depth=54, depth_single_blocks=0), (1, 32, 31, 45, 80), 256,
                           "hunyuan15", (3, 8, 16),
                           "HunyuanVideo 1.5 8.3B architecture (t2v), 720p 121 frames, 256 text tokens",
                           patch=(1, 1, 1)),
    # Wan 2.2 TI2V 5B: dim 3072, 24 heads × 128, 30 blocks, in/out 48 channels (WAN22_T2V);
    # 1280×704 121 frames (Wan22ImageToVideoLatent's template size) → latent 48×31×44×80 →
    # 31×22×40 = 27,280 tokens; umT5 context padded to 512 tokens. PSA: the shipped
    # wan2.2_ti2v_5b_720p_121f preset fits this grid.
    "wan22_5b": ModelSpec("wan22_5b", "wan22_ti2v_5b", "wan_seed",
                          dict(dim=3072, ffn_dim=14336, num_layers=30, in_dim=48, out_dim=48), (1, 48, 31, 44, 80),
                          512, "wan", (2, 8, 8), "Wan2.2-TI2V-5B architecture (t2v), 1280x704 121 frames"),
}

TINY = {
    "wan": ModelSpec("wan", "wan21_tiny", "wan_seed", dict(dim=256, ffn_dim=512, num_layers=3),
                     (1, 16, 3, 16, 16), 8, "wan", (1, 4, 4), "tiny Wan (CPU test)"),
    "hunyuan": ModelSpec("hunyuan", "hunyuan_video_tiny", "hunyuan_video_seed",
                         dict(hidden_size=256, depth=1, depth_single_blocks=2), (1, 16, 3, 16, 16), 8, "hunyuan",
                         (1, 4, 4),
                         "tiny HunyuanVideo (CPU test)"),
    # ComfyUI detects LTXV heads as 32 without file metadata; the tiny one keeps 32 heads.
    "ltxv": ModelSpec("ltxv", "ltxv_tiny", "ltxv_seed", dict(num_layers=2, num_heads=32, head_dim=8),
                      (1, 128, 2, 8, 8), 8, "ltxv", (1, 4, 4), "tiny LTX-Video (CPU test)"),
    "hunyuan15": ModelSpec("hunyuan15", "hunyuan_video15_tiny", "hunyuan_video15_seed",
                           dict(hidden_size=256, depth=3, depth_single_blocks=0), (1, 32, 3, 8, 8), 8, "hunyuan15",
                           (1, 4, 4), "tiny HunyuanVideo 1.5 (CPU test)", patch=(1, 1, 1)),
    "wan22_5b": ModelSpec("wan22_5b", "wan22_ti2v_tiny", "wan_seed",
                          dict(dim=256, ffn_dim=512, num_layers=3, in_dim=48, out_dim=48), (1, 48, 3, 16, 16), 8, "wan",
                          (1, 4, 4), "tiny Wan 2.2 TI2V 5B (CPU test)"),
}


# ============================================================================ results file

class Results:
    """The JSON document; ``save()`` rewrites it atomically after every measurement."""

    def __init__(self, path: Path, doc: dict):
        self.path = Path(path)
        self.doc = doc

    def save(self):
        self.path.parent.mkdir(parents=True, exist_ok=True)
        write_results(self.path, _jsonable(self.doc))


def _jsonable(x):
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, torch.Tensor):
        return _jsonable(x.tolist()) if x.numel() <= 64 else f"tensor{tuple(x.shape)}"
    if isinstance(x, (int, str, bool)) or x is None:
        return x
    return repr(x)


def git_output(*args) -> Optional[str]:
    try:
        return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=10,
                              check=True).stdout.strip()
    except Exception:
        return None


# ============================================================================ ComfyUI start

@functools.lru_cache(maxsize=None)
def comfyui_harness():
    """tests/comfyui_harness.py (locating and copying ComfyUI, attention overrides), imported
    by path, once."""
    spec = importlib.util.spec_from_file_location("_e2e_comfyui_harness", REPO / "tests" / "comfyui_harness.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@dataclasses.dataclass
class Comfy:
    comfy_dir: Path
    version: str
    pack_module: Any
    node_class: Any          # SparseAttentionPatch as ComfyUI registered it
    attention_pytorch: Callable
    default_attention: str   # the backend ComfyUI itself picked
    startup_s: float


def start_comfyui(base_dir: Path, cpu: bool) -> Comfy:
    """Import ComfyUI as main.py would (CPU, or GPU with --gpu-only and PyTorch attention) and
    load this pack from ``base_dir/custom_nodes`` through ComfyUI's own custom-node loader."""
    t0 = time.perf_counter()
    harness = comfyui_harness()
    comfy_dir = harness.prepared_comfyui_dir()
    version = harness.comfyui_env.comfyui_version(comfy_dir)
    base_dir = Path(base_dir).resolve()
    custom = base_dir / "custom_nodes"
    custom.mkdir(parents=True, exist_ok=True)
    link = custom / PACK_NAME
    if not link.exists():
        link.symlink_to(REPO, target_is_directory=True)

    sys.path.insert(0, str(comfy_dir))
    import comfy.options
    comfy.options.enable_args_parsing(False)
    from comfy.cli_args import args
    args.cpu = cpu
    args.base_directory = str(base_dir)
    args.disable_all_custom_nodes = False
    if not cpu:
        args.gpu_only = True                      # weights, latents and activations stay on the GPU
        args.use_pytorch_cross_attention = True   # ComfyUI's attention = attention_pytorch (SDPA)
    import folder_paths  # noqa: F401
    import utils.extra_config  # noqa: F401  (main.py imports it before nodes.py)
    import nodes
    if Path(nodes.__file__).resolve().parent != comfy_dir.resolve():
        raise RuntimeError(f"`import nodes` found {nodes.__file__}, not ComfyUI's nodes.py")
    asyncio.run(nodes.init_external_custom_nodes())
    if PACK_NAME not in nodes.LOADED_MODULE_DIRS:
        raise RuntimeError("ComfyUI did not load the pack from custom_nodes/ (see the log above)")
    pack = sys.modules[str(link).replace(".", "_x_")]
    node_class = nodes.NODE_CLASS_MAPPINGS["SparseAttentionPatch"]
    import comfy.ldm.modules.attention as attn
    return Comfy(comfy_dir, version, pack, node_class, attn.attention_pytorch,
                 getattr(attn.optimized_attention, "__name__", repr(attn.optimized_attention)),
                 time.perf_counter() - t0)


# ============================================================================ model building

def _init_weights_(module: torch.nn.Module, seed: int, device) -> None:
    """Random weights in place on ``device`` (ComfyUI's ops leave parameters uninitialised):
    matrices N(0, 1/fan_in), norm scales 1 + N(0, 0.05²), everything else N(0, 0.02²)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
            leaf = name.rsplit(".", 1)[-1]
            if p.ndim >= 2 and leaf == "weight":
                p.normal_(0.0, 1.0 / math.sqrt(math.prod(p.shape[1:])), generator=gen)
            elif p.ndim == 1 and ("norm" in name or leaf == "scale") and leaf in ("weight", "scale"):
                p.normal_(1.0, 0.05, generator=gen)
            else:
                p.normal_(0.0, 0.02, generator=gen)


def build_model(spec: ModelSpec, device: torch.device, dtype: torch.dtype, seed: int) -> tuple:
    """ComfyUI's loader path without a weight file: detection on the seed (the meta tensors it
    reads), the model allocated by ComfyUI on ``device``, random weights there, a ModelPatcher
    around it."""
    import comfy.model_detection
    import comfy.model_management as mm
    import comfy.model_patcher

    t0 = time.perf_counter()
    sd, metadata = spec.seed_state_dict()
    model_config = comfy.model_detection.model_config_from_unet(sd, "", metadata=metadata)
    if model_config is None:
        raise RuntimeError(f"ComfyUI's model detection did not recognise the {spec.name} seed")
    manual_cast = mm.unet_manual_cast(dtype, device, model_config.supported_inference_dtypes)
    model_config.set_inference_dtype(dtype, manual_cast)
    if device.type == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    model = model_config.get_model(sd, "", device=device)
    del sd
    dm = model.diffusion_model
    n_params = sum(p.numel() for p in dm.parameters())
    # A layer the model makes with plain torch.nn rather than ComfyUI's operations (HunyuanVideo
    # 1.5's cond_type_embedding) is built on the CPU; ComfyUI's ModelPatcher.load moves it when
    # it loads the model, so do the same, keeping its dtype, and say which were moved.
    stragglers = [n for n, p in dm.named_parameters() if p.device.type != device.type]
    for name in stragglers:
        owner, _, leaf = name.rpartition(".")
        module = dm.get_submodule(owner)
        setattr(module, leaf, torch.nn.Parameter(getattr(module, leaf).to(device), requires_grad=False))
    if stragglers:
        print(f"   moved to {device} as ModelPatcher.load would: {stragglers}", flush=True)
    _init_weights_(dm, seed, device)
    patcher = comfy.model_patcher.ModelPatcher(model, load_device=device, offload_device=device)
    if device.type == "cuda":
        torch.cuda.synchronize()
    info = dict(
        model_config=type(model_config).__name__, model_base=type(model).__name__,
        diffusion_model=type(dm).__name__, diffusion_model_class=f"{type(dm).__module__}.{type(dm).__name__}",
        unet_config={k: v for k, v in model_config.unet_config.items()
                                                       if isinstance(v, (int, float, str, bool, list, tuple))},
        parameters=int(n_params), dtype=str(dtype).replace("torch.", ""),
        manual_cast_dtype=None if manual_cast is None else str(manual_cast),
        moved_to_device=stragglers,
        weight_bytes=int(sum(p.numel() * p.element_size() for p in dm.parameters())),
        build_s=time.perf_counter() - t0)
    if device.type == "cuda":
        info["memory_allocated_gib"] = torch.cuda.memory_allocated() / GiB
        info["build_peak_gib"] = torch.cuda.max_memory_allocated() / GiB
    return patcher, info


def conditioning(spec: ModelSpec, seed: int):
    """(positive, negative) in ComfyUI's list format, of the shapes the text encoders give."""
    gen = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(2):
        text = torch.randn(1, spec.text_tokens, 3584 if spec.cond == "hunyuan15" else 4096, generator=gen)
        extra = {}
        if spec.cond == "hunyuan":
            extra = {"pooled_output": torch.randn(1, 768, generator=gen), "guidance": 6.0}
        elif spec.cond == "hunyuan15":  # Qwen2.5-VL text; no pooled vector, no guidance embedding
            extra = {"pooled_output": None}
        elif spec.cond == "ltxv":
            extra = {"attention_mask": torch.ones(1, spec.text_tokens, dtype=torch.long), "frame_rate": 25}
        out.append([[text, extra]])
    return out[0], out[1]


# ============================================================================ overrides

def _lens(args, kwargs):
    q, k = args[0], args[1]
    if kwargs.get("skip_reshape", False):
        return q.shape[2], k.shape[2]
    return q.shape[1], k.shape[1]


def _heads(args, kwargs):
    return args[3] if len(args) > 3 else kwargs.get("heads")


def _mask(args, kwargs):
    return args[4] if len(args) > 4 else kwargs.get("mask")


class DenseOverride:
    """Every attention call through ComfyUI's ``attention_pytorch`` with SDPA restricted to the
    cuDNN backend (on CUDA). A call cuDNN refuses goes to ComfyUI's default function instead,
    counted by kind; a refused *self*-attention is reported, since then the baseline is not
    cuDNN. Optionally keeps q/k/v of one self-attention call (for the stand-alone kernels)."""

    def __init__(self, attention_pytorch, cuda: bool, n_video: int):
        self.attention = attention_pytorch
        self.cuda = cuda
        self.n_video = n_video
        self.calls = 0
        self.self_calls = 0
        self.batches = set()
        self.fallback = {}       # kind -> count
        self.refused = {}        # signature -> error text
        self.capture_index: Optional[int] = None
        self.captured: Optional[tuple] = None

    def __deepcopy__(self, memo):  # ComfyUI deep-copies model_options on clone(): share the counters
        return self

    def is_self(self, args, kwargs) -> bool:
        lq, lk = _lens(args, kwargs)
        return lq == lk and lq >= self.n_video

    def __call__(self, func, *args, **kwargs):
        self.calls += 1
        is_self = self.is_self(args, kwargs)
        if is_self:
            if self.capture_index is not None and self.self_calls == self.capture_index:
                self.captured = _blhd_copy(args, kwargs)
                self.capture_index = None
            self.self_calls += 1
            self.batches.add(int(args[0].shape[0]))
        if not self.cuda:
            return self.attention(*args, **kwargs)
        from torch.nn.attention import SDPBackend, sdpa_kernel
        q = args[0]
        sig = (is_self, _mask(args, kwargs) is not None, str(q.dtype), tuple(q.shape[1:]) if is_self else None)
        if sig not in self.refused:
            try:
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    return self.attention(*args, **kwargs)
            except torch.OutOfMemoryError:
                raise
            except RuntimeError as e:
                self.refused[sig] = f"{type(e).__name__}: {e}"[:300]
        kind = "self_attention" if is_self else ("masked" if sig[1] else "other")
        self.fallback[kind] = self.fallback.get(kind, 0) + 1
        return func(*args, **kwargs)

    def report(self) -> dict:
        held = sum(t.untyped_storage().nbytes() for t in self.captured) if self.captured else 0
        return {"calls": self.calls, "self_attention_calls": self.self_calls,
                "captured_qkv_gib": held / GiB,
                "self_attention_batch_sizes": sorted(self.batches),
                "not_cudnn_calls": dict(self.fallback),
                "cudnn_refused": [f"{k}: {v}" for k, v in self.refused.items()]}

    def reset(self):
        self.calls = self.self_calls = 0
        self.batches = set()
        self.fallback = {}


def _blhd_copy(args, kwargs):
    """Copies of one call's q, k, v as (B, L, H, D) views with the model's own strides, so the
    stand-alone kernel reads the same layout as inside the model (HunyuanVideo's single blocks
    hand over v as a view into the fused qkv projection: its rows are strided)."""
    q, k, v = args[0], args[1], args[2]
    heads = _heads(args, kwargs)
    copies = []
    for t in (q, k, v):
        c = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t)
        if kwargs.get("skip_reshape", False):
            c = c.transpose(1, 2)
        else:
            c = c.unflatten(-1, (heads, c.shape[-1] // heads))
        copies.append(c)
    return tuple(copies)


class StubOverride:
    """The video self-attention returns q in the output layout (no attention work at all);
    every other call goes to the dense override."""

    def __init__(self, dense: DenseOverride):
        self.dense = dense
        self.stubbed = 0

    def __deepcopy__(self, memo):
        return self

    def __call__(self, func, *args, **kwargs):
        if not self.dense.is_self(args, kwargs):
            return self.dense(func, *args, **kwargs)
        self.stubbed += 1
        q = args[0]
        if kwargs.get("skip_reshape", False):          # (B, H, L, D)
            if kwargs.get("skip_output_reshape", False):
                return q
            b, h, n, d = q.shape
            return q.transpose(1, 2).reshape(b, n, h * d)
        if kwargs.get("skip_output_reshape", False):   # (B, L, H*D) in, (B, H, L, D) out
            b, n, hd = q.shape
            h = _heads(args, kwargs)
            return q.view(b, n, h, hd // h).transpose(1, 2)
        return q


# ============================================================================ timing

class ForwardTimer:
    """DIFFUSION_MODEL wrapper + sampler callback: time of every diffusion-model forward,
    grouped by sampler step (CUDA events on the GPU, perf_counter on the CPU)."""

    def __init__(self, cuda: bool):
        self.cuda = cuda
        self.steps: list = [[]]     # per step: list of (start, end) events or (t0, t1)
        self.step_wall: list = []
        self.batch: list = []
        self._last = None

    def __deepcopy__(self, memo):
        return self

    def wrapper(self, executor, *args, **kwargs):
        x = args[0] if args else kwargs.get("x")
        if torch.is_tensor(x):
            self.batch.append(int(x.shape[0]))
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = executor(*args, **kwargs)
            end.record()
            self.steps[-1].append((start, end))
        else:
            t0 = time.perf_counter()
            out = executor(*args, **kwargs)
            self.steps[-1].append((t0, time.perf_counter()))
        return out

    def start(self):
        self._sync()
        self._last = time.perf_counter()

    def callback(self, step, x0, x, total_steps):
        self._sync()
        now = time.perf_counter()
        self.step_wall.append(now - self._last)
        self._last = now
        self.steps.append([])

    def _sync(self):
        if self.cuda:
            torch.cuda.synchronize()

    def forward_s(self) -> list:
        """Per completed step: summed diffusion-model forward time in seconds."""
        out = []
        for pairs in self.steps[:len(self.step_wall)]:
            if self.cuda:
                out.append(sum(s.elapsed_time(e) for s, e in pairs) / 1000.0)
            else:
                out.append(sum(t1 - t0 for t0, t1 in pairs))
        return out

    def forwards_per_step(self) -> list:
        return [len(p) for p in self.steps[:len(self.step_wall)]]


def with_timer(model, cuda: bool) -> tuple:
    """A clone with the forward timer as a DIFFUSION_MODEL wrapper. Attach it *before* the
    Sparse Attention Patch node: a clone of a patched model carries a deep copy of the node's
    dispatcher while the wrappers stay bound to the original one."""
    import comfy.patcher_extension as pe

    timer = ForwardTimer(cuda)
    m = model.clone()
    m.add_wrapper_with_key(pe.WrappersMP.DIFFUSION_MODEL, TIMER_KEY, timer.wrapper)
    return m, timer


def run_sampler(model, timer: ForwardTimer, spec: ModelSpec, steps: int, seed: int, cuda: bool,
                keep_output: bool = False) -> tuple:
    """``comfy.sample.sample`` (euler, simple, cfg 5) on ``model`` itself (no clone):
    ``(report, output)``, the output being the final latent on the CPU in float32 with
    ``keep_output`` (copied after the timing), else None."""
    import comfy.sample

    latent = torch.zeros(spec.latent_shape)
    latent = comfy.sample.fix_empty_latent_channels(model, latent)
    noise = comfy.sample.prepare_noise(latent, seed)
    positive, negative = conditioning(spec, seed + 1)
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    timer.start()
    t0 = time.perf_counter()
    out = comfy.sample.sample(model, noise, steps, 5.0, "euler", "simple", positive, negative, latent,
                              seed=seed, callback=timer.callback, disable_pbar=True)
    if cuda:
        torch.cuda.synchronize()
    total = time.perf_counter() - t0
    extra = {"sample_call_s": total, "output_finite": bool(torch.isfinite(out).all())}
    if cuda:
        extra["peak_memory_gib"] = torch.cuda.max_memory_allocated() / GiB
    kept = out.detach().to("cpu", torch.float32) if keep_output else None
    del out
    return extra, kept


def summarize_steps(timer: ForwardTimer, warmup: int) -> dict:
    fwd = timer.forward_s()
    wall = timer.step_wall
    timed = fwd[warmup:]
    d = {"forward_s_per_step": fwd, "step_wall_s": wall, "warmup_steps": warmup,
         "forwards_per_step": timer.forwards_per_step(),
         "diffusion_model_batch_sizes": sorted(set(timer.batch))}
    if timed:
        d["forward_s"] = statistics.median(timed)
        d["step_s"] = statistics.median(wall[warmup:])
        d["forward_s_min"] = min(timed)
        d["forward_s_max"] = max(timed)
    return d
