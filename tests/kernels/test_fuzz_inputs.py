"""Fuzzed presets and loss tables: random mutations of valid files, with fixed
seeds, must either load (and then work: masks, rescaling, selection) or raise a ValueError
with a short message that names the field or the file. Never another exception, never a
huge message, never a huge allocation (the process's peak memory is checked)."""
import copy
import json
import os
import random
import resource

import pytest
import torch

from kernels.preset_file import preset_from_json, preset_to_json
from kernels.psa_mask import psa_mask
from kernels.psa_search import LossTable, PSASearchAccumulator, candidate_space
from preset_builders import make_preset

MAX_MESSAGE = 600
BIG = "9" * 5000   # raw JSON text: more digits than Python will parse


def junk_values(rng):
    return [None, True, -1, 0, 1, 2, 3, 7, 64, 255, 256, 1023, 1024, 1025, 4096, 65536, 1 << 20, (1 << 20) + 1,
            10 ** 9, 10 ** 30, -(10 ** 30), 1e308, -0.5, 0.5, 1.5, float("1e-300"), "", "x", "nl\n", "１", "../../x",
            "k" * rng.choice([10, 70, 5000]), [], [[]], [1, 2], [0, 0, 0], [8, 64, 64], [1, 1, 1], [4096] * 3,
            [1024, 1024, 1024], list(range(50)), {}, {"a": 1}, {"layers": 1}]


def paths_of(x, path=()):
    yield path
    if isinstance(x, dict):
        for k, v in x.items():
            yield from paths_of(v, path + (k,))
    elif isinstance(x, list):
        for i, v in enumerate(x[:8]):          # a few entries of long lists are enough
            yield from paths_of(v, path + (i,))


def mutate(doc, rng):
    """One random change at a random place: replace, delete, add a key, grow a list."""
    paths = [p for p in paths_of(doc) if p]
    path = rng.choice(paths)
    parent = doc
    for p in path[:-1]:
        parent = parent[p]
    key = path[-1]
    op = rng.random()
    if op < 0.6:
        parent[key] = copy.deepcopy(rng.choice(junk_values(rng)))
    elif op < 0.75:
        if isinstance(parent, dict):
            del parent[key]
        else:
            parent.pop(key)
    elif op < 0.85 and isinstance(parent, dict):
        parent[rng.choice(["extra", "k" * 3000, "grid", "version"])] = rng.choice(junk_values(rng))
    elif isinstance(parent, list):
        parent.append(copy.deepcopy(parent[key]))
    else:
        parent[key] = copy.deepcopy(rng.choice(junk_values(rng)))


