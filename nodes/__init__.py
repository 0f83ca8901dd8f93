"""ComfyUI side of the pack: nodes, dispatcher and model adapters.

Import-light on purpose: importing this package does not import ComfyUI; the node modules
do (``comfy_api``), and the root ``__init__`` imports them only when ComfyUI loads the pack.
"""
