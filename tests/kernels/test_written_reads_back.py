"""What the pack writes, it reads back: loss tables, q/k/v samples and presets run the
loader's checks before the write, so a refusal comes first and names the input (the tensor,
the argument), and nothing unreadable reaches the disk, from NaN/inf data either."""
from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import save_file

import kernels.psa_search as ps
import kernels.psa_search.cli as psa_search_cli
from kernels.preset_file import load_preset, save_preset
from kernels.psa_search import LossTable, PSASearchAccumulator, load_qkv_sample, save_qkv_sample
from psa_search_inputs import GRID, N, TILE, accumulator, qkv


def with_value(t, value):
    t = t.clone()
    t[0, 5, 1, 2] = value
    return t


def raw_sample(path, q, k, v, grid=GRID, extra=0):
    """A sample file as another program might write it (save_qkv_sample refuses these)."""
    meta = {"format": "psa-qkv-sample", "version": "1",
            "header": json.dumps({"grid": list(grid), "layer": 0, "step": 0.25, "extra_tokens": extra})}
    save_file({"q": q, "k": k, "v": v}, str(path), metadata=meta)
    return path


def test_every_table_the_search_writes_loads_back_equal(tmp_path):
    acc = accumulator(bucket_edges=[0.5], extra_tokens=2, query_tiles=3, rows_per_tile=2)
    for layer, step in ((0, 0.1), (1, 0.3), (2, 0.7), (2, 0.9)):
        acc.add(*qkv(layer * 10 + int(step * 10), L=N + 2), layer=layer, step=step)
    written = acc.table()
    path = tmp_path / "t.safetensors"
    written.save(path)
    merged = LossTable.load(path).merge(written)
    merged.save(path)
    back = LossTable.load(path)
    for name in ("candidates", "density", "token_density", "sq_err", "ref_sq", "count", "calls"):
        assert torch.equal(getattr(back, name), getattr(merged, name)), name
    assert (back.grid, back.tile, back.layers, back.bucket_edges, back.num_heads, back.settings) == \
        (merged.grid, merged.tile, merged.layers, merged.bucket_edges, merged.num_heads, merged.settings)
    preset = ps.write_preset(back, tmp_path / "p.json", alpha=0.1, name="p", family="ltxv", model_name="m",
                             fingerprint={"layers": 3, "heads": 2, "head_dim": 8, "hidden_size": 16})
    save_preset(preset, tmp_path / "p2.json")
    assert torch.equal(load_preset(tmp_path / "p2.json").params, preset.params)


@pytest.mark.parametrize("which", [0, 1, 2])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_sample_with_nan_or_inf_is_refused_before_the_write(tmp_path, which, value):
    q, k, v = qkv(1)
    tensors = [q, k, v]
    tensors[which] = with_value(tensors[which], value)
    path = tmp_path / "s.safetensors"
    with pytest.raises(ValueError, match=f"^tensor {'qkv'[which]}: expected finite values"):
        save_qkv_sample(path, *tensors, layer=0, step=0.0, grid=GRID)
    assert os.listdir(tmp_path) == []
    save_qkv_sample(path, q, k, v, layer=0, step=0.0, grid=GRID)    # the finite one round-trips
    assert all(torch.equal(a, b) for a, b in zip(load_qkv_sample(path)[:3], (q, k, v)))


@pytest.mark.parametrize("value, scale", [(float("nan"), 1.0), (float("inf"), 1.0), (1.0, 1e30)])
def test_a_call_whose_dense_output_is_not_finite_is_not_evaluated(tmp_path, value, scale):
    """NaN/inf in v, or finite q and k whose float32 scores overflow: refused, not counted."""
    acc = accumulator()
    acc.add(*qkv(2), layer=0)
    q, k, v = qkv(3)
    with pytest.raises(ValueError, match="layer 1: the dense attention output of this call is not finite"):
        acc.add(q * scale, k * scale, with_value(v, value), layer=1)
    table = acc.table()
    assert table.calls.tolist() == [[1], [0]]
    table.save(tmp_path / "t.safetensors")
    assert LossTable.load(tmp_path / "t.safetensors").calls.tolist() == [[1], [0]]


