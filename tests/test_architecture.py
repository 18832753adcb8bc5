"""The layering of pejit's package, read from its source with ``ast``.

* The package is stages, top to bottom (:data:`STAGES`): the public surface
  in ``pejit/`` itself (the tools, then the API modules), and one
  subpackage per stage, ``_compat`` last. A module imports only its own stage and the
  stages below it, and each subpackage's ``__init__`` says what the stage
  owns and which stages it imports.
* No module is over 600 lines (one idea per module), and every module says
  in its docstring what it owns.
* The import graph has no circle. Function-level imports count (they are
  how a circle hides), and so do type-only ones under ``if TYPE_CHECKING:``:
  a protocol both sides need lives below both (``_fold._policy``).
* The API modules import each other only where one builds on another
  (:data:`BUILDS_ON`).
* No chain of imports is longer than :data:`MAX_DEPTH` modules. The rest
  of the package imports ``_compat`` whole, never one of its private
  modules, so the chain counts it as one module.
* Only ``_compat`` uses JAX internals and tells JAX versions apart
  (:func:`_jax_internals_used`): ``jax._src`` and ``jax.interpreters`` are
  imported there only; no other module reads ``jax.__version__`` or
  ``jaxlib.__version__`` or probes JAX for what it has (``hasattr`` on a
  JAX module or class, an import of JAX tried); and only ``_compat``
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
#: draws them: the surface's two layers, then a subpackage per stage.
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
    for i, stage in enumerate(below):
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
    graph = {m: deps for m, deps in _graph().items() if not m.startswith("pejit.bench")}
    outside = {m: deps for m, deps in graph.items() if _stage(m) != STAGES.index("pejit._compat")}
    chain = _longest_chain(outside | {"pejit._compat": set()})
    assert len(chain) <= MAX_DEPTH, " -> ".join(chain)


def test_compat_is_imported_whole():
    """Outside ``_compat``, modules import the package (``from .. import _compat``), not its modules."""
    compat = STAGES.index("pejit._compat")
    assert not {(m, d) for m, deps in _graph().items() if _stage(m) != compat
                for d in deps if _stage(d) == compat and d != "pejit._compat"}


def test_api_modules_import_only_what_they_build_on():
    graph = _graph()
    assert {m: graph[m] & API for m in BUILDS_ON} == BUILDS_ON


#: The modules whose internals pejit reads through ``_compat`` only.
JAX_INTERNAL_MODULES = ("jax._src", "jax.interpreters")

#: What ``from jax import ...`` may not take, for the same reason.
JAX_INTERNAL_NAMES = {"_src", "interpreters", "version"}


def _internal(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in JAX_INTERNAL_MODULES)


def _is_jax(module: str) -> bool:
    return module.split(".")[0] in ("jax", "jaxlib")


def _root(node: ast.AST) -> str | None:
    """The name an expression such as ``jax.custom_vjp.defvjp`` starts from."""
    while isinstance(node, (ast.Attribute, ast.Subscript, ast.Call)):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _imports_jax(nodes) -> bool:
    return any(
        (isinstance(n, ast.Import) and any(_is_jax(a.name) for a in n.names))
        or (isinstance(n, ast.ImportFrom) and not n.level and _is_jax(n.module or ""))
        for node in nodes for n in ast.walk(node)
    )


def _jax_internals_used(source: str) -> list[tuple[int, str]]:
    """``(line, what)`` for each use of a JAX internal or JAX-version probe in ``source``.

    Read with ``ast``: an import of :data:`JAX_INTERNAL_MODULES` (``import``,
    ``from ... import``, or ``from jax import interpreters``); a read of
    ``__version__``/``__version_info__`` on a name bound to a JAX module,
    of ``jax.version``, or of a JAX package's version through
    ``importlib.metadata.version("jax")``; a probe of a name bound to a JAX
    module or to something imported from one (``jax``, ``lax``, ``P``,
    ``Primitive``, ...): ``hasattr(...)``, ``getattr(...)`` with a default,
    ``vars(...)``, ``dir(...)``; and an import of JAX tried under ``try``
    with an ``except ImportError`` (or ``AttributeError``). A probe of an
    object JAX returned (an aval, a tracer) is not visible to ``ast``.
    """
    tree = ast.parse(source)
    jax_names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            jax_names.update(a.asname or a.name.split(".")[0] for a in node.names if _is_jax(a.name))
        elif isinstance(node, ast.ImportFrom) and not node.level and _is_jax(node.module or ""):
            jax_names.update(a.asname or a.name for a in node.names)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}") for a in node.names if _internal(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level:
            module = node.module or ""
            if _internal(module) or (module == "jax" and any(a.name in JAX_INTERNAL_NAMES for a in node.names)):
                found.append((node.lineno, f"from {module} import ..."))
        elif isinstance(node, ast.Attribute) and _root(node) in jax_names and (
            node.attr in ("__version__", "__version_info__")
            or (node.attr == "version" and isinstance(node.value, ast.Name))
        ):
            found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, (ast.Name, ast.Attribute)):
            func = node.func.id if isinstance(node.func, ast.Name) else node.func.attr
            first = node.args[0] if node.args else None
            if func in ("hasattr", "vars", "dir") or (func == "getattr" and len(node.args) == 3):
                if first is not None and _root(first) in jax_names:
                    found.append((node.lineno, ast.unparse(node)))
            elif func == "version" and isinstance(first, ast.Constant) and _is_jax(str(first.value)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Try):
            caught = " ".join(ast.unparse(h.type) for h in node.handlers if h.type is not None)
            if any(e in caught for e in ("ImportError", "ModuleNotFoundError", "AttributeError")) and _imports_jax(
                    node.body):
                found.append((node.lineno, "try: import jax ... except ImportError"))
    return found


def test_jax_internals_only_in_compat():
    used = {name: _jax_internals_used(path.read_text()) for name, path in _sources().items()
            if _stage(name) != STAGES.index("pejit._compat")}
    assert not {name: found for name, found in used.items() if found}


def test_jax_internals_are_found():
    """The check above catches each kind of use (a planted one apiece), and not the public API."""
    planted = {
        "import jax._src.core": "import jax._src.core",
        "from jax._src import core": "from jax._src import ...",
        "from jax.interpreters import ad": "from jax.interpreters import ...",
        "from jax import interpreters": "from jax import ...",
        "import jax\nv = jax.__version__": "jax.__version__",
        "import jaxlib\nv = jaxlib.__version__": "jaxlib.__version__",
        "import jax\nv = jax.version._version": "jax.version",
        "from importlib.metadata import version\nv = version('jaxlib')": "version('jaxlib')",
        "import jax\nF = hasattr(jax.custom_vjp, 'defvjp_with_logs')": "hasattr(jax.custom_vjp, 'defvjp_with_logs')",
        "from jax import lax\nF = getattr(lax, 'split_p', None)": "getattr(lax, 'split_p', None)",
        "import jax\nF = '__call__' in vars(jax.stages.Traced)": "vars(jax.stages.Traced)",
        "try:\n    from jax.extend.core import split_p\nexcept ImportError:\n    split_p = None":
            "try: import jax ... except ImportError",
    }
    for source, what in planted.items():
        assert [w for _, w in _jax_internals_used(source)] == [what], source
    public = ("import jax\nimport jax.numpy as jnp\nfrom jax.extend.core import primitives as P\n"
              "f = getattr(jnp, 'sin')\nok = hasattr(x, 'aval')\n"
              "try:\n    import tqdm\nexcept ImportError:\n    tqdm = None\n")
    assert _jax_internals_used(public) == []


def test_private_jax_attributes_only_in_compat():
    for name, path in _sources().items():
        if _stage(name) == STAGES.index("pejit._compat"):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute):
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
