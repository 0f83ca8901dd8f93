"""Output paths are checked before the work: the CLI's ``--out`` before the search or the
selection, every write before its temporary file; an error names the argument and the
target, never the temporary file, and leaves nothing behind."""
from __future__ import annotations

import os

import pytest

import kernels.psa_search as ps
import kernels.psa_search.cli as psa_search_cli
from kernels._files import write_file
from psa_search_inputs import GRID, TILE, qkv


@pytest.fixture
def work(tmp_path, monkeypatch):
    """Samples, a table, and a current folder of its own (``--out ''`` once wrote beside it)."""
    samples = tmp_path / "samples"
    samples.mkdir()
    q, k, v = qkv(0)
    ps.save_qkv_sample(samples / "s.safetensors", q, k, v, layer=0, step=0.0, grid=GRID)
    table = tmp_path / "t.safetensors"
    assert psa_search_cli.main(["search", str(samples), "--tile", *map(str, TILE), "--out", str(table),
                    "--max-candidates", "4"]) == 0
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    return tmp_path, samples, table


def bad_outs(tmp_path):
    (tmp_path / "a_file").write_text("x")
    return {"empty": ("", "--out: the path is empty"),
            "missing_folder": (str(tmp_path / "nope" / "o"), f"--out: the folder {tmp_path / 'nope'} does not exist"),
            "a_folder": (str(tmp_path), f"--out: {tmp_path} is a folder"),
            "under_a_file": (str(tmp_path / "a_file" / "o"), "--out: the folder"),
            "not_regular": ("/dev/null", "--out: /dev/null exists and is not a regular file")}


@pytest.mark.parametrize("case", ["empty", "missing_folder", "a_folder", "under_a_file", "not_regular"])
@pytest.mark.parametrize("command", ["search", "select"])
def test_cli_out_is_checked_before_the_work(work, capsys, monkeypatch, command, case):
    tmp_path, samples, table = work
    out, words = bad_outs(tmp_path)[case]
    before = sorted(os.listdir(tmp_path))
    ran = []
    monkeypatch.setattr(ps, "search_samples", lambda *a, **k: ran.append("search"))
    monkeypatch.setattr(ps.LossTable, "load", classmethod(lambda cls, p: ran.append("load")))
    argv = {"search": ["search", str(samples), "--tile", *map(str, TILE), "--out", out],
            "select": ["select", str(table), "--alpha", "0.1", "--out", out, "--name", "n", "--family", "ltxv",
                       "--model-name", "m", "--fingerprint", "1", "2", "8", "16"]}[command]
    capsys.readouterr()
    assert psa_search_cli.main(argv) == 2
    err = capsys.readouterr().err
    assert words in err and ".tmp" not in err, err
    assert ran == []
    assert sorted(os.listdir(tmp_path)) == before and os.listdir(tmp_path / "cwd") == []


def test_a_failed_write_names_the_target_and_leaves_nothing(tmp_path):
    def disk_full(tmp):
        with open(tmp, "wb") as f:
            f.write(b"partial")
        raise OSError(28, "No space left on device")
    target = tmp_path / "t.safetensors"
    with pytest.raises(ValueError) as e:
        write_file(target, disk_full)
    assert str(e.value) == f"cannot write {target}: No space left on device"
    assert os.listdir(tmp_path) == []
    with pytest.raises(ValueError, match=f"^the folder {tmp_path / 'missing'} does not exist"):
        write_file(tmp_path / "missing" / "x.json", b"{}")
