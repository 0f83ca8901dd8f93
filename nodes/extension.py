"""The pack's V3 entry point (the only registration style used)."""
from __future__ import annotations

from typing_extensions import override

from comfy_api.latest import ComfyExtension, io

from .node_inspector import SparseAttentionInspector
from .node_patch import SparseAttentionPatch
from .node_preset import LoadStripeMaskPreset
from .node_search import PSAMaskSearch, PSAMaskSelect
from .presets import register_folder
from .search import register_folders as register_search_folders


class SparseVideoAttentionExtension(ComfyExtension):
    @override
    async def get_node_list(self) -> list[type[io.ComfyNode]]:
        return [SparseAttentionPatch, LoadStripeMaskPreset, PSAMaskSearch, PSAMaskSelect,
                SparseAttentionInspector]


async def comfy_entrypoint() -> SparseVideoAttentionExtension:
    register_folder()
    register_search_folders()
    return SparseVideoAttentionExtension()
