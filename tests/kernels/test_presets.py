import copy
import json
import os
import random
import re

import pytest
import torch

from kernels.preset_file import load as presets_load
from kernels.preset_file import (
    MAX_PRESET_BYTES,
    load_preset,
    preset_from_json,
    preset_to_json,
    rescale_params,
    resolve_preset_path,
    save_preset,
)
from kernels.psa_mask import FIELDS, check_params, psa_block_mask
from preset_builders import make_preset


def test_round_trip(tmp_path):
    p = make_preset()
    path = tmp_path / "x.json"
    save_preset(p, path)
    q = load_preset(path)
    assert torch.equal(q.params, p.params) and q.params.dtype == torch.int64
    for name in ("name", "family", "model_name", "fingerprint", "grid", "tile", "bucket_edges", "source",
                 "search", "stats", "author", "notes", "created"):
        assert getattr(q, name) == getattr(p, name), name
    assert load_preset("x.json", folders=[str(tmp_path)]).name == p.name
    assert torch.equal(presets_load(path).params, p.params)
    # a preset is small: 40 layers x 40 heads stays far below the cap
    big = make_preset(layers=40, heads=40, buckets=1)
    assert len(preset_to_json(big).encode()) < 200_000


def test_params_for_and_buckets():
    p = make_preset()
    assert torch.equal(p.params_for(1, 0.2), p.params[0, 1])
    assert torch.equal(p.params_for(1, 0.5), p.params[1, 1])
    assert torch.equal(p.params_for(0, 0.99), p.params[1, 0])
    with pytest.raises(ValueError, match="layer 2 is outside"):
        p.params_for(2)
    # the interface the nodes use
    assert p.num_layers == 2 and p.num_heads == 3
    assert torch.equal(p.params_for_layer(1), p.params[0, 1]) and p.params_for_layer(2) is None


def test_model_mismatch_is_explained():
    p = make_preset()
    p.check_model({"layers": 2, "heads": 3, "head_dim": 128, "hidden_size": 5120}, family="wan2.1")
    with pytest.raises(ValueError, match=r"layers: preset 2, model 30; heads: preset 3, model 24"):
        p.check_model({"layers": 30, "heads": 24, "head_dim": 128, "hidden_size": 5120})
    with pytest.raises(ValueError, match="model family: preset 'wan2.1', model 'hunyuanvideo'"):
        p.check_model({"layers": 2}, family="hunyuanvideo")


# ------------------------------------------------------------------------ resolution policy
def test_same_block_grid_is_used_unchanged():
    p = make_preset()
    q = p.params_for_grid((21, 45, 80))  # 45 rows pad to 48: same 7 x 6 x 5 block grid
    assert q.grid == (21, 45, 80) and torch.equal(q.params, p.params)


def test_other_block_grid_is_refused_by_default():
    p = make_preset()
    with pytest.raises(ValueError, match=r"grid \(21, 48, 80\) \(block grid \(7, 6, 5\).*grid \(21, 30, 52\) \(block grid \(7, 4, 4\)\)"):
        p.params_for_grid((21, 30, 52))
    with pytest.raises(ValueError, match="on_mismatch"):
        p.params_for_grid((21, 30, 52), on_mismatch="ignore")


def test_rescale_warns_and_keeps_shapes_meaningful():
    p = make_preset()
    p.params[0, 0, 0] = torch.tensor([2, 0, 0, 2, 0, 5])   # STA column band on nW = 5
    p.params[0, 0, 1] = torch.tensor([7, 0, 0, 30, 0, 0])  # dense on 7 x 6 x 5
    p.params[0, 0, 2] = torch.tensor([1, 0, 0, 1, 0, 0])   # own block
    with pytest.warns(UserWarning, match="rescaling"):
        q = p.params_for_grid((42, 30, 52), on_mismatch="rescale")  # block grid 14 x 4 x 4
    assert q.params.shape == p.params.shape
    check_params(q.params.reshape(-1, 6))
    assert q.params[0, 0, 0].tolist() == [4, 0, 0, 2, 0, 4]  # still a full-height column band
    assert bool(psa_block_mask((42, 30, 52), q.params[0, 0, 1:2], (3, 8, 16)).all())  # dense stays dense
    assert q.params[0, 0, 2].tolist() == [2, 0, 0, 1, 0, 0]
    # ∞ stays ∞; a stride reaching the new axis length becomes ∞
    r = rescale_params(torch.tensor([[1, 0, 0, 1, 0, 0], [1, 0, 6, 1, 0, 25]]), (7, 6, 5), (3, 2, 2))
    assert r.tolist() == [[1, 0, 0, 1, 0, 0], [1, 0, 0, 1, 0, 0]]


