"""Issue 11 through the nodes in a real ComfyUI (CPU): presets and tables that cannot fail the
sampler, no write through a symbolic link, a corrupt loss table reported and replaced,
full-match names. The widget limits are among the widget tests of tests/nodes/test_nodes.py and
tests/nodes/test_nodes_search.py."""
from __future__ import annotations

import json
import os
import sys
import types

import pytest
import torch

import comfyui_harness as H
from kernels.preset_file import Preset
from kernels.psa_mask import MAX_PARAM
from pack_nodes import models_folder, patch, saved_and_loaded, search, summary, table_in_models
from preset_builders import fingerprint, tiny_preset, token_grid
from psa_search_inputs import rewrite

STEPS = 3


@pytest.fixture(scope="module")
def wan(comfy):
    tiny = H.build_wan21(11, num_layers=2, dim=256)      # 2 blocks, 2 heads, grid (3, 4, 6)
    return tiny, H.sample(tiny, steps=STEPS)


# ------------------------------------------------------------------------ names (item 8)
# (bounded and ASCII widget values: tests/nodes/test_nodes.py, tests/nodes/test_nodes_search.py)
def test_select_preset_name_must_match_in_full(pack, wan):
    with pytest.raises(ValueError, match="^preset_name: 'nl\\\\n' must be"):
        pack.node_search.PSAMaskSelect.execute("nope.safetensors", preset_name="nl\n")


# ------------------------------------------------------------------------ the sampler never fails
def test_sol_tile_too_large_for_the_video_stays_dense(pack, wan, caplog):
    """A 64-token tile that pads the video's grid beyond kernels.layout's limit (64,1,1 on a
    one-frame grid of 10 x 10 tokens: 6400 slots for 100 tokens) leaves those calls dense."""
    tiny, _ = wan
    one_frame = (1, 16, 1, 20, 20)  # latent (B, C, T, H, W): token grid (1, 10, 10)
    base = H.sample(tiny, steps=STEPS, latent_shape=one_frame)
    m = patch(pack, tiny.patcher, sol_tile="64,1,1", warmup=0.0, dense_blocks="")
    torch.testing.assert_close(H.sample(tiny, steps=STEPS, model=m, latent_shape=one_frame), base)
    s = summary(pack, m)
    assert s["sparse_calls"] == 0 and s["dense_calls"]["sol_tile"] == STEPS * 2
    assert "pads the grid (1, 10, 10)" in s["notes"]["sol_tile"]


def test_psa_failure_while_deciding_falls_back_to_dense(pack, wan, monkeypatch):
    """An 8 GB mask was once raised while planning the call, outside the fallback."""
    tiny, base = wan
    grid = token_grid(tiny)
    p = saved_and_loaded(pack, tiny_preset("decide_fails", "wan", fingerprint(tiny), grid,
                                           [[[[1, 0, 0, 1, 0, 0]] * tiny.heads] * 2]))
    kernels = pack._kernels.kernels

    def no_memory(self, tokens=False):
        raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory: "
                           "you tried to allocate 8589934592 bytes")
    monkeypatch.setattr(kernels.PSAMask, "density", no_memory)
    m = patch(pack, tiny.patcher, method="psa", preset=p, warmup=0.0, dense_blocks="")
    torch.testing.assert_close(H.sample(tiny, steps=STEPS, model=m), base)
    s = summary(pack, m)
    assert s["sparse_calls"] == 0 and s["dense_calls"]["plan_error"] == STEPS * 2
    assert "8589934592 bytes" in s["notes"]["plan_error"]


def test_rescaled_preset_with_huge_offsets_runs(pack, wan):
    """preset_grid = rescale scaled an offset past MAX_PARAM (item 6)."""
    tiny, _ = wan
    rows = [[1, MAX_PARAM - 1, 0, 1, -(MAX_PARAM - 1), 0]] * tiny.heads
    # grid (2, 4, 6): block grid (2, 2, 3); the video's (3, 4, 6) is (3, 2, 3), a factor 1.5 in time
    p = saved_and_loaded(pack, tiny_preset("huge_offsets", "wan", fingerprint(tiny), (2, 4, 6), [[rows] * 2]))
    m = patch(pack, tiny.patcher, method="psa", preset=p, warmup=0.0, dense_blocks="", preset_grid="rescale")
    H.sample(tiny, steps=STEPS, model=m)
    s = summary(pack, m)
    assert s["sparse_calls"] == STEPS * 2, s["dense_calls"]


