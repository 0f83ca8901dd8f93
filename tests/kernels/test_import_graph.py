"""No module of the library (kernels/) or of the nodes (nodes/) imports another that imports it
back, directly or through others, counting the imports inside functions: a circle makes the
import order matter and ties the modules on it into one."""
import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = ("kernels", "nodes")


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_names(path: Path, module: str):
    """Every module named by an import statement of ``path``, at any depth, relative imports
    resolved; ``from x import y`` names ``x.y`` (y may be a submodule, else the name leads back
    to ``x``)."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module
            yield from (f"{target}.{alias.name}" for alias in node.names)


def import_graph() -> dict:
    files = {module_name(p): p for package in PACKAGES for p in (REPO / package).rglob("*.py")}
    graph = {}
    for module, path in files.items():
        edges = set()
        for name in imported_names(path, module):
            # A module importing a submodule runs its package's __init__ first: the edge goes to
            # the most specific module of the pack that the name reaches.
            while name and name not in files:
                name = name.rpartition(".")[0]
            if name and name != module:
                edges.add(name)
        graph[module] = edges
    return graph


def find_cycle(graph: dict):
    """One circle of ``graph`` as a list of modules (first repeated at the end), or None."""
    state = {}
    stack = []

    def visit(node):
        state[node] = "open"
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == "open":
                return stack[stack.index(nxt):] + [nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = "done"
        return None

    for node in sorted(graph):
        if node not in state:
            found = visit(node)
            if found:
                return found
    return None


def test_the_finder_sees_a_circle():
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_circle(package):
    graph = import_graph()
    inside = {m: {e for e in edges if e.split(".")[0] == package} for m, edges in graph.items()
              if m.split(".")[0] == package}
    cycle = find_cycle(inside)
    assert cycle is None, "import circle: " + " -> ".join(cycle)