# ------------------------------------------------------------------------ malformed presets
def valid_doc():
    return json.loads(preset_to_json(make_preset()))


def leaf_paths(x, path=()):
    if isinstance(x, dict):
        for k, v in x.items():
            yield from leaf_paths(v, path + (k,))
    elif isinstance(x, list) and x and not all(isinstance(e, (int, float)) and not isinstance(e, bool) for e in x):
        for i, v in enumerate(x):
            yield from leaf_paths(v, path + (i,))
    elif isinstance(x, list) and path[:1] == ("params",):
        for i, v in enumerate(x):
            yield path + (i,), v
    else:
        yield path, x


def name_of(path):
    out = "preset"
    for i, p in enumerate(path):
        if isinstance(p, str):
            out += "." + p
        elif path[0] == "params" and i == 4:
            out += "." + FIELDS[p]
        else:
            out += f"[{p}]"
    return out


def set_at(doc, path, value):
    d = doc
    for p in path[:-1]:
        d = d[p]
    d[path[-1]] = value


NULLABLE = {("search", "value"), ("search", "metric"), ("search", "query_tiles"), ("search", "rows_per_tile"),
            ("stats", "mean_loss")}


def wrong_type_values(v):
    if isinstance(v, bool):
        return ["x", 2]
    if isinstance(v, int):
        return ["x", 1.5, True, [], {}, None]
    if isinstance(v, float):
        return ["x", True, [], {}, None]
    if isinstance(v, str):
        return [5, True, [], {}, None]
    if isinstance(v, list):
        return ["x", 3, {}, None]
    return ["x", 3, [], None]


def test_fuzzed_wrong_types_name_the_field():
    doc = valid_doc()
    cases = 0
    for path, v in leaf_paths(doc):
        for bad in wrong_type_values(v):
            if bad is None and path in NULLABLE:
                continue
            d = copy.deepcopy(doc)
            set_at(d, path, bad)
            with pytest.raises(ValueError) as e:
                preset_from_json(json.dumps(d))
            expect = name_of(path)
            msg = str(e.value)
            assert msg.startswith(expect) or expect in msg, (path, bad, msg)
            cases += 1
    assert cases > 300


def test_fuzzed_random_mutations_never_crash():
    rng = random.Random(0)
    doc = valid_doc()
    paths = list(leaf_paths(doc))
    junk = [None, -1, 0, 10 ** 30, -(10 ** 30), 1e308, "", "../../etc", [], [[]], {}, {"a": 1}, True, 0.5, "∞"]
    for _ in range(400):
        d = copy.deepcopy(doc)
        for _ in range(rng.randint(1, 3)):
            path, _ = rng.choice(paths)
            set_at(d, path, rng.choice(junk))
        try:
            preset_from_json(json.dumps(d))
        except ValueError as e:
            assert str(e).startswith("preset")  # always a named, explained rejection
        # anything that loads is a valid preset (validation is all in preset_from_json)


@pytest.mark.parametrize("key", ["format", "version", "name", "model", "grid", "tile", "step_buckets", "params",
                                 "source", "search", "stats"])
def test_missing_top_level_field(key):
    d = valid_doc()
    del d[key]
    with pytest.raises(ValueError, match=rf"^preset\.{key}: missing field"):
        preset_from_json(json.dumps(d))


@pytest.mark.parametrize("path", [("model", "fingerprint", "heads"), ("search", "prompts"), ("stats", "sparsity"),
                                  ("step_buckets", "edges"), ("model", "family")])
def test_missing_nested_field(path):
    d = valid_doc()
    parent = d
    for p in path[:-1]:
        parent = parent[p]
    del parent[path[-1]]
    with pytest.raises(ValueError, match="^" + re.escape(name_of(path)) + ": missing field"):
        preset_from_json(json.dumps(d))


