"""The kernels examples a user copies: README.md's snippet (run from the repository root, as
the README says) and examples/kernels_example.py (run from anywhere). On this machine's CPU
they take the float32 references; with CUDA, the Triton kernels."""
from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def readme_kernels_snippet() -> str:
    text = (REPO / "README.md").read_text()
    section = text.split("\n## Kernels", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1, f"expected one python block in README's Kernels section, found {len(blocks)}"
    return blocks[0]


def test_readme_snippet_runs_from_the_repository_root():
    code = readme_kernels_snippet() + "\nprint('shape', tuple(out.shape))\n"
    proc = subprocess.run([sys.executable, "-"], input=code, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "shape (1, 2048, 4, 64)" in proc.stdout


def test_example_file_runs_from_anywhere(tmp_path):
    proc = subprocess.run([sys.executable, str(REPO / "examples" / "kernels_example.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = dict(re.findall(r"^(Sol-Attn|PSA) .*rel-L2 vs dense ([0-9.]+)$", proc.stdout, flags=re.M))
    assert set(found) == {"Sol-Attn", "PSA"}, proc.stdout
    # q and k are local (a smooth function of position): both methods stay close to dense
    assert all(float(x) < 0.1 for x in found.values()), proc.stdout
    if "Triton kernel vs float32 reference" in proc.stdout:  # CUDA
        errs = re.findall(r"Triton kernel vs float32 reference: rel-L2 ([0-9.]+)", proc.stdout)
        assert len(errs) == 2 and all(float(e) < 2e-2 for e in errs), proc.stdout
