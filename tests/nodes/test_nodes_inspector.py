"""Sparse Attention Inspector inside a real ComfyUI (CPU): the last run's statistics as
IMAGE tensors (numpy-drawn) and a JSON summary."""
from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch

import comfyui_harness as H
from kernels.psa_mask import psa_mask
from pack_nodes import patch, saved_and_loaded, summary
from preset_builders import full_row, tiny_preset

STEPS = 5


@pytest.fixture(scope="module")
def wan(comfy):
    return H.build_wan21(7, num_layers=3, dim=256)          # 3 blocks, 2 heads


def inspect(pack, **inputs):
    out = pack.node_inspector.SparseAttentionInspector.execute(**inputs)
    images, text = out.result[:3], out.result[3]
    for img in images:
        assert img.dtype == torch.float32 and img.ndim == 4 and img.shape[0] == 1 and img.shape[3] == 3
        assert float(img.min()) >= 0.0 and float(img.max()) <= 1.0
    return images, json.loads(text), out.ui


def colour_share(img, rgb):
    a = img[0].numpy()
    return float(np.all(np.abs(a - np.array(rgb, np.float32)) < 1e-6, axis=-1).mean())


def test_inspector_sol_run(pack, wan, comfy, tmp_path):
    m = patch(pack, wan.patcher, beta=1.0, warmup=0.2, dense_blocks="0")
    samples = {"samples": H.sample(wan, steps=STEPS, model=m)}
    (density, heads, masks), info, ui = inspect(pack, model=m, samples=samples)
    s = summary(pack, m)
    # the matrix behind density_map: rows blocks, columns steps, NaN where the rules said dense
    a, steps = pack.node_inspector.density_matrix(s)
    assert steps == list(range(STEPS)) and a.shape == (3, STEPS)
    assert np.isnan(a[0]).all() and np.isnan(a[:, 0]).all()           # block 0, warm-up step 0
    assert np.isfinite(a[1:, 1:]).all() and (a[1:, 1:] < 1).all()
    hm = pack.node_inspector.head_matrix(s)
    assert hm.shape == (3, 2) and np.isnan(hm[0]).all() and np.isfinite(hm[1:]).all()
    from_draw = pack.draw
    assert colour_share(density, from_draw.MISSING) > 0.01              # the dense cells are drawn grey
    assert colour_share(masks, from_draw.BACKGROUND) > 0.5              # "no PSA preset" message
    assert info["method"] == "sol_attn" and info["sparse_calls"] == s["sparse_calls"] == 2 * 4
    assert info["dense_calls"]["warmup"] == 3 and set(info["density_by_block"]) == {"1", "2"}
    # the UI gets the three images as previews in ComfyUI's temp folder
    results = ui.as_dict()["images"]
    assert len(results) == 3 and all(r["type"] == "temp" for r in results)
    import folder_paths
    assert all(os.path.isfile(os.path.join(folder_paths.get_temp_directory(), r["subfolder"], r["filename"]))
               for r in results)
    save_png(density, "inspector_density_map.png")
    save_png(heads, "inspector_head_density.png")


def test_inspector_psa_masks(pack, wan):
    grid = (3, 4, 6)
    heads = [[2, 0, 0, 1, 0, 0], full_row(grid)]
    fp = {"layers": 3, "heads": 2, "head_dim": 128, "hidden_size": 256}
    p = saved_and_loaded(pack, tiny_preset("inspect_me", "wan", fp, grid, [[heads] * 3]))
    m = patch(pack, wan.patcher, method="psa", preset=p, warmup=0.0, dense_blocks="")
    H.sample(wan, steps=2, model=m)
    (density, head_img, masks), info, _ = inspect(pack, model=m, mask_layer=-1)
    want = psa_mask(grid, heads, (1, 2, 2)).density(tokens=True).tolist()
    assert info["psa_masks"]["layer"] == 2 and info["psa_masks"]["head_density"] == pytest.approx(want, abs=1e-4)
    hm = pack.node_inspector.head_matrix(summary(pack, m))
    assert hm == pytest.approx(np.array([want] * 3))
    # the full head's tile is all "kept": the mask image holds more ink than background
    assert colour_share(masks, pack.draw.INK) > 0.2
    save_png(masks, "inspector_psa_masks.png")
    # a preset without a patched model draws only the masks
    (_, _, masks2), info2, _ = inspect(pack, preset=p, mask_layer=-1)
    assert info2["error"] == "no model connected" and torch.equal(masks2, masks)


def save_png(img, name):
    """Keep the picture for a human look (.cache/inspector/, ignored by git)."""
    from PIL import Image
    folder = os.path.join(H.REPO_ROOT, ".cache", "inspector")
    os.makedirs(folder, exist_ok=True)
    Image.fromarray((img[0].numpy() * 255).round().astype(np.uint8)).save(os.path.join(folder, name))
