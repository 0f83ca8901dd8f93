"""Tiny stand-ins for the model files the example workflows load, in the real key layouts.

Used by the workflow tests (tests/comfyui/test_workflows.py), the in-process harness
(tests/comfyui_harness.py) and ``make demo`` (tools/demo.py). Needs ComfyUI importable
(tools/comfyui_server.py ``import_comfy``) before any function here is called.

``write_models(models_dir, family)`` writes, under the *official* file names the workflows
reference, files that ComfyUI's own loaders detect as the real thing:

* diffusion models (UNETLoader, ``models/diffusion_models/``): the state dicts of the models
  ComfyUI's own detection builds from a few tiny shapes (``detected_state_dict``, see
  "Models as ComfyUI's loader makes them"), deterministic random weights, saved as safetensors;
* the Wan 2.1 VAE (VAELoader): ``comfy.ldm.wan.vae.WanVAE`` with a small base ``dim`` (the
  loader reads ``dim`` from ``decoder.head.0.gamma``, so any size is detected);
* the LTX-Video checkpoint (CheckpointLoaderSimple): transformer + VAE in one file with the
  ``config`` metadata entry real LTXV files carry (the loader reads the VAE blocks from it);
* LTX-2.5's separate files (ComfyUI with LTXAV only): the transformer (UNETLoader) with
  LTX-2.3's switches in its ``config`` metadata, the video VAE and the audio VAE (VAELoader:
  LTX-Video's VAE class and LTX-2's audio VAE + vocoder, each sized by its ``config``
  metadata as real files are);
* the HunyuanVideo VAE (VAELoader): the loader builds a fixed-size 3D AutoencoderKL
  (ch 128, ch_mult 1,2,4,4); no smaller file is accepted, so it is written at full size
  (about 246 M parameters, written in bfloat16, cached between runs);
* the Wan 2.2 and HunyuanVideo 1.5 VAEs (VAELoader) stand in as ComfyUI's own light decoders
  for the same latents (``comfy.taesd.taehv.TAEHV``, the taew2_2 and lighttae_hv15 layouts,
  which VAELoader detects by their keys: 48 latent channels, or 32 with a 12-channel last
  layer). The real ones are built at a fixed size, 705 M and 1.26 B parameters, too large for
  the CPU tests; the light decoders decode the same latent at the same 4x16x16 compression,
  but cannot encode (the shipped workflows using them are text-to-video).

Not possible with tiny files (the loaders build fixed-size models from JSON configs inside
ComfyUI and ignore the file's shapes): the UMT5-XXL (Wan), T5-XXL (LTXV), llava-llama-3-8B
+ CLIP-L (HunyuanVideo), Qwen2.5-VL-7B + ByT5 (HunyuanVideo 1.5) and Gemma (LTX-2.5) text
encoders. Runs on tiny files replace CLIPLoader/DualCLIPLoader + CLIPTextEncode by the
stand-in node in ``tools/tiny_text_encode`` (``TEXT_ENCODE_NODE_DIR``; conditioning of the
real shapes, see tools/workflow_api.py ``tiny_run_prompt``).

``standin_preset`` cuts a shipped PSA preset down to a tiny model and grid (needs the
repository root on sys.path, for ``kernels``).
"""
from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

# The custom-node folder of the text-encoder stand-in (linked into custom_nodes/ next to the pack).
TEXT_ENCODE_NODE_DIR = Path(__file__).resolve().parent / "tiny_text_encode"
TEXT_ENCODE_NODE_FOLDER = "svattn_tiny_text_encode"


