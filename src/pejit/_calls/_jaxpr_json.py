"""A jaxpr as JSON, and back: how the persistent cache stores residual programs.

A stored residual must come back as a jaxpr (so that the specialization
still composes with ``jax.grad``, ``jax.vmap`` and reports), and loading it
must not run code a file chose (no pickle). So a jaxpr is written as its
equations: each names its primitive and gives its inputs (earlier variables
or literals), the types of its outputs and its parameters in tagged JSON.
Reading it binds each primitive again under ``jax.make_jaxpr``, so JAX's own
type rules check every equation; an output whose type differs from the one
written makes the whole read fail.

What can be written is deliberately narrow: jaxprs of primitives that a
loaded ``jax`` module defines, whose parameters are plain values (numbers,
strings, tuples, dtypes, enums and named tuples of ``jax`` modules,
module-level objects of ``jax`` modules such as ``UNSPECIFIED``) or
sub-jaxprs without constants (``jit`` calls, loop bodies, branches). A
residual with a Python callable (a ``custom_jvp`` rule, a callback) or a
sharding in its parameters is not written (:class:`Unencodable`); it is
folded again in the next process, as without a cache.

Examples:
  >>> import jax, jax.numpy as jnp
  >>> closed = jax.make_jaxpr(lambda a, x: jnp.sin(a) @ x + 1.0)(jnp.ones((2, 2)), jnp.ones(2))
  >>> doc = encode(closed.jaxpr)
  >>> again = decode(doc)
  >>> [e.primitive.name for e in again.eqns]
  ['sin', 'dot_general', 'add']
  >>> jax.extend.core.jaxpr_as_fun(jax.extend.core.ClosedJaxpr(again, ()))(jnp.eye(2), jnp.ones(2))
  [Array([1.841471, 1.841471], dtype=float32)]
"""

from __future__ import annotations

import enum
import sys
import types
from typing import Any

import jax
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal, Primitive

from .. import _compat


class Unencodable(Exception):
    """The jaxpr holds something this format does not write."""


#: Module prefixes whose enums, named tuples and primitives may be named in a file.
_TRUSTED = ("jax.", "jaxlib.")
#: Module-level objects that are callable but data (a mesh is a context manager).
_MESHES = (jax.sharding.Mesh, jax.sharding.AbstractMesh)


def encode(jaxpr: Jaxpr) -> dict:
    """The JSON document of a flat jaxpr without constants (raises :class:`Unencodable`)."""
    if getattr(jaxpr, "constvars", None):
        raise Unencodable("the jaxpr has constvars")
    ids: dict[Any, int] = {}
    for v in jaxpr.invars:
        ids[v] = len(ids)

    def ref(atom):
        if isinstance(atom, Literal):
            return _literal(atom)
        return ids[atom]

    table = _primitives()
    eqns = []
    for e in jaxpr.eqns:
        if table.get(e.primitive.name) is not e.primitive:
            raise Unencodable(f"primitive {e.primitive.name!r} is not found by name")
        eqns.append({
            "p": e.primitive.name,
            "in": [ref(a) for a in e.invars],
            "out": [_aval(v.aval) for v in e.outvars],
            "params": {k: _param(v) for k, v in e.params.items()},
        })
        for v in e.outvars:
            ids[v] = len(ids)
    return {"in": [_aval(v.aval) for v in jaxpr.invars], "eqns": eqns, "out": [ref(v) for v in jaxpr.outvars]}


def decode(doc: dict) -> Jaxpr:
    """The jaxpr of a document written by :func:`encode`; raises on any mismatch."""
    return _decode_closed(doc).jaxpr


def _decode_closed(doc: dict) -> ClosedJaxpr:
    table = _primitives()
    eqns = [(_primitive(table, e["p"]), e) for e in doc["eqns"]]
    params = [{k: _unparam(v) for k, v in e["params"].items()} for _, e in eqns]

    def interpret(*args):
        env = list(args)
        for (prim, e), kw in zip(eqns, params):
            outs = prim.bind(*[_atom(env, a) for a in e["in"]], **kw)
            outs = list(outs) if prim.multiple_results else [outs]
            if [_aval(_compat.typeof(o)) for o in outs] != e["out"]:
                raise ValueError(f"stored equation {e['p']} does not type-check as written")
            env.extend(outs)
        return [_atom(env, a) for a in doc["out"]]

    closed = jax.make_jaxpr(interpret)(*[_struct(a) for a in doc["in"]])
    if closed.consts:
        raise ValueError("stored jaxpr decoded with constants")
    return closed


# -- values -------------------------------------------------------------------
def _aval(aval) -> list:
    if not isinstance(aval, _compat.ShapedArray) or jax.dtypes.issubdtype(aval.dtype, jax.dtypes.extended):
        raise Unencodable(f"type {aval}")
    if getattr(aval, "sharding", None) is not None and not _trivial_sharding(aval.sharding):
        raise Unencodable(f"sharded type {aval}")
    return [list(aval.shape), np.dtype(aval.dtype).name, bool(aval.weak_type)]


def _trivial_sharding(sharding) -> bool:
    spec = getattr(sharding, "spec", ())
    return all(p is None for p in spec)


def _struct(a: list) -> jax.ShapeDtypeStruct:
    shape, dtype, weak = a
    return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype), weak_type=weak)


