"""Stripe-mask presets (PSA) as the nodes see them.

The file format and its loader belong to ``kernels/presets.py`` (the PSA helper). The nodes
need only this small interface from a loaded preset object:

- ``grid``: (T, H, W) token grid the masks were searched for;
- ``tile``: (bt, bh, bw) PSABlock size;
- ``params_for_layer(layer) -> (H, 6) int tensor or None``: per-head (Tw,To,Ts,Sw,So,Ss);
- ``num_layers``, ``num_heads``: what it covers;
- ``fingerprint``: dict describing the model it was searched on (may hold ``family``,
  ``num_blocks``, ``num_heads``, ``head_dim``).

:func:`load_preset` calls ``kernels.presets.load(path)``; :func:`check_preset` validates a
preset against the patched model and raises ValueError naming what does not match.
"""
from __future__ import annotations

import os

PRESET_EXTENSIONS = (".json", ".safetensors", ".pt")
MODELS_SUBFOLDER = "sparse_attention_presets"
PACK_PRESET_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "mask_presets")


def _presets_module():
    try:
        from ._kernels import kernels as k
        import importlib
        return importlib.import_module(k.__name__ + ".presets")
    except ImportError as e:
        raise RuntimeError(
            "Load Stripe Mask Preset: this build has no kernels.presets module, so stripe-mask "
            f"presets cannot be read ({e})") from e


def load_preset(path: str):
    if not os.path.isfile(path):
        raise ValueError(f"preset: file not found: {path}")
    mod = _presets_module()
    try:
        return mod.load(path)
    except (ValueError, TypeError) as e:
        raise ValueError(f"preset {os.path.basename(path)}: {e}") from e


def check_preset(preset, info) -> None:
    """Raise ValueError naming each mismatch between ``preset`` and the model ``info``."""
    problems = []
    fp = dict(getattr(preset, "fingerprint", None) or {})
    fam = fp.get("family")
    if fam is not None and fam != info.family:
        problems.append(f"model family: preset {fam!r}, model {info.family!r}")
    n_layers = getattr(preset, "num_layers", fp.get("num_blocks"))
    if n_layers is not None and int(n_layers) != info.num_blocks:
        problems.append(f"blocks: preset {n_layers}, model {info.num_blocks}")
    n_heads = getattr(preset, "num_heads", fp.get("num_heads"))
    if n_heads is not None and int(n_heads) != info.num_heads:
        problems.append(f"heads: preset {n_heads}, model {info.num_heads}")
    hd = fp.get("head_dim")
    if hd is not None and int(hd) != info.head_dim:
        problems.append(f"head dim: preset {hd}, model {info.head_dim}")
    for attr in ("grid", "tile", "params_for_layer"):
        if not hasattr(preset, attr):
            problems.append(f"the preset object has no {attr!r}")
    if problems:
        raise ValueError("preset does not match this model: " + "; ".join(problems))


def list_presets() -> list[str]:
    """Names for the loader's list: the pack's mask_presets/ and the models subfolder."""
    names = set()
    if os.path.isdir(PACK_PRESET_DIR):
        for f in os.listdir(PACK_PRESET_DIR):
            if f.lower().endswith(PRESET_EXTENSIONS):
                names.add(f)
    try:
        import folder_paths
        names.update(folder_paths.get_filename_list(MODELS_SUBFOLDER))
    except Exception:
        pass
    return sorted(names)


def preset_path(name: str) -> str:
    try:
        import folder_paths
        p = folder_paths.get_full_path(MODELS_SUBFOLDER, name)
        if p:
            return p
    except Exception:
        pass
    p = os.path.join(PACK_PRESET_DIR, name)
    if os.path.normpath(p).startswith(os.path.normpath(PACK_PRESET_DIR) + os.sep) and os.path.isfile(p):
        return p
    raise ValueError(f"preset: {name!r} is neither in the pack's mask_presets/ nor in "
                     f"models/{MODELS_SUBFOLDER}/")


def register_folder() -> None:
    """Register models/sparse_attention_presets with ComfyUI's folder_paths (idempotent)."""
    try:
        import folder_paths
    except ImportError:
        return
    path = os.path.join(folder_paths.models_dir, MODELS_SUBFOLDER)
    exts = set(PRESET_EXTENSIONS)
    if MODELS_SUBFOLDER in folder_paths.folder_names_and_paths:
        paths, e = folder_paths.folder_names_and_paths[MODELS_SUBFOLDER]
        if path not in paths:
            paths.append(path)
        e.update(exts) if isinstance(e, set) else None
    else:
        folder_paths.folder_names_and_paths[MODELS_SUBFOLDER] = ([path], exts)