@pytest.mark.parametrize(
    "mutate,msg",
    [
        (lambda d: d.update(extra_field=1), r"preset\.extra_field: unknown field"),
        (lambda d: d["model"].update(code="import os"), r"preset\.model\.code: unknown field"),
        (lambda d: d.update(format="pickle"), r"preset\.format: expected 'psa-mask-preset'"),
        (lambda d: d.update(version=2), r"preset\.version: this code reads version 1"),
        (lambda d: d.update(name="../evil"), r"preset\.name: '\.\./evil' must match"),
        (lambda d: d["model"]["fingerprint"].update(heads=0), r"preset\.model\.fingerprint\.heads: expected an integer in \[1, 1024\]"),
        (lambda d: d.update(grid=[21, 48]), r"preset\.grid: expected 3 entries"),
        (lambda d: d.update(tile=[3, 0, 16]), r"preset\.tile\[1\]: expected an integer"),
        (lambda d: d["step_buckets"].update(edges=[0.7]), None),
        (lambda d: d["step_buckets"].update(edges=[1.5]), r"preset\.step_buckets\.edges\[0\]"),
        (lambda d: d["step_buckets"].update(unit="steps"), r"preset\.step_buckets\.unit"),
        (lambda d: d["params"].append(d["params"][0]), r"preset\.params: expected 2 entries"),
        (lambda d: d["params"][1].pop(), r"preset\.params\[1\]: expected 2 entries"),
        (lambda d: d["params"][0][1].append([1, 0, 0, 1, 0, 0]), r"preset\.params\[0\]\[1\]: expected 3 entries"),
        (lambda d: d["params"][1][0][2].pop(), r"preset\.params\[1\]\[0\]\[2\]: expected 6 entries"),
        (lambda d: d["params"][1][1][2].__setitem__(3, 0), r"preset\.params\[1\]\[1\]\[2\]\.Sw = 0: widths must be >= 1"),
        (lambda d: d["params"][0][1][0].__setitem__(2, -4), r"preset\.params\[0\]\[1\]\[0\]\.Ts = -4: strides"),
        (lambda d: d["params"][0][0][1].__setitem__(1, 10 ** 9), r"preset\.params\[0\]\[0\]\[1\]\.To = 1000000000"),
        (lambda d: d.update(source="magic"), r"preset\.source: expected one of"),
        (lambda d: d["search"].update(rule="eval"), r"preset\.search\.rule"),
        (lambda d: d["stats"].update(sparsity=1.5), r"preset\.stats\.sparsity: expected a number in \[0.0, 1.0\]"),
        (lambda d: d["stats"].update(layer_sparsity=[0.5]), r"preset\.stats\.layer_sparsity: expected 2 entries"),
        (lambda d: d.update(notes="x" * 5000), r"preset\.notes: longer than 4000"),
        (lambda d: d.update(author=["a"]), r"preset\.author: expected a string"),
    ],
)
def test_out_of_range_and_structure(mutate, msg):
    d = valid_doc()
    mutate(d)
    text = json.dumps(d)
    if msg is None:  # a valid variant (one edge at 0.7) still loads
        assert preset_from_json(text).bucket_edges == [0.7]
        return
    with pytest.raises(ValueError, match="^" + msg):
        preset_from_json(text)


def test_non_json_inputs():
    with pytest.raises(ValueError, match="preset: invalid JSON"):
        preset_from_json("{not json")
    with pytest.raises(ValueError, match="NaN is not valid JSON"):
        preset_from_json(re.sub(r'"sparsity": 0\.55', '"sparsity": NaN', json.dumps(valid_doc())))
    with pytest.raises(ValueError, match="preset: expected an object"):
        preset_from_json("[1, 2, 3]")
    with pytest.raises(ValueError, match="nested too deeply"):
        preset_from_json("[" * 200_000 + "]" * 200_000)
    with pytest.raises(ValueError, match="not UTF-8"):
        preset_from_json(b"\xff\xfe{}")
    with pytest.raises(ValueError, match="exceeds"):
        preset_from_json(b" " * (MAX_PRESET_BYTES + 1))


def test_huge_file_is_refused_before_reading(tmp_path):
    path = tmp_path / "huge.json"
    with open(path, "wb") as f:
        f.truncate(MAX_PRESET_BYTES + 10)
    with pytest.raises(ValueError, match="exceeds"):
        load_preset(path)
    with pytest.raises(ValueError, match="exceeds"):
        load_preset("huge.json", folders=[str(tmp_path)])