@pytest.mark.parametrize("change, words", [
    ({"ref_sq": torch.full((1, 1, 2), float("nan"), dtype=torch.float64)}, "tensor ref_sq: expected finite values"),
    ({"num_heads": 0}, "header.num_heads: expected an integer in [1, 1024], got 0"),
    ({"bucket_edges": [0.5, 0.5]}, "header.bucket_edges: must be strictly ascending, got [0.5, 0.5]"),
    ({"bucket_edges": [1.5]}, "header.bucket_edges[0]: expected a denoising progress inside (0, 1), got 1.5"),
    ({"settings": {"query_tiles": 0}}, "header.settings.query_tiles: expected an integer in [1, 1048576]"),
    ({"settings": {"seconds": float("nan")}}, "header: NaN is not valid JSON"),
])
def test_a_table_the_loader_would_refuse_is_never_written(tmp_path, change, words):
    acc = accumulator()
    acc.add(*qkv(4), layer=0)
    table = acc.table()
    for name, value in change.items():
        setattr(table, name, value)
    path = tmp_path / "t.safetensors"
    with pytest.raises(ValueError) as e:
        table.save(path)
    assert words in str(e.value)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("options, words", [
    ({"bucket_edges": [0.5, 0.5]}, "bucket_edges: must be strictly ascending, got [0.5, 0.5]"),
    ({"bucket_edges": [1.5]}, "bucket_edges[0]: expected a denoising progress inside (0, 1), got 1.5"),
    ({"bucket_edges": [float("nan")]}, "bucket_edges[0]: expected a finite number"),
    ({"query_tiles": 0}, "query_tiles must be >= 1"),
    ({"rows_per_tile": 2 ** 21}, "rows_per_tile must be <= 1048576"),
    ({"extra_tokens": -1}, "extra_tokens must be >= 0"),
])
def test_accumulator_options_the_loader_would_refuse_are_refused_first(options, words):
    with pytest.raises(ValueError) as e:
        accumulator(**options)
    assert words in str(e.value)
    with pytest.raises(ValueError, match="num_heads must be >= 1"):
        PSASearchAccumulator(GRID, TILE, 0)


def cli_search(capsys, samples, out, *options):
    rc = psa_search_cli.main(["search", str(samples), "--tile", *map(str, TILE), "--out", str(out), "--max-candidates", "6",
                  *options])
    return rc, capsys.readouterr().err.strip()


@pytest.mark.parametrize("case, words", [
    ("nan_in_v", "s.safetensors: tensor v: expected finite values"),
    ("zero_heads", "s.safetensors: tensor q: expected shape (B, L, H, D) of non-empty dimensions, got [1, 72, 0, 8]"),
    ("edges_repeat", "--bucket-edges: must be strictly ascending, got [0.5, 0.5]"),
    ("edges_above_one", "--bucket-edges[0]: expected a denoising progress inside (0, 1), got 1.5"),
    ("query_tiles_beyond", "--query-tiles must be <= 1048576"),
])
def test_cli_search_refuses_before_writing_a_table_its_loader_refuses(tmp_path, capsys, case, words):
    samples = tmp_path / "samples"
    samples.mkdir()
    q, k, v = qkv(5)
    options = []
    if case == "nan_in_v":
        raw_sample(samples / "s.safetensors", q, k, with_value(v, float("nan")))
    elif case == "zero_heads":
        empty = torch.zeros(1, N, 0, 8)
        raw_sample(samples / "s.safetensors", empty, empty, empty)
    else:
        save_qkv_sample(samples / "s.safetensors", q, k, v, layer=0, step=0.25, grid=GRID)
        options = {"edges_repeat": ["--bucket-edges", "0.5", "0.5"], "edges_above_one": ["--bucket-edges", "1.5"],
                   "query_tiles_beyond": ["--query-tiles", str(2 ** 21)]}[case]
    out = tmp_path / "t.safetensors"
    rc, err = cli_search(capsys, samples, out, *options)
    assert rc == 2 and words in err and "\n" not in err, err
    assert not out.exists()


@pytest.mark.parametrize("header, words", [({"layer": 1024}, "layer must be <= 1023"), ({"layer": -1}, "layer must be >= 0"),
                                           ({"step": float("nan")}, "step: expected a finite number"),
                                           ({"step": float("inf")}, "step: expected a finite number")])
def test_a_sample_header_the_loader_would_refuse_is_never_written(tmp_path, header, words):
    path = tmp_path / "s.safetensors"
    with pytest.raises(ValueError, match=words):
        save_qkv_sample(path, *qkv(6), grid=GRID, **{"layer": 0, "step": 0.5, **header})
    assert os.listdir(tmp_path) == []
