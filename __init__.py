"""sparse-video-attention: Sol-Attn and PSA sparse attention for video DiTs in ComfyUI.

ComfyUI loads this folder as a custom node pack and calls ``comfy_entrypoint`` (V3 nodes).
Outside ComfyUI (``comfy_api`` missing) only the ``kernels`` package is usable.
"""
try:
    from .nodes.extension import comfy_entrypoint  # noqa: F401
except ImportError as _e:  # not running inside ComfyUI
    if getattr(_e, "name", "") not in ("comfy_api", "comfy_api.latest", "comfy", "typing_extensions"):
        raise
