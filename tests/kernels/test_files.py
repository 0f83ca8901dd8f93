"""Nothing is written through a symbolic link: presets, loss tables and
q/k/v samples, with real links in temporary folders."""
import os

import pytest
import torch

from kernels.preset_file import load_preset, save_preset
from kernels.psa_search import LossTable, PSASearchAccumulator, candidate_space, save_qkv_sample
from preset_builders import make_preset


def small_table():
    grid, tile = (2, 4, 4), (1, 2, 2)
    acc = PSASearchAccumulator(grid, tile, 1, candidates=candidate_space(grid, tile, max_candidates=4))
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 32, 1, 8, generator=g) for _ in range(3))
    acc.add(q, k, v, layer=0)
    return acc.table(), (q, k, v, grid)


def write_preset(path, overwrite=True):
    if overwrite:
        save_preset(make_preset(), path)          # the default: replace an existing file
    else:
        save_preset(make_preset(), path, overwrite=False)


def write_table(path, overwrite=True):
    small_table()[0].save(path)


def write_sample(path, overwrite=True):
    q, k, v, grid = small_table()[1]
    save_qkv_sample(path, q, k, v, layer=0, step=0.0, grid=grid)


WRITERS = {"preset": (write_preset, "x.json"), "table": (write_table, "x.safetensors"),
           "sample": (write_sample, "x.safetensors")}


@pytest.fixture
def folders(tmp_path):
    inside, outside = tmp_path / "presets", tmp_path / "outside"
    inside.mkdir()
    outside.mkdir()
    return inside, outside


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_dangling_link_is_not_followed(folders, kind):
    inside, outside = folders
    write, name = WRITERS[kind]
    target = outside / "created.bin"
    os.symlink(target, inside / name)
    with pytest.raises(ValueError, match="symbolic link"):
        write(inside / name)
    assert not target.exists() and os.path.islink(inside / name)
    assert sorted(os.listdir(inside)) == [name]          # no temporary file left behind


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_link_to_an_existing_file_is_not_overwritten(folders, kind):
    inside, outside = folders
    write, name = WRITERS[kind]
    target = outside / "precious.txt"
    target.write_text("keep me")
    os.symlink(target, inside / name)
    with pytest.raises(ValueError, match="symbolic link"):
        write(inside / name, overwrite=True)
    assert target.read_text() == "keep me"


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_regular_files_are_written_and_replaced(folders, kind):
    inside, _ = folders
    write, name = WRITERS[kind]
    write(inside / name)
    first = os.path.getsize(inside / name)
    write(inside / name)                                  # replaced in place, atomically
    assert os.path.getsize(inside / name) == first and not os.path.islink(inside / name)
    assert sorted(os.listdir(inside)) == [name]


@pytest.fixture(params=[0o022, 0o077, 0o027])
def umask(request):
    """The process umask for one test (restored afterwards)."""
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


@pytest.mark.parametrize("kind", sorted(WRITERS))
def test_files_get_the_umask_permissions(folders, kind, umask):
    """Decision (docs/HARDENING.md): a file gets what the umask gives any new file, both when it
    is created and when it replaces one: samples hold activations of the user's prompts."""
    inside, _ = folders
    write, name = WRITERS[kind]
    for _ in range(2):
        write(inside / name)
        assert oct(os.stat(inside / name).st_mode & 0o777) == oct(0o666 & ~umask)


def test_preset_without_overwrite_refuses_an_existing_file(folders):
    inside, _ = folders
    write_preset(inside / "x.json")
    with pytest.raises(ValueError, match="exists"):
        write_preset(inside / "x.json", overwrite=False)
    assert load_preset(inside / "x.json").name == make_preset().name
    table, _ = small_table()
    table.save(inside / "t.safetensors")
    assert LossTable.load(inside / "t.safetensors").layers == [0]