def init_weights(module, seed: int):
    """Deterministic, well-scaled random weights (ComfyUI's ops skip initialisation)."""
    import torch
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in sorted(module.named_parameters(), key=lambda kv: kv[0]):
            leaf = name.rsplit(".", 1)[-1]
            if p.ndim >= 2 and leaf == "weight":
                fan_in = math.prod(p.shape[1:])
                p.copy_(torch.randn(p.shape, generator=gen) / math.sqrt(fan_in))
            elif p.ndim == 1 and ("norm" in name or leaf == "scale") and leaf in ("weight", "scale"):
                p.copy_(1.0 + 0.05 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(0.02 * torch.randn(p.shape, generator=gen))


# --------------------------------------------------------------------------------------------
# Models as ComfyUI's loader makes them
# --------------------------------------------------------------------------------------------
# A tiny model is built the way ComfyUI builds a real one from a file: comfy.model_detection
# turns the shapes it reads from a state dict into the constructor arguments (its own
# defaults for everything else, e.g. HunyuanVideo's ``meanflow_sum`` since 0.8), and the
# supported model config's ``get_model`` picks the class and builds it. The *seed* is what
# detection reads: a few tensors of the tiny shapes on the meta device (keys it only tests
# for existence get a placeholder shape) plus, where real files carry one, the ``config``
# metadata entry. The model built from the seed gives the complete state dict in the real
# key layout. So the tests never hold a copy of a constructor's parameter list: a ComfyUI
# that adds or renames one builds the tiny models as it builds real ones.

def _meta(*shape):
    import torch
    return torch.empty(shape, device="meta")


def wan_seed(*, dim: int = 128, num_layers: int = 2, ffn_dim: int | None = None, in_dim: int = 16,
             out_dim: int = 16, i2v: bool = False) -> dict:
    """Wan 2.1 / 2.2 (patch 1x2x2). Detection reads dim from head.modulation (heads = dim // 128),
    out_dim from head.head, ffn_dim and the block count from blocks.N.ffn.0, in_dim from
    patch_embedding; img_emb.proj.0.bias makes it i2v (CLIP image cross-attention). Wan 2.2
    TI2V 5B: ``in_dim = out_dim = 48`` (its 48-channel latent), which detection makes
    WAN22_T2V (model_base WAN22: an image goes in as the first latent frame, not as channels)."""
    sd = {"head.modulation": _meta(1, 2, dim), "head.head.weight": _meta(out_dim * 4, dim),
          "patch_embedding.weight": _meta(dim, in_dim, 1, 2, 2)}
    for i in range(num_layers):
        sd[f"blocks.{i}.ffn.0.weight"] = _meta(ffn_dim or 2 * dim, dim)
    if i2v:
        sd["img_emb.proj.0.bias"] = _meta(1280)
    return sd


def hunyuan_video_seed(*, hidden_size: int = 128, depth: int = 1, depth_single_blocks: int = 1,
                       in_channels: int = 16, out_channels: int = 16, text_dim: int = 4096) -> dict:
    """HunyuanVideo T2V (patch 1x2x2, llava-llama text 4096, CLIP-L pooled vector, guidance).
    Detection reads hidden size and patch from img_in.proj (heads = hidden // 128), the block
    counts from double_blocks.N / single_blocks.N, text width from txt_in.input_embedder;
    vector_in.* and guidance_in.* switch on the pooled vector and the guidance embedding."""
    sd = _hunyuan_video_blocks(hidden_size, depth, depth_single_blocks, in_channels, out_channels, (1, 2, 2),
                               text_dim)
    sd["vector_in.in_layer.weight"] = _meta(hidden_size, 768)
    sd["guidance_in.in_layer.weight"] = _meta(hidden_size, 256)
    return sd


def hunyuan_video15_seed(*, hidden_size: int = 128, depth: int = 2, depth_single_blocks: int = 0) -> dict:
    """HunyuanVideo 1.5 (the 8.3B: hidden 2048, 16 heads, 54 double blocks and no single ones).
    Patch 1x1x1 on the 32-channel latent of its 16x VAE, input 65 channels (noise 32 + image
    latent 32 + mask 1, the same file for t2v and i2v), Qwen2.5-VL text 3584, no pooled vector
    and no guidance embedding. vision_in.proj.0 (the SigLIP width, 1152) makes detection pick
    HunyuanVideo15; cond_type_embedding and byt5_in (the glyph text of ByT5, 1472) are there
    as in the released files."""
    sd = _hunyuan_video_blocks(hidden_size, depth, depth_single_blocks, 65, 32, (1, 1, 1), 3584)
    sd["vision_in.proj.0.weight"] = _meta(1152)
    sd["cond_type_embedding.weight"] = _meta(3, hidden_size)
    sd["byt5_in.fc1.weight"] = _meta(2048, 1472)
    return sd


def _hunyuan_video_blocks(hidden_size, depth, depth_single_blocks, in_channels, out_channels, patch, text_dim):
    """The keys every HunyuanVideo file has: the text refiner, the patch embedding and final
    layer, the text input width and the double / single blocks."""
    sd = {"txt_in.individual_token_refiner.blocks.0.norm1.weight": _meta(hidden_size),
          "img_in.proj.weight": _meta(hidden_size, in_channels, *patch),
          "final_layer.linear.weight": _meta(out_channels * math.prod(patch), hidden_size),
          "txt_in.input_embedder.weight": _meta(hidden_size, text_dim)}
    for i in range(depth):
        sd[f"double_blocks.{i}.img_attn.qkv.weight"] = _meta(3 * hidden_size, hidden_size)
    for i in range(depth_single_blocks):
        sd[f"single_blocks.{i}.linear1.weight"] = _meta(hidden_size, hidden_size)
    return sd


def ltxv_seed(*, num_layers: int = 2, num_heads: int = 32, head_dim: int = 8,
              cross_dim: int | None = None) -> tuple[dict, dict | None]:
    """LTX-Video 0.9. Detection reads the block count from transformer_blocks.N and assumes 32
    heads (head_dim = attn2.to_k rows // 32, cross dim = its columns); real files carry a
    ``config`` metadata entry whose ``transformer`` part overrides that, so other head
    counts come with such metadata, as UNETLoader passes it from the file."""
    inner = num_heads * head_dim
    sd = {"adaln_single.emb.timestep_embedder.linear_1.bias": _meta(inner)}
    for i in range(num_layers):
        sd[f"transformer_blocks.{i}.attn2.to_k.weight"] = _meta(inner, cross_dim or inner)
    metadata = None
    if num_heads != 32:
        metadata = {"config": json.dumps({"transformer": {"num_attention_heads": num_heads,
                                                          "attention_head_dim": head_dim}})}
    return sd, metadata


# The switches of LTX-2.3's released ``config`` metadata (transformer part): per-head gates on
# every attention output, AdaLN modulation of the text cross-attention (with its own prompt
# AdaLN), and the text projection moved into the text encoder (its dual projection gives
# video and audio contexts of the cross-attention widths, which reach the connectors
# unchanged). LTX-2.5 files carry the same tensors (per-head gate logits in all six
# attentions, audio_prompt_adaln_single); both load as ComfyUI's LTXAV.
LTX23_SWITCHES = {"apply_gated_attention": True, "connector_apply_gated_attention": True,
                  "cross_attention_adaln": True, "caption_proj_before_connector": True,
                  "caption_projection_first_linear": False}


def ltx2_seed(*, num_layers: int = 2, num_heads: int = 2, head_dim: int = 32, audio_heads: int = 2,
              audio_head_dim: int = 16, caption_channels: int = 64, connector_heads: int = 2,
              connector_layers: int = 1, ltx23: bool = False) -> tuple[dict, dict]:
    """LTX-2 audio-video (ComfyUI with comfy/ldm/lightricks/av_model.py). Detection sees LTXV
    keys plus audio_adaln_single.* and reads only the block count, head dim (as LTXV) and
    cross dim; a real LTX-2 file gives every size in its ``config`` metadata, and so does
    the seed: video and audio heads, the text width (caption channels, which the text
    connectors keep: connector heads x head dim = caption channels) and the connector depth.
    ``ltx23``: LTX-2.3 / 2.5 (``LTX23_SWITCHES``); the connectors then take the video and
    audio contexts at the cross-attention widths (video and audio heads x head dim)."""
    inner, audio_inner = num_heads * head_dim, audio_heads * audio_head_dim
    sd = {"adaln_single.emb.timestep_embedder.linear_1.bias": _meta(inner),
          "audio_adaln_single.linear.weight": _meta(6 * audio_inner, audio_inner)}
    for i in range(num_layers):
        sd[f"transformer_blocks.{i}.attn2.to_k.weight"] = _meta(inner, inner)
    transformer = {"num_attention_heads": num_heads, "attention_head_dim": head_dim,
                   "audio_num_attention_heads": audio_heads, "audio_attention_head_dim": audio_head_dim,
                   "audio_cross_attention_dim": audio_inner,
                   "caption_channels": caption_channels, "connector_num_attention_heads": connector_heads,
                   "connector_attention_head_dim": caption_channels // connector_heads,
                   "connector_num_layers": connector_layers}
    if ltx23:
        transformer.update(LTX23_SWITCHES, connector_attention_head_dim=inner // connector_heads,
                           audio_connector_num_attention_heads=connector_heads,
                           audio_connector_attention_head_dim=audio_inner // connector_heads)
    return sd, {"config": json.dumps({"transformer": transformer})}


def detected_model(seed_sd: dict, metadata: dict | None = None):
    """``(model_config, diffusion_model)``: what ComfyUI's detection and ``get_model`` make of a
    seed (the model on the CPU, weights uninitialised)."""
    import comfy.model_detection
    model_config = comfy.model_detection.model_config_from_unet(seed_sd, "", metadata=metadata)
    if model_config is None:
        raise RuntimeError(f"ComfyUI's model detection did not recognise the seed state dict "
                           f"(keys {sorted(seed_sd)[:6]}...)")
    return model_config, model_config.get_model(seed_sd, "").diffusion_model


def detected_state_dict(seed_sd: dict, seed: int, metadata: dict | None = None, dtype=None) -> dict:
    """The complete state dict (real key layout, init_weights) of the model ComfyUI builds
    from ``seed_sd`` (see ``detected_model``)."""
    return _module_state_dict(lambda: detected_model(seed_sd, metadata)[1], seed, dtype)


# Official file names (Comfy-Org repackaged releases / Lightricks), as the workflows use them.
FILES = {
    "wan21_t2v": {
        "diffusion_models": ["wan2.1_t2v_14B_fp8_e4m3fn.safetensors"],
        "vae": ["wan_2.1_vae.safetensors"],
    },
    "wan22_i2v": {
        "diffusion_models": ["wan2.2_i2v_high_noise_14B_fp8_scaled.safetensors",
                             "wan2.2_i2v_low_noise_14B_fp8_scaled.safetensors"],
        "vae": ["wan_2.1_vae.safetensors"],
    },
    "hunyuan_video": {
        "diffusion_models": ["hunyuan_video_t2v_720p_bf16.safetensors"],
        "vae": ["hunyuan_video_vae_bf16.safetensors"],
    },
    "ltxv": {
        "checkpoints": ["ltx-video-2b-v0.9.5.safetensors"],
    },
    "wan22_ti2v": {
        "diffusion_models": ["wan2.2_ti2v_5B_fp16.safetensors"],
        "vae": ["wan2.2_vae.safetensors"],
    },
    "hunyuan_video15": {
        "diffusion_models": ["hunyuanvideo1.5_720p_t2v_fp16.safetensors"],
        "vae": ["hunyuanvideo15_vae_fp16.safetensors"],
    },
    "ltx25": {  # ComfyUI with LTXAV only (ltx2_available in tests/comfyui_harness.py)
        "diffusion_models": ["ltx-2.5-22b-distilled-transformer-comfy-int8-convrot.safetensors"],
        "vae": ["ltx-2.5-video-vae-bf16.safetensors", "ltx-2.5-audio-vae-bf16.safetensors"],
    },
}

# The text-encoder files the workflows name; they are not written (see module docstring).
TEXT_ENCODER_FILES = {
    "wan": ["umt5_xxl_fp8_e4m3fn_scaled.safetensors"],
    "hunyuan_video": ["clip_l.safetensors", "llava_llama3_fp8_scaled.safetensors"],
    "ltxv": ["t5xxl_fp16.safetensors"],
    "hunyuan_video15": ["qwen_2.5_vl_7b_fp8_scaled.safetensors", "byt5_small_glyphxl_fp16.safetensors"],
    "ltx25": ["gemma4-12b-with-proj-ltx-2.5-comfy-int8-convrot.safetensors"],
}


def _save(sd: dict, path: Path, metadata: dict | None = None):
    from safetensors.torch import save_file
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp), metadata=metadata)
    tmp.replace(path)


