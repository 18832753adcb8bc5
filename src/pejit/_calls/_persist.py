"""Folded constants kept on disk, so that a second process does not fold again.

Opt-in, like JAX's persistent compilation cache. The directory is, in this
order: ``FoldOptions(cache_dir=...)`` of the function (``False``: off for
it), the ``PEJIT_CACHE_DIR`` environment variable (set but empty: off), or
``pejit/`` inside JAX's ``jax_compilation_cache_dir`` when the user set one
(read, never changed). None set: off.

A specialization is looked up by a *key*: a SHA-256 of everything its values
depend on. The function is traced once with its constant arrays abstract
(``jax.make_jaxpr``; a function whose trace needs constant values is not
cached, as its jaxpr would not say what it computes), and the key covers
that jaxpr as printed (variables are named by position, not by id), the
contents of its closed-over arrays, the contents, shapes and dtypes of the
constant arrays (one streaming hash over their memory, no copy), the
argument and output structure, the ``FoldOptions``, the JAX and jaxlib
versions, backend, device kinds, x64 flag and default matmul precision. A
jaxpr with a Python callable whose code its values depend on (a
``pure_callback``, say) has no key: the callable's body is not in it.

An entry is a directory named by the key: one ``.npy`` file per folded
constant (loaded memory-mapped) and ``manifest.json``, which holds the
residual program as JSON (:mod:`pejit._calls._jaxpr_json`), checksums of the
arrays, and statistics for reports. Nothing is pickled. The residual's
compilation is left to JAX's persistent compilation cache.

Faults never give wrong values and never raise out of a call: an entry that
is truncated, corrupt or of another format, a directory that cannot be
written (read-only, disk full) each cost a fold, as without the cache, and
issue one :class:`PersistentCacheWarning` naming the path. Entries are
written to a temporary directory and renamed into place, so a process
killed while writing leaves no entry behind, and of two processes writing
the same entry the first rename wins. The cache keeps at most
``PEJIT_CACHE_MAX_BYTES`` (default 4 GiB; ``-1``: unbounded), evicting the
least recently used entries. ``python -m pejit cache list|clear`` shows and
empties it.

Examples:
  >>> import tempfile, jax.numpy as jnp
  >>> from pejit import FoldOptions, pejit
  >>> from pejit._calls._persist import Store
  >>> where = tempfile.mkdtemp()
  >>> f = pejit(lambda A, x: jnp.linalg.inv(A) @ x, constant_argnums=0,
  ...           fold_options=FoldOptions(cache_dir=where))
  >>> f(2 * jnp.eye(2), jnp.ones(2))
  Array([0.5, 0.5], dtype=float32)
  >>> [e.name for e in Store(where).entries()]
  ['<lambda>']
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import logging
import os
import re
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.extend.core import ClosedJaxpr, Jaxpr, Literal

from .. import _compat
from . import _jaxpr_json, _look
from ._errors import PejitWarning
from .._fold._options import FoldOptions
from .._fold._stats import FoldStats
from ._keys import is_array
from .._fold._primitives import CUSTOM_CALLS
from ._program import PerValue, Program, Specialization
from .._residual._partial_eval import specialize_jaxpr
from .._fold._values import byte_view

logger = logging.getLogger("pejit")

ENV_DIR = "PEJIT_CACHE_DIR"
ENV_MAX_BYTES = "PEJIT_CACHE_MAX_BYTES"
DEFAULT_MAX_BYTES = 4 * 2**30
#: Written in every manifest; an entry of another format is a miss.
FORMAT = 2
MANIFEST = "manifest.json"
#: A temporary directory older than this was left by a process that died.
_STALE_SECONDS = 3600.0


class PersistentCacheWarning(PejitWarning):
    """An entry of the persistent cache could not be read or written.

    The call folds instead, as without the cache: the result is right, only
    the time the cache would have saved is lost. The message names the path.
    """


def cache_dir(options: FoldOptions) -> Path | None:
    """The persistent cache directory for a function's options, or None (off)."""
    if options.cache_dir is False:
        return None
    if options.cache_dir:
        return Path(options.cache_dir)
    env = os.environ.get(ENV_DIR)
    if env is not None:  # set but empty: off
        return Path(env) if env else None
    jax_dir = jax.config.jax_compilation_cache_dir
    if jax_dir and "://" not in str(jax_dir):  # a remote JAX cache: not ours to write
        return Path(jax_dir) / "pejit"
    return None


