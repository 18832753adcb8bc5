"""The layering of pejit's package, read from its source with ``ast``.

* The package is stages, top to bottom (:data:`STAGES`): the public surface
  in ``pejit/`` itself (the tools, then the API modules), one subpackage
  per stage, and ``_compat``. A module imports only its own stage and the
  stages below it, and each subpackage's ``__init__`` says what the stage
  owns and which stages it imports.
* No module is over 600 lines (one idea per module), and every module says
  in its docstring what it owns.
* The import graph has no circle. Function-level imports count (they are
  how a circle hides), and so do type-only ones under ``if TYPE_CHECKING:``:
  a protocol both sides need lives below both (``_fold._policy``).
* The API modules import each other only where one builds on another
  (:data:`BUILDS_ON`).
* No chain of imports is longer than :data:`MAX_DEPTH` modules.
* ``jax._src`` is imported only by ``_compat.py``, and only ``_compat.py``
  touches private attributes of JAX objects (``x._trace``, ``get_const``,
  ``debug_info._replace``): the staging trace (``_fold._staging``) is built
  on the names ``_compat`` exports.
* Above ``_calls``, its objects are used through their public names: no
  module there reads or writes an attribute by a private name that
  ``_calls`` defines, nor imports one from it.
"""

import ast
import functools
import pathlib
import re

import pytest

import pejit

ROOT = pathlib.Path(pejit.__file__).parent

#: The tools on top of the public surface: the package itself, the command
#: line and the demo (the benchmark suite, ``pejit.bench``, sits with them).
TOOLS = {"pejit", "pejit.__main__", "pejit._demo", "pejit._xla_flags"}

#: The API modules: what users call.
API = {"pejit._api", "pejit._jit", "pejit._tfc", "pejit._auto", "pejit._explain", "pejit._export"}

#: The stages, top to bottom, as docs/how-it-works.md's architecture section
#: draws them: the surface's two layers, a subpackage per stage, ``_compat``.
STAGES = ["tools", "API", "pejit._calls", "pejit._residual", "pejit._reports", "pejit._fold", "pejit._compat"]

#: The most lines a module may have.
MAX_LINES = 600

#: The most modules a chain of imports may pass through, the benchmark suite
#: aside: 19 when the modules sat side by side in ``pejit/``.
MAX_DEPTH = 16

#: The API modules each API module may import: ``Pejitted`` (``_jit``), the
#: TFC form and ``auto`` are each built on the call path (``_calls``), side by
#: side; ``explain`` and ``export_folded`` accept every form; ``_api`` routes
#: a call to its form.
BUILDS_ON = {
    "pejit._jit": set(),
    "pejit._tfc": set(),
    "pejit._auto": set(),
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
    assert "pejit._compat" in graph["pejit._residual.rules.loops"]  # from ... import _compat
    assert "pejit._fold._folding" in graph["pejit._residual.rules.loops"]
    assert "pejit._residual.rules" in graph["pejit._residual"]


def test_type_only_and_function_level_imports_are_read(tmp_path):
    path = tmp_path / "_x.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from ._fold._folding import Folder\n"
                    "def f():\n    from . import _auto\n")
    modules = {"pejit._fold._folding", "pejit._auto"}
    assert _imports("pejit._x", path, modules) == modules


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


def _stage(module: str) -> int | None:
    """The stage of ``module`` (an index into :data:`STAGES`), or None if it has none."""
    if module in TOOLS or module.startswith("pejit.bench"):
        return 0
    if module in API:
        return 1
    return next((i for i, s in enumerate(STAGES) if module == s or module.startswith(s + ".")), None)


def test_every_module_is_in_a_stage():
    assert not {m for m in _graph() if _stage(m) is None}


def test_modules_import_only_their_stage_and_below():
    graph = _graph()
    up = {(m, d, STAGES[_stage(d)]) for m, deps in graph.items() for d in deps if _stage(d) < _stage(m)}
    assert not up


def test_every_stage_says_what_it_owns_and_what_it_imports():
    """Its docstring names each of its modules, and its ``Imports:`` the stages below it."""
    below = [s.removeprefix("pejit.") for s in STAGES[2:]]
    for i, stage in enumerate(below[:-1]):
        package = ROOT / stage
        doc = ast.get_docstring(ast.parse((package / "__init__.py").read_text())) or ""
        children = {p.stem for p in package.glob("_*.py") if p.stem != "__init__"}
        children |= {p.parent.name for p in package.glob("*/__init__.py")}
        assert not {c for c in children if f"``{c}``" not in doc and f"``{c}/" not in doc}, stage
        imports = doc[doc.index("Imports:"):].split("\n\n")[0]
        assert set(re.findall(r"``(\w+)``", imports)) == set(below[i + 1:]), stage


