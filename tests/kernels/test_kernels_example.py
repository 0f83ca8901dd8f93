"""What a user copies to run the library without ComfyUI, run as a user would: README.md's
snippet (its placeholder path replaced by this checkout, from a folder outside it),
docs/kernels_example.py and the PSA-Search CLI, each from outside the repository. On this
machine's CPU they take the float32 references; with CUDA, the Triton kernels.

The venv holds Hugging Face's package ``kernels`` too (transformers 5.x installs it; see
test_entry_points.py), so each of these also checks that the pack's library wins the name."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLACEHOLDER = "/path/to/sparse-video-attention"


def readme_kernels_snippet() -> str:
    blocks = re.findall(r"```python\n(.*?)```", (REPO / "README.md").read_text(), flags=re.S)
    assert len(blocks) == 1, f"expected one python block (the library snippet) in README.md, found {len(blocks)}"
    assert PLACEHOLDER in blocks[0], f"the snippet should put {PLACEHOLDER!r} (the pack's folder) on sys.path"
    return blocks[0]


def test_readme_snippet_runs_from_outside_the_repository(tmp_path):
    snippet = readme_kernels_snippet()
    code = snippet.replace(PLACEHOLDER, str(REPO)) + (
        "\nprint('shape', tuple(out.shape))"
        "\nprint('density', kernels.sol_block_selection(q.float(), k.float(), v.float(),"
        " beta=kernels.beta_for_density(0.15)).float().mean().item())\n")
    script = tmp_path / "snippet.py"
    script.write_text(code)
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "shape (1, 2048, 4, 64)" in proc.stdout
    # The snippet's comment states the density its Sol call achieves on its random q, k.
    stated = re.search(r"about (\d+) % on these random q, k", snippet)
    assert stated, "the snippet should say what density its Sol call achieves"
    achieved = float(re.search(r"^density ([0-9.]+)$", proc.stdout, flags=re.M).group(1))
    assert abs(achieved * 100 - int(stated.group(1))) <= 1.5, (achieved, stated.group(0))


def test_example_file_runs_from_anywhere(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "docs" / "kernels_example.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = dict(re.findall(r"^(Sol-Attn|PSA) .*rel-L2 vs dense ([0-9.]+)$", proc.stdout, flags=re.M))
    assert set(found) == {"Sol-Attn", "PSA"}, proc.stdout
    # q and k are local (a smooth function of position): both methods stay close to dense
    assert all(float(x) < 0.1 for x in found.values()), proc.stdout
    if "Triton kernel vs float32 reference" in proc.stdout:  # CUDA
        errs = re.findall(r"Triton kernel vs float32 reference: rel-L2 ([0-9.]+)", proc.stdout)
        assert len(errs) == 2 and all(float(e) < 2e-2 for e in errs), proc.stdout


def test_psa_search_cli_help_from_outside_the_repository(tmp_path):
    """README: `PYTHONPATH=/path/to/sparse-video-attention python -m kernels.psa_search --help`."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "kernels.psa_search", "--help"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "search" in proc.stdout and "select" in proc.stdout, proc.stdout
    readme = (REPO / "README.md").read_text()
    assert f"PYTHONPATH={PLACEHOLDER} python -m kernels.psa_search --help" in readme