# -- the store ------------------------------------------------------------------
class EntryInfo(NamedTuple):
    """One entry, as ``python -m pejit cache list`` shows it."""

    key: str
    name: str
    nbytes: int
    last_used: float
    path: Path


class Loaded(NamedTuple):
    jaxpr: Jaxpr
    consts: list[np.ndarray]
    stats: FoldStats


class Store:
    """A cache directory: entries by key, written atomically, evicted LRU."""

    def __init__(self, root: str | os.PathLike, max_bytes: int | None = None):
        self.root = Path(root)
        if max_bytes is None:
            max_bytes = int(os.environ.get(ENV_MAX_BYTES, DEFAULT_MAX_BYTES))
        self.max_bytes = max_bytes

    def load(self, key: str) -> Loaded | None:
        """The entry for ``key``, or None: missing, or unreadable (then a warning)."""
        path = self.root / key
        if not path.is_dir():
            return None
        try:
            manifest = json.loads((path / MANIFEST).read_text())
            if manifest.get("format") != FORMAT or manifest.get("key") != key:
                raise ValueError("written by another version of pejit")
            consts = [_read_array(path, c) for c in manifest["consts"]]
            jaxpr = _jaxpr_json.decode(manifest["residual"])
            stats = _stats(manifest["stats"])
        except Exception as e:  # any fault: fold as without the cache
            _warn(f"pejit: ignoring the unreadable persistent cache entry {path} ({type(e).__name__}: {e}); "
                  "folding again")
            shutil.rmtree(path, ignore_errors=True)
            return None
        try:
            os.utime(path / MANIFEST)  # least recently used first out
        except OSError:
            pass
        return Loaded(jaxpr, consts, stats)

    def save(self, key: str, manifest: dict, arrays: Sequence[np.ndarray]) -> None:
        """Write an entry: to a temporary directory, renamed into place."""
        path = self.root / key
        tmp = None
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            tmp = Path(tempfile.mkdtemp(prefix=f".tmp-{key[:16]}-", dir=self.root))
            consts = []
            for i, a in enumerate(arrays):
                consts.append(_write_array(tmp, f"c{i}.npy", a))
            manifest = dict(manifest, format=FORMAT, key=key, consts=consts)
            (tmp / MANIFEST).write_text(json.dumps(manifest))
            try:
                os.rename(tmp, path)
            except OSError:
                if not path.is_dir():
                    raise
                shutil.rmtree(tmp, ignore_errors=True)  # another process wrote it first
            tmp = None
            self.evict()
        except Exception as e:
            _warn(f"pejit: could not write the persistent cache entry {path} ({type(e).__name__}: {e})")
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)

    def entries(self) -> list[EntryInfo]:
        """Complete entries, least recently used first."""
        out = []
        if not self.root.is_dir():
            return out
        for path in self.root.iterdir():
            if path.name.startswith(".") or not path.is_dir():
                continue
            try:
                manifest = path / MANIFEST
                used = manifest.stat().st_mtime
                name = json.loads(manifest.read_text()).get("name", "?")
                size = sum(f.stat().st_size for f in path.iterdir())
            except (OSError, ValueError):
                continue
            out.append(EntryInfo(path.name, name, size, used, path))
        return sorted(out, key=lambda e: e.last_used)

    def evict(self) -> None:
        """Drop least recently used entries over the size cap, and stale temporaries."""
        now = time.time()
        for path in self.root.glob(".tmp-*"):
            try:
                if now - path.stat().st_mtime > _STALE_SECONDS:
                    shutil.rmtree(path, ignore_errors=True)
            except OSError:
                pass
        if self.max_bytes < 0:
            return
        entries = self.entries()
        total = sum(e.nbytes for e in entries)
        for e in entries[:-1]:  # the newest entry stays, whatever its size
            if total <= self.max_bytes:
                break
            shutil.rmtree(e.path, ignore_errors=True)
            total -= e.nbytes

    def clear(self) -> int:
        """Remove every entry (and temporary); returns the bytes freed."""
        freed = sum(e.nbytes for e in self.entries())
        if self.root.is_dir():
            for path in self.root.iterdir():
                if path.is_dir() and (path.name.startswith(".tmp-") or (path / MANIFEST).exists()):
                    shutil.rmtree(path, ignore_errors=True)
        return freed