def _longest_chain(graph) -> list[str]:
    """The longest chain of imports in ``graph``, importer first."""

    @functools.cache
    def chain(m):
        return (m, *max((chain(d) for d in graph[m]), key=len, default=()))

    return list(max((chain(m) for m in sorted(graph)), key=len))


def test_import_chains_are_short():
    chain = _longest_chain({m: deps for m, deps in _graph().items() if not m.startswith("pejit.bench")})
    assert len(chain) <= MAX_DEPTH, " -> ".join(chain)


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



def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__") and name != "_"


def _defined_private_names(tree: ast.Module) -> set[str]:
    """The private names a module defines: its functions, classes and variables,
    its classes' methods, attributes and ``__slots__``, and the attributes its
    code assigns (``self._x = ...``, ``new._x = ...``); not local variables."""
    names = set()
    scopes = [tree.body, *(node.body for node in ast.walk(tree) if isinstance(node, ast.ClassDef))]
    for body in scopes:
        for node in body:
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, ast.AnnAssign) else []
            names.update(t.id for t in targets if isinstance(t, ast.Name))
            if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "__slots__" for t in targets):
                names.update(c.value for c in ast.walk(node.value) if isinstance(c, ast.Constant)
                             and isinstance(c.value, str))
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            names.add(node.attr)
    return {n for n in names if _private(n)}


@functools.cache
def _calls_private_names() -> frozenset[str]:
    return frozenset().union(*(_defined_private_names(ast.parse(path.read_text()))
                               for name, path in _sources().items() if name.startswith("pejit._calls")))


def _private_touches(name: str, path: pathlib.Path, modules) -> list[str]:
    """Where module ``name`` (above ``_calls``) uses a private name it does not own:
    an attribute, of anything but ``self`` or ``cls``, by a private name that
    ``_calls`` defines or that the module itself does not; or a private name
    imported from ``_calls``."""
    tree = ast.parse(path.read_text())
    calls, own = _calls_private_names(), _defined_private_names(tree)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")) and (
                    node.attr in calls or node.attr not in own):
                found.append(ast.unparse(node))
        elif isinstance(node, ast.ImportFrom):
            base = (package.rsplit(".", node.level - 1)[0] if node.level > 1 else package) if node.level else ""
            target = ".".join(p for p in (base, node.module) if p)
            if target == "pejit._calls" or target.startswith("pejit._calls."):
                found.extend(f"from {target} import {a.name}" for a in node.names
                             if _private(a.name) and f"{target}.{a.name}" not in modules)
    return found


def _above_calls() -> dict[str, pathlib.Path]:
    calls = STAGES.index("pejit._calls")
    return {name: path for name, path in _sources().items() if _stage(name) < calls}


def test_the_private_names_of_calls_are_read():
    names = _calls_private_names()
    # a method, attributes assigned in __init__ and elsewhere, a slot, module-level functions and constants
    assert {"_lookup", "_layouts", "_jitted", "_watchers", "_split", "_leaf_key", "_tree_flatten", "_SOURCE"} <= names
    assert not {n for n in names if not _private(n)}
    assert set(API) | {"pejit", "pejit._demo"} <= set(_above_calls())


def test_a_touch_of_private_names_is_found(tmp_path):
    path = tmp_path / "_x.py"
    path.write_text(
        "from ._calls._keys import _leaf_key, constant_key\nfrom ._calls import _errors\n"
        "class A:\n    __slots__ = ('_own',)\n"
        "def f(pj, path, a):\n    path._layouts.clear()\n    pj._path.lower()\n"
        "    return self._layouts, a._own, path.layout(1), _errors.warn\n")
    assert sorted(_private_touches("pejit._x", path, _sources())) == [
        "from pejit._calls._keys import _leaf_key", "path._layouts", "pj._path"]


def test_nothing_above_calls_touches_private_names_it_does_not_own():
    """``_calls``'s objects are used by their public names (``Pejitted``, the TFC
    form and ``auto`` through their call paths' interface), and the API modules
    use one another's by their public names too (``_jit.call_path``)."""
    modules = _sources()
    found = {name: hits for name, path in _above_calls().items() if (hits := _private_touches(name, path, modules))}
    assert not found
