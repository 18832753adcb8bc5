"""The layering of pejit's modules, read from their source with ``ast``.

* The import graph has no circle (function-level imports count: they are
  how a circle hides).
* No module below the API layer imports the API layer.
* ``jax._src`` is imported only by ``_compat.py``, and only ``_compat.py``
  touches private attributes of JAX objects (``x._trace``, ``get_const``,
  ``debug_info._replace``).
"""

import ast
import pathlib

import pytest

import pejit

ROOT = pathlib.Path(pejit.__file__).parent

#: The API layer: what users call, and what drives it (demo, benchmarks).
API = {
    "pejit", "pejit.__main__", "pejit._api", "pejit._jit", "pejit._tfc", "pejit._auto", "pejit._explain", "pejit._demo",
    "pejit._export",
}


def _module_name(path: pathlib.Path) -> str:
    parts = ("pejit", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)


def _sources():
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _is_type_checking(node) -> bool:
    return isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)


def _walk(tree):
    """``ast.walk`` minus ``if TYPE_CHECKING:`` blocks (annotations only)."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        stack.extend(c for c in ast.iter_child_nodes(node) if not _is_type_checking(c))


def _imports(name: str, path: pathlib.Path, modules) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in _walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "pejit")
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            elif (node.module or "").split(".")[0] == "pejit":
                target = node.module
            else:
                continue
            if node.module:  # ``from . import x`` imports x, not the package
                found.add(target)
            found.update(f"{target}.{a.name}" for a in node.names if f"{target}.{a.name}" in modules)
    return {m for m in found if m in modules and m != name}


def _graph():
    sources = _sources()
    return {name: _imports(name, path, sources) for name, path in sources.items()}


def test_the_graph_is_read():
    graph = _graph()
    assert "pejit._compat" in graph["pejit._folding"]
    assert "pejit._folding" in graph["pejit.rules.loops"]
    assert "pejit.rules" in graph["pejit._residual"]


def test_import_graph_has_no_circle():
    graph = _graph()
    state: dict[str, int] = {}

    def visit(m, path):
        if state.get(m) == 1:
            pytest.fail("import circle: " + " -> ".join([*path[path.index(m):], m]))
        if state.get(m) == 2:
            return
        state[m] = 1
        for dep in sorted(graph[m]):
            visit(dep, [*path, m])
        state[m] = 2

    for m in sorted(graph):
        visit(m, [])


def test_no_module_below_the_api_layer_imports_it():
    below = {m: deps for m, deps in _graph().items() if m not in API and not m.startswith("pejit.bench")}
    bad = {m: sorted(deps & API) for m, deps in below.items() if deps & API}
    assert not bad


def test_jax_internals_only_in_compat():
    for name, path in _sources().items():
        if name == "pejit._compat":
            continue
        for node in _walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("jax._src"), (name, node.lineno)
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("jax._src") for a in node.names), (name, node.lineno)
            elif isinstance(node, ast.Attribute):
                assert node.attr not in ("_trace", "get_const", "_replace"), (name, node.lineno, node.attr)