# Buffers that ComfyUI's constructors allocate with torch.empty and real files fill: the LTX
# VAEs' per-channel latent statistics (the last three only before ComfyUI 0.33). The tiny
# files hold the identity normalisation (means 0, standard deviations 1; the channel index,
# which decoding does not read, 0).
LATENT_STATISTICS = {"mean-of-means": 0.0, "std-of-means": 1.0, "mean-of-stds": 1.0,
                     "mean-of-stds_over_std-of-means": 1.0, "channel": 0.0}


@contextlib.contextmanager
def _uninitialised_memory_as_nan():
    """Inside, torch.empty fills floats with NaN (PyTorch's deterministic mode), so a buffer
    that a constructor leaves for the file to fill shows instead of carrying whatever the
    allocator's memory held: that made a tiny file differ from run to run."""
    import torch
    import torch.utils.deterministic
    was_deterministic, was_filling = torch.are_deterministic_algorithms_enabled(), \
        torch.utils.deterministic.fill_uninitialized_memory
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    torch.use_deterministic_algorithms(True)
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(was_deterministic, warn_only=warn_only)
        torch.utils.deterministic.fill_uninitialized_memory = was_filling


def _module_state_dict(build, seed: int, dtype=None) -> dict:
    """The state dict of the module ``build()`` makes, after init_weights and with identity
    statistics, as contiguous copies (floats cast to ``dtype``). Raises if any float is not
    finite: a buffer left uninitialised (``LATENT_STATISTICS`` lacks its name)."""
    import torch
    with _uninitialised_memory_as_nan():
        module = build()
    init_weights(module, seed)
    with torch.no_grad():
        for name, buf in module.named_buffers():
            value = LATENT_STATISTICS.get(name.rsplit(".", 1)[-1])
            if value is not None:
                buf.fill_(value)
    sd = {k: (v.detach().to(dtype) if dtype is not None and v.is_floating_point() else v.detach())
          .clone().contiguous() for k, v in module.state_dict().items()}
    unset = [k for k, v in sd.items() if v.is_floating_point() and not torch.isfinite(v).all()]
    if unset:
        raise RuntimeError(f"{type(module).__name__}: {unset} not finite after init_weights: a buffer its "
                           f"constructor leaves for the file to fill (add it to LATENT_STATISTICS)")
    return sd