def test_names_are_confined_to_the_preset_folders(tmp_path):
    presets = tmp_path / "presets"
    presets.mkdir()
    outside = tmp_path / "secret.json"
    save_preset(make_preset(), outside)
    save_preset(make_preset(), presets / "good.json")
    os.symlink(outside, presets / "link.json")
    folders = [str(presets)]
    assert resolve_preset_path("good.json", folders) == os.path.realpath(presets / "good.json")
    for bad in ["../secret.json", str(outside), "sub/good.json", "good", "good.JSON", ".hidden.json", "",
                "good.json\x00", "..json", "a" * 70 + ".json", 5, None]:
        with pytest.raises(ValueError, match="preset name"):
            resolve_preset_path(bad, folders)
    with pytest.raises(ValueError, match="not found"):
        resolve_preset_path("link.json", folders)  # a link leading outside the folder
    with pytest.raises(ValueError, match="not found"):
        load_preset("missing.json", folders=folders)


# ------------------------------------------------------------------------ names, messages
@pytest.mark.parametrize("name", ["nl\n", "ok\n", "a\nb", "x" * 65, ".hidden", "a/b", "Ａ", ""])
def test_names_must_match_in_full(tmp_path, name):
    d = valid_doc()
    d["name"] = name
    with pytest.raises(ValueError, match=r"^preset\.name: "):
        preset_from_json(json.dumps(d))
    with pytest.raises(ValueError, match="preset name"):
        resolve_preset_path(name + ".json", [str(tmp_path)])
    from kernels.preset_file import check_name
    with pytest.raises(ValueError, match="^preset_name: "):
        check_name(name, "preset_name")


KNOWN = ("wan", "wan2.1", "wan2.2", "hunyuan_video", "ltxv", "ltx2")


def test_family_must_be_known(tmp_path):
    """A reader that knows its families (the nodes) refuses any other."""
    d = valid_doc()
    d["model"]["family"] = "bogus"
    with pytest.raises(ValueError, match=r"^preset\.model\.family: expected one of wan, wan2\.1, wan2\.2, "
                                         r"hunyuan_video, ltxv, ltx2, got 'bogus'"):
        preset_from_json(json.dumps(d), known_families=KNOWN)
    (tmp_path / "bogus.json").write_text(json.dumps(d))
    with pytest.raises(ValueError, match="bogus.json: preset.model.family"):
        load_preset(tmp_path / "bogus.json", known_families=KNOWN)
    assert preset_from_json(json.dumps(d)).family == "bogus"  # the file format takes any family name


@pytest.mark.parametrize("family", ["", "a/b", "x" * 65, 3, None])
def test_family_is_a_name(family):
    d = valid_doc()
    d["model"]["family"] = family
    with pytest.raises(ValueError, match=r"^preset\.model\.family: expected a family name"):
        preset_from_json(json.dumps(d))


def test_a_5000_digit_integer_names_its_field():
    text = re.sub(r'"params":\[\[\[\[-?[0-9]+', '"params":[[[[' + "9" * 5000, preset_to_json(make_preset()), count=1)
    with pytest.raises(ValueError) as e:
        preset_from_json(text)
    assert str(e.value).startswith("preset.params[0][0][0].Tw: expected an integer")
    assert "5000 digits" in str(e.value) and len(str(e.value)) < 300


def test_huge_unknown_key_gives_a_short_message():
    d = valid_doc()
    d["k" * 3_000_000] = 1
    with pytest.raises(ValueError) as e:
        preset_from_json(json.dumps(d))
    assert str(e.value).startswith("preset.kkk") and str(e.value).endswith(": unknown field")
    assert len(str(e.value)) < 200


def test_another_version_is_reported_as_such():
    d = valid_doc()
    d["version"] = 2
    d["grids"] = [d.pop("grid")]                 # a later format may have other fields
    with pytest.raises(ValueError, match=r"^preset\.version: this code reads version 1, got 2$"):
        preset_from_json(json.dumps(d))
    del d["format"]
    with pytest.raises(ValueError, match=r"^preset\.format: missing field$"):
        preset_from_json(json.dumps(d))


def test_long_values_are_cut_in_messages():
    text = preset_to_json(make_preset()).replace('"heads":3', '"heads":' + "7" * 4000, 1)
    with pytest.raises(ValueError) as e:
        preset_from_json(text)
    assert str(e.value) == "preset.model.fingerprint.heads: expected an integer, got an integer of 4000 digits"


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(ValueError, match="missing.json: cannot read it"):
        load_preset(tmp_path / "missing.json")