def _warn(message: str) -> None:
    warnings.warn(message, PersistentCacheWarning, stacklevel=2)


def _digest(a: np.ndarray) -> str:
    return hashlib.sha256(byte_view(a)).hexdigest()


def _dtype(name: str) -> np.dtype:
    """The dtype a manifest names: NumPy's, or one JAX adds (``jnp.bfloat16``)."""
    try:
        return np.dtype(name)
    except TypeError:
        return np.dtype(getattr(jnp, name))


def _write_array(directory: Path, name: str, a: np.ndarray) -> dict:
    # .npy cannot describe ml_dtypes' types (bfloat16, float8, int4): their
    # bits go as unsigned integers, the manifest names the dtype and reading
    # views the bits as it.
    bits = a if a.dtype.isbuiltin == 1 else a.view(f"u{a.dtype.itemsize}")
    with open(directory / name, "wb") as f:
        np.lib.format.write_array(f, bits, allow_pickle=False)
    return {"file": name, "shape": list(a.shape), "dtype": a.dtype.name, "sha256": _digest(a)}


def _read_array(directory: Path, meta: dict) -> np.ndarray:
    a = np.load(directory / meta["file"], mmap_mode="r", allow_pickle=False)
    dtype = _dtype(meta["dtype"])
    if dtype.isbuiltin != 1 and a.dtype == f"u{dtype.itemsize}":
        a = a.view(dtype)
    if list(a.shape) != meta["shape"] or a.dtype != dtype:
        raise ValueError(f"{meta['file']} has type {a.dtype}{list(a.shape)}, not as written")
    if _digest(a) != meta["sha256"]:
        raise ValueError(f"{meta['file']} does not match its checksum")
    return a


_COUNTERS = ("folded", "staged", "hoisted", "effects_kept", "eager_evaluations")


def _stats_doc(stats: FoldStats) -> dict:
    doc: dict[str, Any] = {k: dict(getattr(stats, k)) for k in _COUNTERS}
    return doc | {"eliminated_branches": stats.eliminated_branches, "flops": stats.flops}


def _stats(doc: dict) -> FoldStats:
    stats = FoldStats(eliminated_branches=int(doc["eliminated_branches"]), flops=float(doc["flops"]))
    for k in _COUNTERS:
        getattr(stats, k).update({str(n): int(c) for n, c in doc[k].items()})
    return stats


# -- keys -----------------------------------------------------------------------
def key(options: FoldOptions, where, closed: ClosedJaxpr, trees, arrays: Sequence[Any]) -> str | None:
    """The key of a specialization (hex SHA-256), or None if it has none.

    Examples:
      >>> import jax, jax.numpy as jnp, numpy as np
      >>> from pejit import FoldOptions
      >>> cj = jax.make_jaxpr(lambda a, x: jnp.sin(a) * x)(jnp.ones(3), 1.0)
      >>> k = key(FoldOptions(), (0,), cj, None, [np.ones(3)])
      >>> k == key(FoldOptions(), (0,), cj, None, [np.ones(3)])
      True
      >>> k == key(FoldOptions(), (0,), cj, None, [np.array([1.0, 1.0, 2.0])])
      False
    """
    h = hashlib.sha256()
    devices = sorted({d.device_kind for d in jax.devices()})
    options = dataclasses.replace(options, cache_dir=None, progress=None)  # neither changes a value
    h.update(repr((
        FORMAT, _compat.JAX_VERSION, _compat.JAXLIB_VERSION, jax.default_backend(), devices,
        bool(jax.config.jax_enable_x64), str(jax.config.jax_default_matmul_precision),
        options, where, str(trees),
    )).encode())
    program: list[str] = []
    if not _describe(closed.jaxpr, program, h):
        return None
    h.update("\n".join(program).encode())
    for a in (*closed.consts, *arrays):
        if not _hash_array(h, a):
            return None
    return h.hexdigest()