def wan22_i2v_state_dict(seed: int) -> dict:
    """Wan 2.2 I2V A14B layout: i2v input width (in_dim 36) but no CLIP image embedding, so
    ComfyUI detects it as WAN21_T2V like the real A14B files."""
    return detected_state_dict(wan_seed(dim=128, num_layers=2, in_dim=36), seed)


def light_video_decoder_state_dict(latent_channels: int, seed: int = 0) -> dict:
    """ComfyUI's light video decoder (``comfy.taesd.taehv.TAEHV``) for a 48-channel (Wan 2.2) or
    32-channel (HunyuanVideo 1.5) latent, the stand-in for that model's fixed-size VAE."""
    import comfy.taesd.taehv
    return _module_state_dict(lambda: comfy.taesd.taehv.TAEHV(latent_channels=latent_channels), seed)


def wan_vae_state_dict(seed: int = 0, dim: int = 16) -> dict:
    import comfy.ldm.wan.vae
    return _module_state_dict(lambda: comfy.ldm.wan.vae.WanVAE(
        dim=dim, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
        temperal_downsample=[False, True, True], dropout=0.0), seed)


# LTXV VAE with the smallest block list that still compresses 8x in time and 32x in space
# (patch 4 x three compress_all) plus the res_x block whose key VAELoader detects LTXV by;
# ComfyUI takes the blocks from the checkpoint's metadata.
LTXV_TINY_VAE_CONFIG = {
    "_class_name": "CausalVideoAutoencoder", "dims": 3, "in_channels": 3, "out_channels": 3,
    "latent_channels": 128,
    "blocks": [["compress_all", 1], ["compress_all", 1], ["compress_all", 1], ["res_x", 1]],
    "scaling_factor": 1.0, "norm_layer": "pixel_norm", "patch_size": 4, "latent_log_var": "uniform",
    "use_quant_conv": False, "causal_decoder": False,
}
LTXV_TINY_TRANSFORMER = {"num_attention_heads": 2, "attention_head_dim": 64, "num_layers": 2}


