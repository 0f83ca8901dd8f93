"""Reading what a user typed into a widget, and cutting text the frontend shows."""
from __future__ import annotations

import math
import re

from ._kernels import kernels

# Numbers typed by a user. ASCII only: Python's int() and float() also read other scripts'
# digits ("１" is 1), and \d matches them too.
_INT_TEXT = re.compile(r"[+-]?[0-9]{1,18}", re.ASCII)
_FLOAT_TEXT = re.compile(r"[+-]?(?:[0-9]{1,40}(?:\.[0-9]{0,40})?|\.[0-9]{1,40})(?:[eE][+-]?[0-9]{1,3})?", re.ASCII)


def clip(text: str, limit: int = 80) -> str:
    """``text`` cut to ``limit`` characters (an ellipsis marks the cut)."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def parse_int(text, name: str) -> int:
    """An integer written with ASCII digits (at most 18, optional sign), else a ValueError
    naming ``name``."""
    t = text.strip() if isinstance(text, str) else None
    if t is None or _INT_TEXT.fullmatch(t) is None:
        raise ValueError(f"{name}: expected an integer written with the digits 0-9, got {kernels.shown(text)}")
    return int(t)


def parse_float(text, name: str) -> float:
    """A finite decimal number written with ASCII digits (no nan/inf), else a ValueError
    naming ``name``."""
    t = text.strip() if isinstance(text, str) else None
    if t is None or _FLOAT_TEXT.fullmatch(t) is None or not math.isfinite(float(t)):
        raise ValueError(f"{name}: expected a number written with the digits 0-9, got {kernels.shown(text)}")
    return float(t)
