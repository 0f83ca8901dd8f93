"""Messages name the widget or argument at fault, never an innocent one or a temporary file;
a file the process may not read is reported as such, not as missing or corrupt (real
ComfyUI on the CPU for the nodes, the library and its command line directly)."""
from __future__ import annotations

import os
import shutil

import pytest

import comfyui_harness as H
import kernels.psa_search as ps
import kernels.psa_search.cli as psa_search_cli
from pack_nodes import models_folder, patch, search, summary, table_in_models
from psa_search_inputs import accumulator, qkv

ROOT = os.geteuid() == 0   # root reads files whatever their permissions


@pytest.fixture(scope="module")
def wan(comfy):
    return H.build_wan21(7, num_layers=2, dim=256)         # 2 blocks, 2 heads, grid (3, 4, 6)


def test_a_target_sparsity_too_small_to_aim_at_names_the_widget(pack, wan):
    with pytest.raises(ValueError, match="^target_sparsity: 1e-17 is too small"):
        patch(pack, wan.patcher, target_sparsity=1e-17)
    assert patch(pack, wan.patcher, target_sparsity=0.01) is not None


def test_a_beta_beyond_float32_names_the_widget(pack, wan):
    """The widget stops at ±10, a prompt sent to the API does not: such a β failed every call."""
    with pytest.raises(ValueError, match="^beta: must be -inf, inf or a number within float32's range"):
        patch(pack, wan.patcher, beta=1e39)


def test_select_names_the_author_not_the_table(pack):
    table_in_models(pack, "author_table")
    with pytest.raises(ValueError, match="^author: longer than 200 characters$"):
        pack.node_search.PSAMaskSelect.execute("author_table.safetensors", preset_name="p_author", author="a" * 201)


@pytest.fixture
def presets_folder_replaced(pack):
    """models/sparse_attention_presets moved aside for the test, then put back."""
    path = pack.presets.presets_dir()
    os.rename(path, path + ".aside")
    yield path
    if os.path.isdir(path):
        shutil.rmtree(path)
    elif os.path.lexists(path):
        os.remove(path)
    os.rename(path + ".aside", path)


def test_select_reports_a_preset_folder_it_cannot_create(pack, presets_folder_replaced):
    table_in_models(pack, "folder_table")
    with open(presets_folder_replaced, "w") as f:
        f.write("a file where the folder goes")
    with pytest.raises(ValueError) as e:
        pack.node_search.PSAMaskSelect.execute("folder_table.safetensors", preset_name="p_folder")
    assert str(e.value).startswith("preset_name: cannot create the preset folder")
    assert presets_folder_replaced in str(e.value)


def test_select_reports_a_folder_in_place_of_the_preset(pack):
    table_in_models(pack, "dir_table")
    target = os.path.join(models_folder("sparse_attention_presets"), "p_is_dir.json")
    os.makedirs(target, exist_ok=True)
    with pytest.raises(ValueError) as e:
        pack.node_search.PSAMaskSelect.execute("dir_table.safetensors", preset_name="p_is_dir", overwrite=True)
    assert str(e.value) == f"preset_name: {target} is a folder; give a file name"


def test_search_reports_a_folder_in_place_of_its_table(pack, wan):
    target = os.path.join(models_folder("psa_loss_tables"), "t_is_dir.safetensors")
    os.makedirs(target, exist_ok=True)
    m = search(pack, wan.patcher, "t_is_dir")
    H.sample(wan, steps=2, model=m)
    s = summary(pack, m)["search"]
    assert s["table"] is None and f"{target} is a folder" in s["error"] and ".tmp" not in s["error"]
    assert len(s["warnings"]) == 1 and f"{target} is a folder" in s["warnings"][0]


def test_a_table_behind_a_loop_of_links_is_not_reported_missing(tmp_path):
    loop = tmp_path / "loop.safetensors"
    os.symlink(loop, loop)
    with pytest.raises(OSError) as e:
        ps.LossTable.load(loop)
    assert str(loop) in str(e.value) and "no such file" not in str(e.value)


@pytest.mark.skipif(ROOT, reason="root reads files whatever their permissions")
def test_an_unreadable_table_is_reported_as_such(tmp_path):
    acc = accumulator()
    acc.add(*qkv(0), layer=0)
    path = tmp_path / "t.safetensors"
    acc.table().save(path)
    os.chmod(path, 0)
    with pytest.raises(PermissionError, match="Permission denied"):
        ps.LossTable.load(path)
    os.chmod(tmp_path, 0)
    try:
        with pytest.raises(PermissionError, match="Permission denied"):
            ps.LossTable.load(path)
    finally:
        os.chmod(tmp_path, 0o755)


@pytest.mark.skipif(ROOT, reason="root reads files whatever their permissions")
def test_the_search_never_moves_aside_a_table_it_may_not_read(pack, wan):
    m = search(pack, wan.patcher, "t_unreadable", accumulate=True)
    H.sample(wan, steps=2, model=m)
    path = summary(pack, m)["search"]["table"]
    os.chmod(path, 0)
    try:
        H.sample(wan, steps=2, model=m)
    finally:
        os.chmod(path, 0o644)
    s = summary(pack, m)["search"]
    assert "Permission denied" in s["warnings"][0]
    assert not [f for f in os.listdir(os.path.dirname(path)) if f.startswith("t_unreadable.corrupt-")]
    assert ps.LossTable.load(path).calls.tolist() == [[2], [2]]          # the first run's table, kept


def test_cli_select_names_a_fingerprint_of_another_model(tmp_path, capsys):
    acc = accumulator()
    for layer in range(3):
        acc.add(*qkv(layer), layer=layer)
    table = tmp_path / "t.safetensors"
    acc.table().save(table)
    common = ["select", str(table), "--alpha", "0.1", "--out", str(tmp_path / "p.json"), "--name", "n",
              "--family", "ltxv", "--model-name", "m", "--fingerprint"]
    for fingerprint, words in ((["3", "3", "8", "24"], "fingerprint.heads: 3, but the loss table has 2 heads"),
                               (["2", "2", "8", "16"], "fingerprint.layers: 2, but the loss table has rows for layer 2")):
        assert psa_search_cli.main(common + fingerprint) == 2
        assert words in capsys.readouterr().err
    assert not (tmp_path / "p.json").exists()