def ltx_video_vae_state_dict(seed: int) -> dict:
    """The LTX video VAE (``VideoVAE``) in the small LTXV_TINY_VAE_CONFIG, identity latent
    statistics; its loaders read that config from the file's ``config`` metadata (``vae``)."""
    import comfy.ldm.lightricks.vae.causal_video_autoencoder as cva
    return _module_state_dict(lambda: cva.VideoVAE(version=0, config=dict(LTXV_TINY_VAE_CONFIG)), seed)


def ltxv_checkpoint(seed: int) -> tuple[dict, dict]:
    t = LTXV_TINY_TRANSFORMER
    seed_sd, _ = ltxv_seed(num_layers=t["num_layers"], num_heads=t["num_attention_heads"],
                           head_dim=t["attention_head_dim"])
    # the checkpoint's own metadata (below) carries the transformer part, as real LTXV files do
    dm = detected_state_dict(seed_sd, seed, {"config": json.dumps({"transformer": dict(t)})})
    vsd = ltx_video_vae_state_dict(seed + 1)
    sd = {f"model.diffusion_model.{k}": v for k, v in dm.items()}
    sd.update({f"vae.{k}": v for k, v in vsd.items()})
    metadata = {"config": json.dumps({"transformer": dict(t), "vae": dict(LTXV_TINY_VAE_CONFIG)})}
    return sd, metadata