def _literal(lit: Literal) -> dict:
    value = np.asarray(lit.val)
    if value.shape != () or value.dtype == object:
        raise Unencodable("a non-scalar literal")
    _, dtype, weak = _aval(lit.aval)
    item = value.item()
    return {"lit": [item.real, item.imag] if isinstance(item, complex) else item, "dtype": dtype, "weak": weak}


def _atom(env: list, a: Any) -> Any:
    if isinstance(a, int):
        return env[a]
    dtype = np.dtype(a["dtype"])
    value = complex(*a["lit"]) if dtype.kind == "c" else a["lit"]
    if a["weak"]:  # a Python scalar: JAX gives it the weak type it had
        return {"b": bool, "i": int, "u": int, "f": float, "c": complex}[dtype.kind](value)
    return np.asarray(value, dtype)[()]


def _param(v: Any) -> Any:
    if isinstance(v, ClosedJaxpr):  # a call's or a loop's body
        if list(v.consts):
            raise Unencodable("a sub-jaxpr with constants")
        return {"cj": encode(v.jaxpr)}
    if isinstance(v, Jaxpr):
        return {"j": encode(v)}
    if isinstance(v, enum.Enum):
        return {"enum": _class_path(type(v)), "name": v.name}
    if v is None or isinstance(v, (bool, str)) or type(v) in (int, float):
        return v
    if isinstance(v, tuple) and hasattr(type(v), "_fields"):
        return {"nt": _class_path(type(v)), "v": [_param(x) for x in v]}
    if type(v) is tuple:
        return {"t": [_param(x) for x in v]}
    if type(v) is list:
        return {"l": [_param(x) for x in v]}
    if isinstance(v, np.dtype):
        return {"dtype": v.name}
    if isinstance(v, (np.integer, np.floating, np.bool_)):
        return {"np": v.dtype.name, "v": v.item()}
    return {"obj": _singleton_path(v)}


def _unparam(v: Any) -> Any:
    if not isinstance(v, dict):
        return v
    if "cj" in v:
        return _decode_closed(v["cj"])
    if "j" in v:
        return decode(v["j"])
    if "obj" in v:
        module, name = v["obj"].split(":")
        obj = getattr(_module(module), name)
        if isinstance(obj, types.ModuleType) or (callable(obj) and not isinstance(obj, _MESHES)):
            # a file names data, never something to call
            raise ValueError(f"{v['obj']} is not a data object")
        return obj
    if "t" in v:
        return tuple(_unparam(x) for x in v["t"])
    if "l" in v:
        return [_unparam(x) for x in v["l"]]
    if "dtype" in v:
        return np.dtype(v["dtype"])
    if "np" in v:
        return np.asarray(v["v"], np.dtype(v["np"]))[()]
    if "enum" in v:
        cls = _class(v["enum"])
        if not issubclass(cls, enum.Enum):
            raise ValueError(f"{v['enum']} is not an enum")
        return cls[v["name"]]
    if "nt" in v:
        cls = _class(v["nt"])
        if not (issubclass(cls, tuple) and hasattr(cls, "_fields")):
            raise ValueError(f"{v['nt']} is not a named tuple")
        return cls(*[_unparam(x) for x in v["v"]])
    raise ValueError(f"unknown parameter tag in {sorted(v)}")


def _class_path(cls: type) -> str:
    path = f"{cls.__module__}:{cls.__qualname__}"
    if not _trusted(cls.__module__) or "<" in cls.__qualname__:
        raise Unencodable(f"a parameter of type {path}")
    return path


def _singleton_path(v: Any) -> str:
    """``module:name`` of a module-level object of a ``jax`` module (``UNSPECIFIED``, an empty mesh)."""
    module = getattr(type(v), "__module__", "")
    if _trusted(module) and module in sys.modules:
        for name, obj in vars(sys.modules[module]).items():
            if obj is v and not name.startswith("__"):
                return f"{module}:{name}"
    raise Unencodable(f"a parameter of type {type(v).__name__}")


def _trusted(module: str) -> bool:
    # jax itself too: JAX 0.12.1's jit names its inline mode jax.Inline (set_module("jax"))
    return module == "jax" or module.startswith(_TRUSTED)


def _module(name: str) -> Any:
    """An already imported ``jax`` module; nothing is imported."""
    if not _trusted(name) or name not in sys.modules:
        raise ValueError(f"{name} is not a loaded jax module")
    return sys.modules[name]


def _class(path: str) -> type:
    """A class of an already imported ``jax`` module."""
    module, qualname = path.split(":")
    obj: Any = _module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    if not isinstance(obj, type):
        raise ValueError(f"{path} is not a class")
    return obj


# -- primitives by name ---------------------------------------------------------
_AMBIGUOUS = object()
_table: dict[str, Any] = {}
_scanned: set[str] = set()


def _primitives() -> dict[str, Any]:
    """Primitives defined at module level in loaded ``jax`` modules, by name.

    A name two different primitives share maps to neither.
    """
    if len(_scanned) == len(sys.modules):  # nothing imported since
        return _table
    for name, module in list(sys.modules.items()):
        if name in _scanned:
            continue
        _scanned.add(name)
        if not name.startswith(_TRUSTED):
            continue
        for obj in list(vars(module).values()):
            if isinstance(obj, Primitive):
                seen = _table.setdefault(obj.name, obj)
                if seen is not obj:
                    _table[obj.name] = _AMBIGUOUS
    return _table


def _primitive(table: dict, name: str) -> Primitive:
    prim = table.get(name)
    if not isinstance(prim, Primitive):
        raise ValueError(f"primitive {name!r} is not defined (or not uniquely) by a loaded jax module")
    return prim
