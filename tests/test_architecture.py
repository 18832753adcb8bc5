"""The layering of pejit's modules, read from their source with ``ast``.

* No module is over 600 lines (one idea per module), and every module says
  in its docstring what it owns.
* The import graph has no circle. Function-level imports count (they are
  how a circle hides), and so do type-only ones under ``if TYPE_CHECKING:``:
  a protocol both sides need lives below both (``_policy``).
* No module below the API layer imports the API layer, and the API modules
  import each other only where one builds on another (:data:`BUILDS_ON`).
* ``jax._src`` is imported only by ``_compat.py``, and only ``_compat.py``
  touches private attributes of JAX objects (``x._trace``, ``get_const``,
  ``debug_info._replace``): the staging trace (``_staging``) is built on the
  names ``_compat`` exports.
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

#: The layers, top to bottom, as docs/how-it-works.md's architecture section
#: draws them: a module imports only modules of its own layer or below.
LAYERS = [
    ("tools", {"pejit", "pejit.__main__", "pejit._demo", "pejit._xla_flags"}),
    ("API", {"pejit._api", "pejit._explain", "pejit._export", "pejit._auto", "pejit._tfc", "pejit._jit"}),
    ("specializer", {"pejit._calls._specializer", "pejit._calls._program", "pejit._calls._persist", "pejit._calls._unfolded"}),
    ("calls: options, keys, caches", {
        "pejit._calls._info", "pejit._calls._argnums", "pejit._calls._keys", "pejit._calls._cache", "pejit._calls._dispatch", "pejit._calls._stages",
        "pejit._calls._errors", "pejit._calls._jaxpr_json",
    }),
    ("partial evaluator", {
        "pejit._residual", "pejit._residual._partial_eval", "pejit._fold._folding", "pejit._fold._fold_rules", "pejit._residual.rules", "pejit._residual._cse", "pejit._residual._affine",
        "pejit._residual._collapse", "pejit._residual._linear", "pejit._fold._multihost",
    }),
    ("options and reports", {"pejit._fold._options", "pejit._reports._report", "pejit._fold._stats", "pejit._fold._flops", "pejit._reports._estimates"}),
    ("folding back end", {
        "pejit._fold._batch", "pejit._fold._values", "pejit._fold._primitives", "pejit._fold._progress", "pejit._fold._host", "pejit._fold._abstract",
        "pejit._fold._gc", "pejit._fold._offload", "pejit._fold._refold",
    }),
    ("staging trace", {"pejit._fold._staging", "pejit._fold._policy"}),
    ("JAX", {"pejit._compat", "pejit._calls", "pejit._reports", "pejit._fold"}),
]

#: The most lines a module may have.
MAX_LINES = 600

#: The API modules each API module may import: ``Pejitted`` (``_jit``) is the
#: base; the TFC form and ``auto`` are built on it, side by side; ``explain``
#: and ``export_folded`` accept every form; ``_api`` routes a call to its form.
#: The package, ``__main__`` and ``_demo`` are the tools on top.
BUILDS_ON = {
    "pejit._jit": set(),
    "pejit._tfc": {"pejit._jit"},
    "pejit._auto": {"pejit._jit"},
    "pejit._explain": {"pejit._jit", "pejit._tfc", "pejit._auto"},
    "pejit._export": {"pejit._jit", "pejit._tfc", "pejit._auto"},
    "pejit._api": {"pejit._jit", "pejit._tfc", "pejit._auto"},
}


def _module_name(path: pathlib.Path) -> str:
    parts = ("pejit", *path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)


def _sources():
    return {_module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


def _imports(name: str, path: pathlib.Path, modules) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
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
    assert "pejit._compat" in graph["pejit._fold._folding"]
    assert "pejit._fold._folding" in graph["pejit._residual.rules.loops"]
    assert "pejit._residual.rules" in graph["pejit._residual"]


def test_type_only_and_function_level_imports_are_read(tmp_path):
    path = tmp_path / "_x.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._fold._folding import Folder\n"
                    "def f():\n    from . import _auto\n")
    assert _imports("pejit._x", path, {"pejit._fold._folding", "pejit._auto"}) == {"pejit._fold._folding", "pejit._auto"}


def test_no_module_is_over_600_lines():
    sizes = {name: len(path.read_text().splitlines()) for name, path in _sources().items()}
    assert not {name: n for name, n in sizes.items() if n > MAX_LINES}


def test_every_module_says_what_it_owns():
    assert not [name for name, path in _sources().items() if not ast.get_docstring(ast.parse(path.read_text()))]


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


def _layer(module: str) -> int:
    """The layer of ``module`` (a rule module is in its package's; the benchmarks sit with the tools)."""
    if module.startswith("pejit.bench"):
        return 0
    if module.startswith("pejit._residual.rules."):
        module = "pejit._residual.rules"
    return next(i for i, (_, members) in enumerate(LAYERS) if module in members)


def test_every_module_is_in_a_layer():
    placed = set().union(*(members for _, members in LAYERS))
    assert not {m for m in _graph() if m not in placed and not m.startswith(("pejit.bench", "pejit._residual.rules."))}


def test_modules_import_only_their_layer_and_below():
    graph = _graph()
    up = {(m, d, LAYERS[_layer(d)][0]) for m, deps in graph.items() for d in deps if _layer(d) < _layer(m)}
    assert not up


def test_api_modules_import_only_what_they_build_on():
    graph = _graph()
    assert {m: graph[m] & API for m in BUILDS_ON} == BUILDS_ON


def test_jax_internals_only_in_compat():
    for name, path in _sources().items():
        if name == "pejit._compat":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom):
                assert not (node.module or "").startswith("jax._src"), (name, node.lineno)
            elif isinstance(node, ast.Import):
                assert not any(a.name.startswith("jax._src") for a in node.names), (name, node.lineno)
            elif isinstance(node, ast.Attribute):
                assert node.attr not in ("_trace", "get_const", "_replace"), (name, node.lineno, node.attr)
