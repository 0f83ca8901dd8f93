"""benchmarks/compare_variants.sh: one command per kernel variant in one device call, with the
working tree's kernels/ put back afterwards. Run here on a copy of the script in a skeleton tree."""
import os
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def tree(tmp_path):
    os.makedirs(tmp_path / "benchmarks")
    shutil.copy(os.path.join(ROOT, "benchmarks", "compare_variants.sh"), tmp_path / "benchmarks")
    os.makedirs(tmp_path / "kernels")
    (tmp_path / "kernels" / "loop.py").write_text("NAME = 'original'\n")
    (tmp_path / "kernels" / "other.py").write_text("OTHER = 1\n")
    for name in ("fast", "slow"):
        os.makedirs(tmp_path / "variants" / name)
        (tmp_path / "variants" / name / "loop.py").write_text(f"NAME = '{name}'\n")
    return tmp_path


def run(tree, *args):
    env = dict(os.environ, OUT=str(tree / "out"))
    return subprocess.run(["bash", str(tree / "benchmarks" / "compare_variants.sh"), *args], cwd=tree, env=env,
                          capture_output=True, text=True, timeout=60)


def test_each_variant_runs_with_its_files_and_the_tree_is_restored(tree):
    res = run(tree, "cat kernels/loop.py kernels/other.py > $OUT/$VARIANT/seen.txt", "variants/fast", "variants/slow")
    assert res.returncode == 0, res.stderr
    assert (tree / "out" / "fast" / "seen.txt").read_text() == "NAME = 'fast'\nOTHER = 1\n"
    assert (tree / "out" / "slow" / "seen.txt").read_text() == "NAME = 'slow'\nOTHER = 1\n"
    assert (tree / "kernels" / "loop.py").read_text() == "NAME = 'original'\n"


def test_a_failing_run_fails_the_call_but_every_variant_runs(tree):
    res = run(tree, "touch $OUT/$VARIANT/ran; [ $VARIANT = slow ]", "variants/fast", "variants/slow")
    assert res.returncode == 1
    assert "variant fast: exit 1" in res.stderr
    assert (tree / "out" / "fast" / "ran").exists() and (tree / "out" / "slow" / "ran").exists()
    assert (tree / "kernels" / "loop.py").read_text() == "NAME = 'original'\n"


@pytest.mark.parametrize("make, message", [
    (lambda t: os.makedirs(t / "variants" / "empty"), "holds no .py file"),
    (lambda t: (t / "variants" / "fast" / "new.py").write_text(""), "replaces nothing"),
])
def test_bad_variants_are_refused_before_anything_runs(tree, make, message):
    make(tree)
    target = "variants/empty" if "no .py" in message else "variants/fast"
    res = run(tree, "touch $OUT/ran", target)
    assert res.returncode == 2 and message in res.stderr
    assert not (tree / "out" / "ran").exists()


def test_usage(tree):
    res = run(tree, "true")
    assert res.returncode == 2 and "usage:" in res.stderr