def text_mutation(text, rng):
    op = rng.random()
    if op < 0.3:                                   # a number too long to parse
        i = text.index(":", rng.randrange(len(text) // 2)) + 1
        return text[:i] + BIG + text[i:].split(",", 1)[-1] if "," in text[i:] else text
    if op < 0.6:                                   # cut short
        return text[: rng.randrange(len(text))]
    i = rng.randrange(len(text))                   # one character replaced
    return text[:i] + rng.choice('{}[]",:0 -9a\n\u0661') + text[i + 1:]


def peak_rss_mb():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def check_message(e, *starts):
    msg = str(e)
    assert len(msg) < MAX_MESSAGE, msg[:200]
    assert msg.startswith(starts), msg[:200]


def use_preset(p):
    """What the nodes do with a loaded preset: masks of a layer, rescaling, saving."""
    m = psa_mask(p.grid, p.params_for(0, 0.0), p.tile)
    assert m.density(tokens=True).shape == (p.num_heads,)
    preset_from_json(preset_to_json(p))
    try:
        q = p.params_for_grid((p.grid[0] + 3, p.grid[1] * 2, p.grid[2]), on_mismatch="rescale")
        psa_mask(q.grid, q.params_for(0), q.tile).density()
    except ValueError as e:
        check_message(e, "preset ", "grid ")


@pytest.mark.filterwarnings("ignore:rescaling preset")
def test_fuzzed_presets_load_or_name_the_field():
    rng = random.Random(11)
    base = json.loads(preset_to_json(make_preset(layers=2, heads=3, buckets=2)))
    before = peak_rss_mb()
    loaded = rejected = 0
    for case in range(300):
        doc = copy.deepcopy(base)
        for _ in range(rng.randint(1, 3)):
            mutate(doc, rng)
        text = json.dumps(doc)
        if case % 4 == 0:
            text = text_mutation(text, rng)
        try:
            p = preset_from_json(text)
        except ValueError as e:
            check_message(e, "preset")
            rejected += 1
            continue
        use_preset(p)
        loaded += 1
    assert rejected > 200 and loaded > 5
    assert peak_rss_mb() - before < 1024


def valid_table(path):
    grid, tile = (3, 4, 6), (1, 2, 3)
    acc = PSASearchAccumulator(grid, tile, 2, candidates=candidate_space(grid, tile, max_candidates=6),
                               bucket_edges=[0.5])
    g = torch.Generator().manual_seed(5)
    for layer in (0, 2):
        for step in (0.2, 0.7):
            q, k, v = (torch.randn(1, 72, 2, 8, generator=g) for _ in range(3))
            acc.add(q, k, v, layer=layer, step=step)
    t = acc.table()
    t.settings.update(family="wan", prompts=1, model_name="m",
                      fingerprint={"layers": 3, "heads": 2, "head_dim": 128, "hidden_size": 256})
    t.save(path)


def read_parts(path):
    from safetensors import safe_open
    with safe_open(path, framework="pt") as f:
        return dict(f.metadata()), {n: f.get_tensor(n) for n in f.keys()}


def junk_tensor(rng, t):
    choices = [t[:1], t.float(), t.to(torch.int64), t.reshape(-1), torch.cat([t, t]), t * float("nan"), -t - 1,
               t + float("inf"), torch.zeros(0, dtype=t.dtype), torch.zeros(4096, dtype=t.dtype)]
    return rng.choice(choices).contiguous()


def test_fuzzed_tables_load_or_name_the_file(tmp_path):
    from safetensors.torch import save_file
    rng = random.Random(12)
    good = str(tmp_path / "good.safetensors")
    valid_table(good)
    meta0, tensors0 = read_parts(good)
    header0 = json.loads(meta0["header"])
    raw0 = open(good, "rb").read()
    path = str(tmp_path / "fuzz.safetensors")
    before = peak_rss_mb()
    loaded = rejected = 0
    for case in range(240):
        kind = case % 4
        if kind == 3:                                     # bytes corrupted or cut
            data = bytearray(raw0)
            for _ in range(rng.randint(1, 8)):
                data[rng.randrange(len(data))] = rng.randrange(256)
            data = bytes(data[: rng.randrange(len(data))]) if rng.random() < 0.3 else bytes(data)
            with open(path, "wb") as f:
                f.write(data)
        else:
            meta, tensors, header = dict(meta0), dict(tensors0), copy.deepcopy(header0)
            if kind == 0:                                 # the JSON header
                for _ in range(rng.randint(1, 3)):
                    mutate(header, rng)
                meta["header"] = json.dumps(header)
                if rng.random() < 0.2:
                    meta["header"] = text_mutation(meta["header"], rng)
            elif kind == 1:                               # the metadata around it
                key = rng.choice(["format", "version", "header"])
                meta[key] = rng.choice(["", "2", "psa-qkv-sample", "{}", "[]", "null", json.dumps(header)[:50]])
            else:                                         # the tensors
                name = rng.choice(sorted(tensors))
                if rng.random() < 0.2:
                    del tensors[name]
                else:
                    tensors[name] = junk_tensor(rng, tensors[name])
            save_file(tensors, path, metadata=meta)
        try:
            t = LossTable.load(path)
        except ValueError as e:
            check_message(e, path + ": ")
            rejected += 1
            continue
        loaded += 1
        for kw in ({"alpha": 0.01}, {"target_sparsity": 0.5, "metric": "rel"}):
            s = t.select(**kw)
            assert s.params.shape[-1] == 6
        t.summary()
        t.merge(t)
    assert rejected > 150 and loaded > 5
    assert peak_rss_mb() - before < 1024
    assert os.path.isfile(good)