# LTX-2's audio VAE (mel autoencoder + vocoder) in a small configuration, read by its loader
# from the file's ``config`` metadata as in real files: 16 kHz, hop 160, 64 mel bins (8 latent
# channels x 16 frequency bins: what the diffusion model's audio stream takes), base width 8,
# and a HiFi-GAN vocoder whose upsampling (5 x 4 x 2 x 2 x 2 = 160) undoes the hop.
LTX_TINY_AUDIO_VAE_CONFIG = {
    "audio_vae": {"model": {"params": {"ddconfig": {
        "double_z": True, "mel_bins": 64, "z_channels": 8, "resolution": 256, "downsample_time": False,
        "in_channels": 2, "out_ch": 2, "ch": 8, "ch_mult": [1, 2, 4], "num_res_blocks": 1, "attn_resolutions": [],
        "dropout": 0.0, "mid_block_add_attention": False, "norm_type": "pixel", "causality_axis": "height"},
        "sampling_rate": 16000}}, "preprocessing": {"stft": {"filter_length": 1024, "hop_length": 160}}},
    "vocoder": {"upsample_initial_channel": 64, "resblock": "1", "upsample_rates": [5, 4, 2, 2, 2],
                "upsample_kernel_sizes": [16, 16, 8, 4, 4], "resblock_kernel_sizes": [3],
                "resblock_dilation_sizes": [[1, 3, 5]], "stereo": True},
}
# The tiny LTX-2.5 transformer of write_models: LTX-2.3's switches, 2 heads x 32 for video and
# 2 x 16 for audio, so its text encoder's dual projection is 2 x 32 + 2 x 16 = 96 wide.
LTX25_TINY = dict(num_layers=2, num_heads=2, head_dim=32, audio_heads=2, audio_head_dim=16, ltx23=True)