def _hash_array(h, a: Any) -> bool:
    try:
        a = np.asarray(a)  # no copy for host arrays
    except Exception:  # e.g. PRNG keys, arrays on other processes
        return False
    if a.dtype == object:
        return False
    h.update(f"{a.dtype.name}{a.shape}".encode())
    h.update(byte_view(a))
    return True


#: Primitives whose callable parameters (differentiation rules) do not change
#: the values they compute: their forward jaxpr is described.
_RULES_ONLY = CUSTOM_CALLS
#: Callable parameter types that are data (a mesh is a context manager).
_DATA = (type, jax.sharding.Mesh, jax.sharding.AbstractMesh, jax.sharding.Sharding)
#: Object addresses, which differ between processes.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def _describe(jaxpr: Jaxpr, out: list[str], h) -> bool:
    """Append a line per equation of ``jaxpr`` to ``out`` and hash its array
    literals and the constants of the jaxprs it calls into ``h``; False if
    its values depend on Python code it does not show (a callback).

    Several times cheaper than ``jaxpr.pretty_print()``, which lays out a
    document for display, and unlike it, this also covers the constants of
    called jaxprs (an inner ``jax.jit`` closing over an array). Variables are
    numbered by first appearance; types, literals and parameters are written as
    their ``str`` with addresses blanked, as JAX's printer writes them.
    """
    names: dict[Any, str] = {}

    def bind(vs) -> str:
        return ",".join(f"{names.setdefault(v, str(len(names)))}:{_type(v.aval)}" for v in vs)

    def use(vs) -> str | None:
        words = []
        for a in vs:
            if not isinstance(a, Literal):
                words.append(names.get(a) or bind([a]))
            elif not np.ndim(a.val):
                words.append(f"{np.asarray(a.val).item()!r}:{_type(a.aval)}")
            elif _hash_array(h, a.val):
                words.append(f"array:{_type(a.aval)}")
            else:
                return None
        return " ".join(words)

    out.append(f"{{ {bind(jaxpr.constvars)} ; {bind(jaxpr.invars)}")
    for e in jaxpr.eqns:
        ins = use(e.invars)
        if ins is None:
            return False
        params = []
        for k in sorted(e.params):
            v = e.params[k]
            text = None
            for x in v if isinstance(v, (tuple, list)) else (v,):
                if isinstance(x, (Jaxpr, ClosedJaxpr)):
                    consts = getattr(x, "consts", ())
                    if not (_describe(getattr(x, "jaxpr", x), out, h) and all(_hash_array(h, c) for c in consts)):
                        return False
                    text = "jaxpr"  # described on the lines before
                elif e.primitive.name in _RULES_ONLY and (callable(x) or hasattr(x, "call_wrapped")):
                    break  # a differentiation rule
                elif callable(x) and not isinstance(x, _DATA):
                    return False
            else:
                params.append(f"{k}={text or _param(v)}")
        out.append(f"{bind(e.outvars)} = {e.primitive.name}[{' '.join(params)}] {ins}")
    outs = use(jaxpr.outvars)
    out.append(f"}} {outs}")
    return outs is not None


@functools.lru_cache(maxsize=4096)
def _type(aval) -> str:
    return aval.str_short() + ("~" if getattr(aval, "weak_type", False) else "")


def _param(v: Any) -> str:
    if isinstance(v, frozenset):  # in hash order, which differs between processes
        return f"frozenset({sorted(map(repr, v))})"
    text = str(v)
    return _ADDRESS.sub(" at 0x", text) if " at 0x" in text else text


