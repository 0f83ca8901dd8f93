"""Small raster drawing for the inspector: heatmaps, mask tiles, a 3×5 pixel font.

numpy only (no matplotlib, no PIL). Images are float32 (H, W, 3) arrays in [0, 1]; the
inspector stacks them into ComfyUI IMAGE tensors (B, H, W, 3).
"""
from __future__ import annotations

import math

import numpy as np

BACKGROUND = (0.10, 0.10, 0.11)
INK = (0.92, 0.92, 0.90)
MISSING = (0.32, 0.32, 0.34)     # cells with no sparse call (dense by rule)

# Density colour ramp, low → high: deep blue, teal, green, yellow, near white.
_RAMP = np.array([
    [0.13, 0.11, 0.36],
    [0.10, 0.40, 0.58],
    [0.20, 0.66, 0.50],
    [0.80, 0.84, 0.25],
    [0.99, 0.97, 0.80],
], dtype=np.float32)

# 3×5 glyphs, rows top to bottom, "#" = ink.
_GLYPHS = {
    "0": "### #.# #.# #.# ###", "1": ".#. ##. .#. .#. ###", "2": "### ..# ### #.. ###",
    "3": "### ..# .## ..# ###", "4": "#.# #.# ### ..# ..#", "5": "### #.. ### ..# ###",
    "6": "### #.. ### #.# ###", "7": "### ..# .#. .#. .#.", "8": "### #.# ### #.# ###",
    "9": "### #.# ### ..# ###", ".": "... ... ... ... .#.", "%": "#.# ..# .#. #.. #.#",
    "-": "... ... ### ... ...", ":": "... .#. ... .#. ...", "/": "..# ..# .#. #.. #..",
    "(": ".#. #.. #.. #.. .#.", ")": ".#. ..# ..# ..# .#.", ",": "... ... ... .#. #..",
    "=": "... ### ... ### ...", " ": "... ... ... ... ...", "?": "### ..# .## ... .#.",
    "_": "... ... ... ... ###", "+": "... .#. ### .#. ...",
    "A": ".#. #.# ### #.# #.#", "B": "##. #.# ##. #.# ##.", "C": ".## #.. #.. #.. .##",
    "D": "##. #.# #.# #.# ##.", "E": "### #.. ##. #.. ###", "F": "### #.. ##. #.. #..",
    "G": ".## #.. #.# #.# .##", "H": "#.# #.# ### #.# #.#", "I": "### .#. .#. .#. ###",
    "J": "..# ..# ..# #.# .#.", "K": "#.# #.# ##. #.# #.#", "L": "#.. #.. #.. #.. ###",
    "M": "#.# ### ### #.# #.#", "N": "##. #.# #.# #.# #.#", "O": ".#. #.# #.# #.# .#.",
    "P": "##. #.# ##. #.. #..", "Q": ".#. #.# #.# ##. .##", "R": "##. #.# ##. #.# #.#",
    "S": ".## #.. .#. ..# ##.", "T": "### .#. .#. .#. .#.", "U": "#.# #.# #.# #.# ###",
    "V": "#.# #.# #.# #.# .#.", "W": "#.# #.# ### ### #.#", "X": "#.# #.# .#. #.# #.#",
    "Y": "#.# #.# .#. .#. .#.", "Z": "### ..# .#. #.. ###",
}
_FONT = {c: np.array([[ch == "#" for ch in row] for row in g.split()], dtype=bool)
         for c, g in _GLYPHS.items()}


def colormap(values: np.ndarray, vmin: float = 0.0, vmax: float = 1.0) -> np.ndarray:
    """RGB (..., 3) of ``values`` on the density ramp; NaN → :data:`MISSING`."""
    v = np.asarray(values, dtype=np.float64)
    t = np.clip((v - vmin) / max(vmax - vmin, 1e-12), 0.0, 1.0)
    t = np.nan_to_num(t, nan=0.0)
    pos = t * (len(_RAMP) - 1)
    i = np.minimum(np.floor(pos).astype(int), len(_RAMP) - 2)
    f = (pos - i)[..., None]
    rgb = _RAMP[i] * (1 - f) + _RAMP[i + 1] * f
    rgb[np.isnan(v)] = MISSING
    return rgb.astype(np.float32)


def canvas(h: int, w: int, color=BACKGROUND) -> np.ndarray:
    img = np.empty((h, w, 3), dtype=np.float32)
    img[:] = color
    return img


def text_width(s: str, scale: int = 1) -> int:
    return max(0, 4 * len(s) - 1) * scale


def draw_text(img: np.ndarray, x: int, y: int, s: str, scale: int = 1, color=INK) -> None:
    """Draw ``s`` (upper-cased; unknown characters as '?') with its top-left at (x, y)."""
    for n, ch in enumerate(str(s).upper()):
        g = _FONT.get(ch, _FONT["?"])
        g = np.repeat(np.repeat(g, scale, 0), scale, 1)
        x0 = x + n * 4 * scale
        y1, x1 = min(img.shape[0], y + g.shape[0]), min(img.shape[1], x0 + g.shape[1])
        if x0 >= img.shape[1] or y >= img.shape[0] or x0 < 0 or y < 0:
            continue
        sub = g[: y1 - y, : x1 - x0]
        img[y:y1, x0:x1][sub] = color