def test_inspector_draws_a_message_for_masks_too_large(pack, wan):
    p = Preset(name="huge", family="wan", model_name="m",
               fingerprint={"layers": 1, "heads": 1, "head_dim": 128, "hidden_size": 128},
               grid=(1, 46, 46), tile=(1, 1, 1), params=torch.tensor([[[[1, 0, 0, 1, 0, 0]]]]),
               search={}, stats={})
    out = pack.node_inspector.SparseAttentionInspector.execute(preset=p)
    info = json.loads(out.result[3])
    assert "2116 blocks, more than the 2048" in info["psa_masks"]["error"]
    assert out.result[2].shape[0] == 1 and out.result[2].shape[1] <= 64   # the message image


def test_select_refuses_a_table_whose_header_lies_about_its_grid(pack, wan):
    path = rewrite(table_in_models(pack, "lying"), header={"grid": [8, 64, 64], "tile": [1, 1, 1]})
    with pytest.raises(ValueError) as e:
        pack.node_search.PSAMaskSelect.execute("lying.safetensors", preset_name="from_lying")
    assert str(e.value).startswith("table: ") and path in str(e.value) and "32768 blocks" in str(e.value)
    assert not os.path.exists(os.path.join(models_folder("sparse_attention_presets"), "from_lying.json"))


# ------------------------------------------------------------------------ symbolic links (item 5)
def test_select_never_writes_through_a_link(pack, wan, tmp_path):
    table_in_models(pack, "for_links")
    presets = models_folder("sparse_attention_presets")
    outside = tmp_path / "outside.json"
    os.symlink(outside, os.path.join(presets, "dangling.json"))
    with pytest.raises(ValueError, match="^preset_name: .*dangling.json is a symbolic link"):
        pack.node_search.PSAMaskSelect.execute("for_links.safetensors", preset_name="dangling")
    assert not outside.exists()
    outside.write_text("keep me")
    os.symlink(outside, os.path.join(presets, "existing.json"))
    with pytest.raises(ValueError, match="^preset_name: .*existing.json is a symbolic link"):
        pack.node_search.PSAMaskSelect.execute("for_links.safetensors", preset_name="existing", overwrite=True)
    assert outside.read_text() == "keep me"
    # a plain name still works, and without overwrite an existing file is refused
    pack.node_search.PSAMaskSelect.execute("for_links.safetensors", preset_name="plain")
    with pytest.raises(ValueError, match="^preset_name: .*plain.json exists"):
        pack.node_search.PSAMaskSelect.execute("for_links.safetensors", preset_name="plain")


def test_search_never_writes_through_a_link(pack, wan, tmp_path):
    tiny, _ = wan
    outside = tmp_path / "table_outside.safetensors"
    os.symlink(outside, os.path.join(models_folder("psa_loss_tables"), "linked_table.safetensors"))
    samples_outside = tmp_path / "samples_outside"
    samples_outside.mkdir()
    os.symlink(samples_outside, os.path.join(models_folder("psa_qkv_samples"), "linked_table"))
    m = search(pack, tiny.patcher, "linked_table", accumulate=True, save_qkv=True)
    H.sample(tiny, steps=STEPS, model=m)                  # the workflow itself completes
    s = summary(pack, m)["search"]
    assert not outside.exists() and os.listdir(samples_outside) == []
    assert "symbolic link" in s["error"] and any("symbolic link" in w for w in s["warnings"])
    assert s["qkv_files"] == 0 and "symbolic link" in s["qkv_refused"]


# ------------------------------------------------------------------------ corrupt table (item 7)
class FakePromptServer:
    def __init__(self):
        self.texts = []

    def send_progress_text(self, text, node_id, sid=None):
        self.texts.append((node_id, text))


@pytest.fixture
def prompt_server(monkeypatch):
    """The texts the frontend would show under the node being executed."""
    server = types.SimpleNamespace(PromptServer=types.SimpleNamespace(instance=FakePromptServer()))
    monkeypatch.setitem(sys.modules, "server", server)
    return server.PromptServer.instance.texts


