"""The shipped geometry presets in mask_presets/ (built by tools/build_presets.py)."""
import os
import sys

import pytest
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "tools"))

import build_presets as bp  # noqa: E402
from kernels.preset_file import MAX_PRESET_BYTES, load_preset, preset_to_json  # noqa: E402
from kernels.psa_mask import psa_mask  # noqa: E402
from kernels.psa_search import LossTable  # noqa: E402

NAMES = sorted(bp.SPECS)


def test_every_shipped_file_is_built_by_the_builder():
    shipped = sorted(f[:-5] for f in os.listdir(bp.PRESET_DIR) if f.endswith(".json"))
    assert shipped == NAMES
    # nothing else in mask_presets/ would show up in the loader's list
    assert all(f.endswith(".json") or f.startswith(".") for f in os.listdir(bp.PRESET_DIR))


@pytest.mark.parametrize("name", NAMES)
def test_loads_and_fits_its_model(name):
    spec = bp.SPECS[name]
    path = bp.preset_path(name)
    assert os.path.getsize(path) < min(MAX_PRESET_BYTES, 256 * 1024)
    p = load_preset(path)
    assert p.name == name and p.family == spec["family"]
    p.check_model(spec["fingerprint"], family=spec["family"])
    other = dict(spec["fingerprint"], layers=spec["fingerprint"]["layers"] + 1)
    with pytest.raises(ValueError, match="layers"):
        p.check_model(other)
    assert p.grid == spec["grid"] and p.tile == spec["tile"]
    assert p.num_layers == spec["fingerprint"]["layers"] and p.num_heads == spec["fingerprint"]["heads"]
    assert p.source == "geometry" and p.search["prompts"] == 0
    assert "NOT SEARCHED ON THE REAL MODEL" in p.notes
    assert p.search["rule"] == "target_sparsity" and p.search["value"] == bp.TARGET_SPARSITY
    assert 0.55 <= p.stats["sparsity"] <= 0.85
    assert all(0.5 <= s <= 0.9 for s in p.stats["layer_sparsity"])


@pytest.mark.parametrize("name", NAMES)
def test_stats_match_the_masks(name):
    """The recorded sparsity is the block sparsity of the stored parameters."""
    p = load_preset(bp.preset_path(name))
    rows = p.params.reshape(-1, 6)
    uniq, inv = torch.unique(rows, dim=0, return_inverse=True)
    dens = psa_mask(p.grid, uniq, p.tile).density()
    assert abs(float(1 - dens[inv].mean()) - p.stats["sparsity"]) < 1e-5
    for layer in (0, p.num_layers - 1):
        assert p.params_for_layer(layer).shape == (p.num_heads, 6)


@pytest.mark.parametrize("name", NAMES)
def test_reselect_from_committed_table_is_byte_identical(name):
    table = LossTable.load(bp.table_path(name))
    assert tuple(table.grid) == bp.SPECS[name]["grid"] and tuple(table.tile) == bp.SPECS[name]["tile"]
    text = preset_to_json(bp.preset_from_table(name, bp.SPECS[name], table)) + "\n"
    with open(bp.preset_path(name), encoding="utf-8") as f:
        assert f.read() == text


@pytest.mark.parametrize("name", ["ltx2_720p_121f", "ltx2.3_720p_121f", "wan2.2_ti2v_5b_720p_121f"])
def test_table_rows_reproduce_on_the_real_grid(name):
    """Re-evaluate two bank heads of a table (its full grid, all candidates): LTX-2 at 25 and
    LTX-2.3 at 24 frames per second (16x22x40), Wan 2.2 TI2V 5B (31x22x40)."""
    spec = bp.SPECS[name]
    committed = LossTable.load(bp.table_path(name))
    only = {0, 1}
    torch.set_num_threads(bp.THREADS)
    fresh = bp.search_bank(spec, only=only)
    assert torch.equal(fresh.candidates, committed.candidates)
    for h in sorted(only):
        torch.testing.assert_close(fresh.sq_err[0, 0, h], committed.sq_err[0, 0, h], rtol=1e-4, atol=1e-9)
        torch.testing.assert_close(fresh.ref_sq[0, 0, h], committed.ref_sq[0, 0, h], rtol=1e-4, atol=1e-9)
    a = fresh.select(target_sparsity=bp.TARGET_SPARSITY).index[0, 0, sorted(only)]
    b = committed.select(target_sparsity=bp.TARGET_SPARSITY).index[0, 0, sorted(only)]
    assert torch.equal(a, b)


def test_ltx2_rope_covers_every_pair_once():
    import math
    H, D = 32, 128
    om = torch.cat([bp.rope_ltx2_head(h, H, D)[0] for h in range(H)])
    assert om.numel() == H * D // 2
    assert int((om == 0).sum()) == H * D // 2 - 3 * ((H * D) // 6)       # the identity padding
    assert math.isclose(float(om[2]), math.pi / 2 * 2 * 8 / 25 / 20)    # first real pair: f0, t


def test_ltx23_rope_turns_with_its_frame_rate():
    """LTX-2.3 / 2.5's bank heads turn by 24 frames per second in time (LTX-2's by 25), the
    same in space."""
    old = bp.bank_of(bp.SPECS["ltx2_720p_121f"])
    new = bp.bank_of(bp.SPECS["ltx2.3_720p_121f"])
    assert len(old) == len(new) == 64
    (om_old, ax_old), (om_new, ax_new) = old[2][1], new[2][1]
    assert torch.equal(ax_old, ax_new)
    t = ax_new == 0
    torch.testing.assert_close(om_new[t], om_old[t] * 25 / 24, rtol=1e-12, atol=0)
    assert torch.equal(om_new[~t], om_old[~t])
