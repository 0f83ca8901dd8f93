"""Stand-in for text encoders that cannot be made tiny (tests and ``make demo`` only).

ComfyUI 0.3.75 builds the UMT5-XXL (Wan), T5-XXL (LTX-Video), llava-llama-3-8B + CLIP-L
(HunyuanVideo) and Qwen2.5-VL-7B + ByT5 (HunyuanVideo 1.5) text encoders at full size from
JSON configs inside ComfyUI, whatever the file holds, so no tiny file can replace them. When an example workflow runs on tiny stand-in model
files (tests/comfyui/test_workflows.py, tools/demo.py), each CLIPLoader/DualCLIPLoader +
CLIPTextEncode is swapped for this node (tools/workflow_api.py ``tiny_run_prompt``), which
returns CONDITIONING of the shapes those encoders produce (deterministic in the text).
Everything else in the workflow runs as shipped. Never installed into a user's ComfyUI: it is
linked into a temporary custom_nodes/ folder only for such runs.
"""
import hashlib

import torch

# CLIPLoader/DualCLIPLoader "type" -> the width of what the real encoder hands the sampler
# (umT5, T5, llava, Qwen2.5-VL). "ltxav": LTX-2.3 / 2.5's Gemma encoder (CLIPLoader type "ltxv"
# with an LTX-2 text encoder file), whose dual projection gives the model's video + audio
# cross-attention widths: 96 for the tiny LTX-2.5 of tools/tiny_models.py (LTX25_TINY).
WIDTHS = {"wan": 4096, "ltxv": 4096, "hunyuan_video": 4096, "hunyuan_video_15": 3584, "ltxav": 96}
ENCODERS = list(WIDTHS)


class SVATestTextEncode:
    @classmethod
    def INPUT_TYPES(cls):
        return {"required": {"text": ("STRING", {"multiline": True}),
                             "encoder": (ENCODERS,),
                             "tokens": ("INT", {"default": 16, "min": 1, "max": 512})}}

    RETURN_TYPES = ("CONDITIONING",)
    FUNCTION = "encode"
    CATEGORY = "testing"

    def encode(self, text, encoder, tokens):
        seed = int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little")
        gen = torch.Generator().manual_seed(seed)
        cond = torch.randn(1, tokens, WIDTHS[encoder], generator=gen)
        extra = {}
        if encoder == "hunyuan_video":
            extra["pooled_output"] = torch.randn(1, 768, generator=gen)  # CLIP-L pooled
        elif encoder == "hunyuan_video_15":
            extra["pooled_output"] = None  # no pooled vector (HunyuanVideo 1.5 has no vector_in); no glyph text
        elif encoder == "ltxav":
            extra["unprocessed_ltxav_embeds"] = True  # the model's connectors take it from here
        elif encoder == "ltxv":
            extra["attention_mask"] = torch.ones(1, tokens, dtype=torch.long)  # T5 attention mask
        return ([[cond, extra]],)


NODE_CLASS_MAPPINGS = {"SVATestTextEncode": SVATestTextEncode}
