"""Stripe-mask presets (PSA) as the nodes use them.

The format, its validation and its policies belong to the library (``kernels.Preset``,
``kernels.load_preset``); this module only connects them to ComfyUI:

- where presets live: the pack's ``mask_presets/`` and ``models/sparse_attention_presets/``
  (registered with ``folder_paths``); names are resolved by
  ``kernels.resolve_preset_path`` (bare file names, confined to those folders);
- :func:`check_preset_for_model`: at patch time, ``Preset.check_model`` against the patched
  model's fingerprint ``{layers, heads, head_dim, hidden_size}`` and family (the error names
  each mismatch);
- at sampling time the dispatcher asks ``Preset.params_for_grid(grid, on_mismatch)`` (refuse
  or rescale, as the library defines) and ``Preset.params_for(layer, progress)``.

Family names: a preset's ``model.family`` must be one of the names listed for the model's
adapter in :data:`FAMILY_NAMES` (``wan`` also accepts ``wan2.1``/``wan2.2``: Wan 2.1 and the
2.2 A14B models share one architecture; the fingerprint tells the sizes apart). The adapters'
family names are ComfyUI's side, so the table lives here.
"""
from __future__ import annotations

import logging
import os

from ._kernels import kernels

log = logging.getLogger("sparse_video_attention")

PRESET_EXTENSIONS = (".json",)
MODELS_SUBFOLDER = "sparse_attention_presets"
PACK_PRESET_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                               "mask_presets")

# adapter family -> preset family names accepted for it (the first is what the nodes write)
FAMILY_NAMES = {
    "wan": ("wan", "wan2.1", "wan2.2"),
    "hunyuan_video": ("hunyuan_video",),
    "ltxv": ("ltxv",),
    "ltx2": ("ltx2",),
}
KNOWN_FAMILIES = tuple(name for names in FAMILY_NAMES.values() for name in names)  # what presets may say


def model_fingerprint(info) -> dict:
    """The preset fingerprint of a model (:class:`~.adapters.base.ModelInfo`)."""
    return {"layers": info.num_blocks, "heads": info.num_heads, "head_dim": info.head_dim,
            "hidden_size": info.num_heads * info.head_dim}


def preset_family(info) -> str:
    """The family name the nodes write into presets made for this model."""
    return FAMILY_NAMES.get(info.family, (info.family,))[0]


def check_preset_for_model(preset, info) -> None:
    """Raise ValueError (from ``Preset.check_model``) naming each mismatch with the model."""
    # by attribute, not isinstance: the kernels package may be imported under two names
    if not all(hasattr(preset, a) for a in ("check_model", "params_for_grid", "params_for",
                                            "bucket_of", "grid", "tile", "family", "name")):
        raise ValueError(f"preset: expected a stripe-mask preset from 'Load Stripe Mask Preset' "
                         f"or 'PSA Mask Select', got {type(preset).__name__}")
    accepted = FAMILY_NAMES.get(info.family, (info.family,))
    family = preset.family if preset.family in accepted else info.family
    preset.check_model(model_fingerprint(info), family)


def preset_folders() -> list[str]:
    """Folders searched for preset names, in order: models subfolder(s), then the pack's."""
    folders = []
    try:
        import folder_paths
        folders += [p for p in folder_paths.get_folder_paths(MODELS_SUBFOLDER) if os.path.isdir(p)]
    except Exception:  # outside ComfyUI, or the folder is not registered
        pass
    if os.path.isdir(PACK_PRESET_DIR):
        folders.append(PACK_PRESET_DIR)
    return folders


def list_presets() -> list[str]:
    """Names for the loader's list: the files of :func:`preset_folders` that the loader finds
    by that name (``kernels.resolve_preset_path``: bare names, regular files, no link
    out of the folder). Never raises: ComfyUI drops a node whose list raises, shipped presets
    and all, so an unreadable folder is skipped with a warning."""
    folders = preset_folders()
    names = set()
    for folder in folders:
        try:
            names.update(os.listdir(folder))
        except OSError as e:
            log.warning("[sparse-video-attention] cannot list the preset folder %s (%s); its "
                        "presets are not offered", folder, e.strerror or type(e).__name__)
    resolve = kernels.resolve_preset_path
    listed = []
    for name in sorted(names):
        try:
            resolve(name, folders)
        except ValueError:
            continue
        listed.append(name)
    return listed


def load_named_preset(name: str):
    """Load a preset by its bare file name from :func:`preset_folders` (validated)."""
    folders = preset_folders()
    if not folders:
        raise ValueError(f"preset {kernels.shown(name)}: no preset folder exists "
                         f"(models/{MODELS_SUBFOLDER}/ or the pack's mask_presets/)")
    return kernels.load_preset(name, folders=folders, known_families=KNOWN_FAMILIES)


def presets_dir() -> str:
    """The writable models/sparse_attention_presets folder (created)."""
    import folder_paths
    path = folder_paths.get_folder_paths(MODELS_SUBFOLDER)[0]
    os.makedirs(path, exist_ok=True)
    return path


def register_models_subfolder(name: str, exts) -> None:
    """Register ``models/<name>`` with ComfyUI's folder_paths (idempotent)."""
    try:
        import folder_paths
    except ImportError:
        return
    path = os.path.join(folder_paths.models_dir, name)
    if name in folder_paths.folder_names_and_paths:
        paths, e = folder_paths.folder_names_and_paths[name]
        if path not in paths:
            paths.append(path)
        if isinstance(e, set):
            e.update(exts)
    else:
        folder_paths.folder_names_and_paths[name] = ([path], set(exts))


def register_folder() -> None:
    """Register models/sparse_attention_presets with ComfyUI's folder_paths (idempotent)."""
    register_models_subfolder(MODELS_SUBFOLDER, PRESET_EXTENSIONS)