def sample_as_node_7(tiny, model):
    from comfy_execution.utils import CurrentNodeContext
    with CurrentNodeContext("prompt-1", "7"):             # as when the KSampler node runs
        H.sample(tiny, steps=STEPS, model=model)


def test_a_file_where_the_sample_folder_goes_is_reported_and_every_call_evaluated(pack, wan,
                                                                                  prompt_server):
    tiny, _ = wan
    blocker = os.path.join(models_folder("psa_qkv_samples"), "qkv_blocked")
    with open(blocker, "w") as f:
        f.write("not a folder")
    m = search(pack, tiny.patcher, "qkv_blocked", save_qkv=True)
    sample_as_node_7(tiny, m)
    s = summary(pack, m)["search"]
    assert s["evaluated_calls"] == STEPS * 2 and s["qkv_files"] == 0
    assert blocker in s["qkv_refused"] and "is a file, not a folder" in s["qkv_refused"]
    assert s["warnings"] == [f"Q/K/V samples: {s['qkv_refused']}"]
    assert len(prompt_server) == 1 and prompt_server[0][0] == "7" and blocker in prompt_server[0][1]
    assert pack._kernels.kernels.LossTable.load(s["table"]).calls.tolist() == [[STEPS], [STEPS]]


def test_a_sample_that_cannot_be_written_is_reported(pack, wan, prompt_server, monkeypatch):
    tiny, _ = wan
    kernels = pack._kernels.kernels     # the library function the search calls
    save = kernels.save_qkv_sample
    written = []

    def disk_fills_up(path, *args, **kwargs):
        if written:
            raise ValueError(f"cannot write {path}: No space left on device")
        written.append(path)
        return save(path, *args, **kwargs)
    monkeypatch.setattr(kernels, "save_qkv_sample", disk_fills_up)
    m = search(pack, tiny.patcher, "qkv_disk_full", save_qkv=True)
    sample_as_node_7(tiny, m)
    s = summary(pack, m)["search"]
    assert s["evaluated_calls"] == STEPS * 2 and s["qkv_files"] == 1
    assert "No space left on device" in s["qkv_refused"] and "after the first 1" in s["qkv_refused"]
    assert len(s["warnings"]) == 1 and "No space left on device" in s["warnings"][0]
    assert len(prompt_server) == 1 and "No space left on device" in prompt_server[0][1]


def test_corrupt_table_is_moved_aside_and_reported(pack, wan, monkeypatch):
    from comfy_execution.utils import CurrentNodeContext
    tiny, _ = wan
    tables = models_folder("psa_loss_tables")
    path = os.path.join(tables, "corrupt_t.safetensors")
    with open(path, "wb") as f:
        f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{broken}")
    server = types.SimpleNamespace(PromptServer=types.SimpleNamespace(instance=FakePromptServer()))
    monkeypatch.setitem(sys.modules, "server", server)
    m = search(pack, tiny.patcher, "corrupt_t", accumulate=True)
    with CurrentNodeContext("prompt-1", "7"):             # as when the KSampler node runs
        H.sample(tiny, steps=STEPS, model=m)
    s = summary(pack, m)["search"]
    loss_table = pack._kernels.kernels.LossTable
    assert loss_table.load(path).calls.tolist() == [[STEPS], [STEPS]]          # this run was written
    aside = [f for f in os.listdir(tables) if f.startswith("corrupt_t.corrupt-")]
    assert len(aside) == 1 and open(os.path.join(tables, aside[0]), "rb").read().endswith(b"{broken}")
    assert s["table"] == path and len(s["warnings"]) == 1 and aside[0] in s["warnings"][0]
    assert "cannot be read" in s["warnings"][0]
    texts = server.PromptServer.instance.texts
    assert len(texts) == 1 and texts[0][0] == "7" and aside[0] in texts[0][1]
    # the next run extends the new table as usual
    H.sample(tiny, steps=STEPS, model=m)
    assert loss_table.load(path).calls.tolist() == [[2 * STEPS], [2 * STEPS]]
    assert "warnings" not in summary(pack, m)["search"]