def upscale(a: np.ndarray, cy: int, cx: int) -> np.ndarray:
    return np.repeat(np.repeat(a, cy, 0), cx, 1)


def heatmap(values: np.ndarray, title: str, row_label: str, col_label: str,
            col_names=None, max_px: int = 1024, min_px: int = 320) -> np.ndarray:
    """A labelled heatmap of a 2D array in [0, 1] (NaN = grey) with a colour bar."""
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2 or v.size == 0:
        return message_image(title, "NO DATA")
    rows, cols = v.shape
    cell = int(np.clip(min_px // max(rows, cols, 1), 2, 40))
    cell = max(1, min(cell, max_px // max(rows, cols)))
    cy = cx = cell
    s = 2 if cell >= 10 else 1                           # label scale
    left = text_width(str(rows - 1), s) + 6 * s + 8
    top = 10 * s + 14 + 6 * s + 4
    hm_h, hm_w = rows * cy, cols * cx
    bar_h = 10
    width = max(left + hm_w + 12, text_width(title, s) + 16, 160)
    height = top + hm_h + 12 + bar_h + 6 * s + 16
    img = canvas(height, width)
    draw_text(img, 8, 6, title, s)
    draw_text(img, left, 6 + 6 * s + 4, col_label, s)
    draw_text(img, 2, top - 6 * s - 2, row_label[:1], s)
    img[top:top + hm_h, left:left + hm_w] = upscale(colormap(v), cy, cx)
    # row / column numbers where they fit
    every_r = max(1, math.ceil((6 * s + 2) / cy))
    for r in range(0, rows, every_r):
        draw_text(img, 4, top + r * cy + max(0, (cy - 5 * s) // 2), str(r), s)
    names = [str(c) for c in (col_names if col_names is not None else range(cols))]
    widest = max(text_width(n, s) for n in names) + 3 * s
    every_c = max(1, math.ceil(widest / cx))
    for c in range(0, cols, every_c):
        draw_text(img, left + c * cx, top - 6 * s - 2, names[c], s)
    # colour bar 0 .. 1
    by = top + hm_h + 12
    bw = min(hm_w, 256) if hm_w >= 64 else max(64, hm_w)
    ramp = colormap(np.linspace(0, 1, bw)[None, :])
    img[by:by + bar_h, left:left + bw] = np.repeat(ramp, bar_h, 0)
    draw_text(img, left, by + bar_h + 3, "0", s)
    draw_text(img, left + bw - text_width("1", s), by + bar_h + 3, "1", s)
    if np.isnan(v).any():
        mx = left + bw + 10
        if mx + 10 + text_width("DENSE", s) < width:
            img[by:by + bar_h, mx:mx + 10] = MISSING
            draw_text(img, mx + 14, by + 2, "DENSE", s)
    return img


def mask_tiles(masks, titles, title: str, max_px: int = 1536) -> np.ndarray:
    """One tile per head: a bool (n, n) block mask (rows: query blocks, columns: key
    blocks), kept pairs light; tiles in a near-square grid under ``title``."""
    masks = [np.asarray(m, dtype=bool) for m in masks]
    if not masks:
        return message_image(title, "NO MASKS")
    n = masks[0].shape[0]
    k = len(masks)
    ncol = int(math.ceil(math.sqrt(k)))
    nrow = int(math.ceil(k / ncol))
    # cells of at least 1 px; blocks pooled (any) when the tile would be too large
    pool = max(1, math.ceil(n * ncol / max_px))
    m_px = math.ceil(n / pool)
    cell = max(1, min(6, (max_px // ncol) // m_px))
    tile = m_px * cell
    s = 2 if tile >= 160 else 1
    label_h = 6 * s + 4
    gap = 8
    width = max(ncol * (tile + gap) + gap, text_width(title, s) + 16)
    height = 6 * s + 14 + nrow * (tile + label_h + gap) + gap
    img = canvas(height, width)
    draw_text(img, 8, 6, title, s)
    y0 = 6 * s + 14
    for i, (m, t) in enumerate(zip(masks, titles)):
        if pool > 1:
            pad = m_px * pool - n
            mp = np.pad(m, ((0, pad), (0, pad)))
            m = mp.reshape(m_px, pool, m_px, pool).any(axis=(1, 3))
        r, c = divmod(i, ncol)
        x = gap + c * (tile + gap)
        y = y0 + r * (tile + label_h + gap)
        draw_text(img, x, y, t, s)
        cells = np.where(m[..., None], np.array(INK, np.float32), np.array((0.16, 0.18, 0.24), np.float32))
        img[y + label_h:y + label_h + tile, x:x + tile] = upscale(cells, cell, cell)
    return img


def message_image(title: str, message: str) -> np.ndarray:
    """A small image saying why there is nothing to draw."""
    width = max(256, text_width(title, 2) + 16, text_width(message, 2) + 16)
    img = canvas(64, width)
    draw_text(img, 8, 8, title, 2)
    draw_text(img, 8, 36, message, 2, color=(0.95, 0.65, 0.35))
    return img