def ltx_audio_vae_state_dict(seed: int) -> tuple[dict, dict]:
    """(state dict, metadata) of LTX_TINY_AUDIO_VAE_CONFIG's audio VAE in the file layout its
    loaders read: ``audio_vae.*`` (the autoencoder) and ``vocoder.*``."""
    from comfy.ldm.lightricks.vae.audio_vae import AudioVAE
    metadata = {"config": json.dumps(LTX_TINY_AUDIO_VAE_CONFIG)}
    sd = _module_state_dict(lambda: AudioVAE(metadata=metadata), seed)
    return {("audio_vae." + k[len("autoencoder."):] if k.startswith("autoencoder.") else k): v
            for k, v in sd.items()}, metadata


def hunyuan_vae_state_dict(seed: int = 0) -> dict:
    """The HunyuanVideo VAE at the size VAELoader builds for it (fixed config), bfloat16."""
    import torch
    from comfy.ldm.models.autoencoder import AutoencoderKL
    ddconfig = {'double_z': True, 'z_channels': 16, 'resolution': 256, 'in_channels': 3, 'out_ch': 3, 'ch': 128,
                'ch_mult': [1, 2, 4, 4], 'num_res_blocks': 2, 'attn_resolutions': [], 'dropout': 0.0,
                'conv3d': True, 'time_compress': 4}
    return _module_state_dict(lambda: AutoencoderKL(ddconfig=ddconfig, embed_dim=16), seed, dtype=torch.bfloat16)


def wan_hidden_size(heads: int) -> int:
    """The Wan stand-in's width for ``heads`` heads: ComfyUI's detection reads heads = dim // 128."""
    return 128 * heads


def write_models(models_dir: Path, family: str, cache_dir: Path | None = None, *, wan_layers: int = 2,
                 wan_heads: int = 1, wan_vae_dim: int = 16) -> list[Path]:
    """Write the tiny files of ``family`` (a key of FILES) under ``models_dir``; return them.

    ``wan_layers``/``wan_heads``/``wan_vae_dim``: size of the Wan 2.1 T2V stand-in (head dim
    128, the real one) and of its VAE's base width."""
    models_dir = Path(models_dir)
    written = []
    if family == "wan21_t2v":
        sd = detected_state_dict(wan_seed(dim=wan_hidden_size(wan_heads), num_layers=wan_layers), 0)
        written.append(models_dir / "diffusion_models" / FILES[family]["diffusion_models"][0])
        _save(sd, written[-1])
        written.append(models_dir / "vae" / FILES[family]["vae"][0])
        _save(wan_vae_state_dict(dim=wan_vae_dim), written[-1])
    elif family == "wan22_i2v":
        for i, name in enumerate(FILES[family]["diffusion_models"]):
            written.append(models_dir / "diffusion_models" / name)
            _save(wan22_i2v_state_dict(10 + i), written[-1])
        written.append(models_dir / "vae" / FILES[family]["vae"][0])
        _save(wan_vae_state_dict(), written[-1])
    elif family == "hunyuan_video":
        sd = detected_state_dict(hunyuan_video_seed(hidden_size=128, depth=1, depth_single_blocks=1), 0)
        written.append(models_dir / "diffusion_models" / FILES[family]["diffusion_models"][0])
        _save(sd, written[-1])
        vae_path = models_dir / "vae" / FILES[family]["vae"][0]
        cached = Path(cache_dir) / "hunyuan_video_vae_full_size_random.safetensors" if cache_dir else None
        if cached is not None and cached.is_file():
            vae_path.parent.mkdir(parents=True, exist_ok=True)
            if not vae_path.exists():
                vae_path.symlink_to(cached)
        else:
            _save(hunyuan_vae_state_dict(), cached or vae_path)
            if cached is not None and not vae_path.exists():
                vae_path.parent.mkdir(parents=True, exist_ok=True)
                vae_path.symlink_to(cached)
        written.append(vae_path)
    elif family == "ltxv":
        sd, metadata = ltxv_checkpoint(0)
        written.append(models_dir / "checkpoints" / FILES[family]["checkpoints"][0])
        _save(sd, written[-1], metadata=metadata)
    elif family in ("wan22_ti2v", "hunyuan_video15"):
        seed_sd, latent_channels = ((wan_seed(dim=128, num_layers=2, in_dim=48, out_dim=48), 48) if family == "wan22_ti2v"
                                    else (hunyuan_video15_seed(hidden_size=128, depth=2), 32))
        written.append(models_dir / "diffusion_models" / FILES[family]["diffusion_models"][0])
        _save(detected_state_dict(seed_sd, 0), written[-1])
        written.append(models_dir / "vae" / FILES[family]["vae"][0])
        _save(light_video_decoder_state_dict(latent_channels), written[-1])
    elif family == "ltx25":
        seed_sd, metadata = ltx2_seed(**LTX25_TINY)
        written.append(models_dir / "diffusion_models" / FILES[family]["diffusion_models"][0])
        _save(detected_state_dict(seed_sd, 0, metadata), written[-1], metadata=metadata)
        video_vae, audio_vae = (models_dir / "vae" / name for name in FILES[family]["vae"])
        _save(ltx_video_vae_state_dict(1), video_vae, metadata={"config": json.dumps({"vae": LTXV_TINY_VAE_CONFIG})})
        sd, metadata = ltx_audio_vae_state_dict(2)
        _save(sd, audio_vae, metadata=metadata)
        written += [video_vae, audio_vae]
    else:
        raise KeyError(family)
    return written


