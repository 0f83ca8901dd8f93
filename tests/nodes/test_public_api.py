"""nodes/ uses only the library's public API (``kernels.__all__``), so the library may
rename or split its private modules without breaking the nodes. Read from the source, no
ComfyUI needed."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
NODE_MODULES = sorted((REPO / "nodes").rglob("*.py"))
# nodes/_kernels.py checks where the package was imported from
MODULE_FACTS = {"__file__"}


def public_names() -> set[str]:
    tree = ast.parse((REPO / "kernels" / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in node.targets):
            return set(ast.literal_eval(node.value))
    raise AssertionError("kernels/__init__.py defines no __all__")


def private_uses(path: Path, public: set[str]) -> list[str]:
    """Each use of the library outside its public API in one module, as ``line: what``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Name) and node.id == "kernels_module":
            found.append(f"{node.lineno}: kernels_module")
        elif isinstance(node, ast.Import):
            found += [f"{node.lineno}: import {a.name}" for a in node.names if a.name.startswith("kernels.")]
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            found += [f"{node.lineno}: kernels_module" for a in node.names if a.name == "kernels_module"]
            if module == "kernels" or module.startswith("kernels."):
                found.append(f"{node.lineno}: from {'.' * node.level}{module} import ...")
            elif module == "" and node.level >= 2:  # from .. import kernels: the package itself
                found += [f"{node.lineno}: from .. import {a.name}" for a in node.names if a.name != "kernels"]
        elif (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
              and node.value.id == "kernels" and node.attr not in public | MODULE_FACTS):
            found.append(f"{node.lineno}: kernels.{node.attr}")
    return sorted(found, key=lambda f: int(f.split(":")[0]))


def test_the_public_api_is_known():
    public = public_names()
    assert {"sol_attention", "psa_attention", "load_preset", "shown"} <= public


@pytest.mark.parametrize("path", NODE_MODULES, ids=lambda p: str(p.relative_to(REPO)))
def test_nodes_use_only_the_public_api(path):
    assert private_uses(path, public_names()) == []


def test_the_check_finds_private_uses(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("from ..kernels.preset_file import check_name\nimport kernels.layout\n"
                   "from ._kernels import kernels, kernels_module\n"
                   "x = kernels.preset_file.FAMILY_NAMES\ny = kernels.shown\n", encoding="utf-8")
    assert private_uses(bad, public_names()) == [
        "1: from ..kernels.preset_file import ...", "2: import kernels.layout",
        "3: kernels_module", "4: kernels.preset_file"]