# -- specializing through the cache ----------------------------------------------------
def specialize(
    root: Path, info, where, const_leaves: list, const_tree, in_tree, avals: Sequence[Any], *,
    traces: tuple[Any, Any], bind: Callable, fold: Callable[[], Specialization], runner: Callable, place: Callable,
) -> Specialization:
    """A specialization from the cache in ``root``, or folded and stored there.

    ``traces`` is a cache and a key for the trace, which depends on the
    constants' structure only; ``bind(const_vals, in_tree, out_trees)`` is
    the user's function of the flat dynamic leaves; ``fold()`` specializes
    without the cache (a function with no key);
    ``runner(jaxpr, nconsts, out_tree)`` compiles a residual;
    ``place(consts, put)`` applies ``constant_shardings``.
    """
    start = time.perf_counter()
    memo, memo_key = traces
    traced = memo.get(memo_key)
    first = traced is None  # of this structure
    if first:
        traced = _look.trace(bind, const_leaves, const_tree, in_tree, avals)
        memo.put(memo_key, traced)
    if isinstance(traced, PerValue):  # the trace needs constant values: no key
        logger.debug("pejit: not cached across runs, %s", traced.reason)
        return fold()
    closed, out_tree = traced.jaxpr, traced.out_tree
    arrays = [leaf for leaf in const_leaves if is_array(leaf)]
    k = key(info.fold_options, where, closed, (in_tree, out_tree), arrays) if jax.process_count() == 1 else None
    if k is None:
        return fold()
    store = Store(root)
    hit = store.load(k)
    if hit is not None:
        # NumPy has no weak types: the residual's inputs say which constants were weak
        weak = [getattr(v.aval, "weak_type", False) for v in hit.jaxpr.invars[: len(hit.consts)]]
        consts = place([_compat.weakly_typed(jax.device_put(c)) if w else jax.device_put(c)
                        for c, w in zip(hit.consts, weak)], jax.device_put)
        notes = (f"folded constants read from the persistent cache ({store.root / k})",)
        program = Program(hit.jaxpr, len(consts), out_tree, hit.stats, notes,
                          runner(hit.jaxpr, len(consts), out_tree), None)
        return Specialization(program, consts, time.perf_counter() - start)
    if not (first or info.one_value):  # the call-time form's folding program serves new values
        spec = fold()
        _store(store, k, info.name, spec)
        return spec
    # Fold the first value by replaying the jaxpr just traced: the function's
    # Python runs once, as without the cache.
    residual = specialize_jaxpr(closed, dict(enumerate(arrays)), info.fold_options)
    folded = residual.consts
    consts = place(folded, jax.device_put)
    jaxpr = residual.open_jaxpr()
    program = Program(jaxpr, len(consts), out_tree, residual.stats, (), runner(jaxpr, len(consts), out_tree), None)
    spec = Specialization(program, consts, time.perf_counter() - start, residual if consts is folded else None)
    _store(store, k, info.name, spec)
    return spec


def _store(store: Store, k: str, name: str, spec: Specialization) -> None:
    try:
        residual = _jaxpr_json.encode(spec.program.jaxpr)
        arrays = [np.asarray(c) for c in spec.consts]
    except Exception as e:  # not storable: the next process folds again
        logger.debug("pejit: %s not cached across runs: %s", name, e)
        return
    manifest = {"name": name, "jax": _compat.JAX_VERSION, "residual": residual,
                "stats": _stats_doc(spec.program.stats), "fold_seconds": spec.fold_seconds}
    store.save(k, manifest, arrays)


# -- command line ------------------------------------------------------------------
def main(command: str, directory: str | None) -> int:
    """``python -m pejit cache list|clear [--dir DIR]``."""
    root = Path(directory) if directory else cache_dir(FoldOptions())
    if root is None:
        print(f"no persistent cache: set {ENV_DIR} (or JAX's jax_compilation_cache_dir), or pass --dir")
        return 1
    store = Store(root)
    if command == "clear":
        freed = store.clear()
        print(f"cleared {root}: {freed / 2**20:.1f} MiB freed")
        return 0
    entries = store.entries()
    for e in entries:
        used = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e.last_used))
        print(f"{e.key[:16]}  {e.nbytes / 2**20:10.1f} MiB  {used}  {e.name}")
    total = sum(e.nbytes for e in entries)
    print(f"{len(entries)} entries, {total / 2**20:.1f} MiB in {root}")
    return 0