def standin_preset(shipped: Path, *, layers: int, heads: int, hidden_size: int, grid, tile, head_dim: int | None = None):
    """A PSA preset for a tiny stand-in model, from a shipped one: its masks of layers
    0..layers-1 and heads 0..heads-1, rescaled from its block grid to that of ``grid`` / ``tile``
    (kernels.preset_file.rescale_params: widths, offsets and strides scaled per axis), under the
    stand-in's fingerprint (``head_dim``: the stand-in's, if not the shipped model's). The
    workflows' tiny runs save it under the shipped file's name in
    models/sparse_attention_presets/, which the preset loader searches first."""
    import torch
    from kernels.preset_file import Preset, load_preset, rescale_params
    from kernels.psa_mask import block_grid_of, psa_mask
    src = load_preset(shipped)
    new_bg = block_grid_of(grid, tile)
    params = rescale_params(src.params[:, :layers, :heads], src.block_grid, new_bg)
    sparsity = torch.tensor([[psa_mask(grid, params[b, layer], tile).sparsity().mean().item()
                              for layer in range(layers)] for b in range(params.shape[0])], dtype=torch.float64)
    return Preset(
        name=f"{src.name}_standin"[:64], family=src.family, model_name=f"tiny stand-in for {src.model_name}",
        fingerprint={"layers": layers, "heads": heads, "head_dim": head_dim or src.fingerprint["head_dim"],
                     "hidden_size": hidden_size},
        grid=tuple(grid), tile=tuple(tile), params=params, bucket_edges=list(src.bucket_edges), source=src.source,
        search=dict(src.search),
        stats={"sparsity": float(sparsity.mean()), "mean_loss": None,
               "layer_sparsity": [float(x) for x in sparsity.mean(dim=0)]},
        author=src.author,
        notes=f"Stand-in for a tiny test model, not for a real one: the masks of layers 0-{layers - 1} and heads "
              f"0-{heads - 1} of the shipped preset {src.name} (block grid {src.block_grid}, tile {tuple(src.tile)}), "
              f"rescaled to block grid {new_bg} (tile {tuple(tile)}) by tools/tiny_models.py.",
        created=src.created)


def param_count(sd: dict) -> int:
    return sum(math.prod(v.shape) for v in sd.values())
