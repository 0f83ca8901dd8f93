"""sparse-video-attention: Sol-Attn and PSA sparse attention for video DiTs in ComfyUI.

ComfyUI loads this folder as a custom node pack (a package named after the folder) and calls
``comfy_entrypoint`` (V3 nodes, the only registration style used). Imported any other way
(e.g. as a plain module by a test runner), it defines nothing.
"""
if __package__:
    try:
        from .nodes.extension import comfy_entrypoint  # noqa: F401
    except ImportError as _e:  # outside ComfyUI: comfy_api is missing
        if not str(getattr(_e, "name", "") or "").startswith(("comfy", "typing_extensions")):
            raise
