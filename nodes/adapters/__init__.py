"""Model-family adapters; :func:`adapter_for` picks the one for a diffusion model."""
from __future__ import annotations

from typing import Optional

from .base import Adapter, ModelInfo
from .hunyuan_video import HunyuanVideoAdapter
from .ltx2 import LTX2Adapter
from .ltxv import LTXVAdapter
from .wan import WanAdapter

# LTX-2 before LTX-Video: its model class subclasses LTXVModel.
ADAPTERS = (WanAdapter, HunyuanVideoAdapter, LTX2Adapter, LTXVAdapter)


def adapter_for(dm) -> Optional[Adapter]:
    for cls in ADAPTERS:
        if cls.matches(dm):
            return cls()
    return None


__all__ = ["Adapter", "ModelInfo", "adapter_for", "ADAPTERS"]
