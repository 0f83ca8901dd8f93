"""The preset list of "Load Stripe Mask Preset" in a real ComfyUI (CPU): it never raises (ComfyUI
drops a node whose schema raises from /object_info, shipped presets and all) and it offers
only names the loader accepts."""
from __future__ import annotations

import errno
import os
import shutil

import pytest

from pack_nodes import table_in_models

SHIPPED = sorted(f for f in os.listdir(os.path.join(os.path.dirname(__file__), "..", "..", "mask_presets"))
                 if f.endswith(".json"))


def node_options(comfy):
    """The preset names /object_info gives for the node (server.py's node_info: GET_NODE_INFO_V1)."""
    info = comfy.nodes.NODE_CLASS_MAPPINGS["LoadStripeMaskPreset"].GET_NODE_INFO_V1()
    return info["input"]["required"]["preset_name"][1]["options"]


@pytest.fixture
def models_presets(pack):
    """An empty models/sparse_attention_presets/, restored afterwards."""
    folder = pack.presets.presets_dir()
    aside = folder + ".aside"
    os.rename(folder, aside)
    os.makedirs(folder)
    yield folder
    os.chmod(folder, 0o755)
    shutil.rmtree(folder)
    os.rename(aside, folder)


def test_unreadable_preset_folder_keeps_the_node_and_the_shipped_presets(comfy, pack, models_presets,
                                                                          monkeypatch, caplog):
    shutil.copy(os.path.join(pack.presets.PACK_PRESET_DIR, SHIPPED[0]), os.path.join(models_presets, "mine.json"))
    assert node_options(comfy) == sorted(SHIPPED + ["mine.json"])
    os.chmod(models_presets, 0)
    if os.access(models_presets, os.R_OK):  # root reads it anyway: the error it would get
        listdir = os.listdir

        def refusing(path="."):
            if os.path.realpath(path) == os.path.realpath(models_presets):
                raise PermissionError(errno.EACCES, "Permission denied", path)
            return listdir(path)
        monkeypatch.setattr(os, "listdir", refusing)
    with caplog.at_level("WARNING", logger="sparse_video_attention"):
        assert node_options(comfy) == SHIPPED
    assert any("cannot list the preset folder" in r.getMessage() and models_presets in r.getMessage()
               and "Permission denied" in r.getMessage() for r in caplog.records)
    assert pack.node_preset.LoadStripeMaskPreset.execute(SHIPPED[0]).result[0].name


def test_the_list_offers_only_names_the_loader_accepts(comfy, pack, models_presets, tmp_path):
    src = os.path.join(pack.presets.PACK_PRESET_DIR, SHIPPED[0])
    outside = tmp_path / "outside.json"
    shutil.copy(src, outside)
    refused = ["UPPER.JSON", "a b.json", ".hidden.json", "x" * 65 + ".json", "link_out.json", "folder.json"]
    for name in refused[:4]:
        shutil.copy(src, os.path.join(models_presets, name))
    os.symlink(outside, os.path.join(models_presets, "link_out.json"))
    os.mkdir(os.path.join(models_presets, "folder.json"))
    shutil.copy(src, os.path.join(models_presets, "good-1.json"))
    os.symlink(os.path.join(models_presets, "good-1.json"), os.path.join(models_presets, "link_in.json"))
    options = node_options(comfy)
    assert options == sorted(SHIPPED + ["good-1.json", "link_in.json"])
    for name in options:  # every name offered loads
        assert pack.node_preset.LoadStripeMaskPreset.execute(name).result[0].name


def test_select_does_not_offer_tables_the_search_set_aside(comfy, pack):
    """Decision (docs/HARDENING.md): moved-aside tables stay on disk for the user, unlisted."""
    path = table_in_models(pack, "aside_demo")
    stem = path[: -len(".safetensors")]
    aside = [f"{stem}.corrupt-20250101-120000.safetensors", f"{stem}.replaced-20250101-120000-2.safetensors"]
    for p in aside:
        shutil.copy(path, p)
    info = comfy.nodes.NODE_CLASS_MAPPINGS["PSAMaskSelect"].GET_NODE_INFO_V1()
    options = info["input"]["required"]["table"][1]["options"]
    assert "aside_demo.safetensors" in options
    assert not [o for o in options if o.startswith("aside_demo.") and o != "aside_demo.safetensors"]
    assert all(os.path.isfile(p) for p in aside)                 # kept, never deleted
