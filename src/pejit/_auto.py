"""``constant_argnums="auto"``: fold the arguments that repeat, unannotated.

A training or solver loop calls ``loss(params, X, y)`` thousands of times
with the same ``X`` and ``y`` objects; ``jax.jit`` recomputes whatever
depends only on them on every call. :class:`AutoPejitted` watches the calls
instead of asking which arguments are fixed:

* it runs a *generic* program, ``jax.jit(f)`` itself (``f`` for ``pe``),
  until an array argument has been the *same immutable object* (a
  ``jax.Array``, or a NumPy array nobody can write) on ``auto_after``
  consecutive calls;
* it then estimates, on the jaxpr, the FLOPs per call that folding that
  argument would remove (:func:`pejit._fold._known.known_work`, the fold's own
  policy read off the jaxpr) and promotes it to a constant, as
  ``constant_argnums`` would make it, only if that is at least
  ``auto_min_flops`` (:func:`pejit._fold._cost.promotion_pays`); a small fold is then evaluated
  by one compiled program rather than op by op
  (:func:`pejit._fold._cost.one_program_pays`: in a cold process each
  primitive would compile a program of its own);
* calls whose promoted arguments are those same objects (an O(1) identity
  guard, through weak references) go to the call path with those arguments
  constant (:mod:`pejit._calls._path`); any other call goes to the generic
  program, never to a new fold. An argument that changes more than
  ``auto_demote_after`` times is demoted for good, so alternating inputs
  never thrash.

Once every argument is decided, the call is that path's generated
dispatcher (:mod:`pejit._calls._dispatch`), whose memo recognizes the
promoted objects by identity, and whose other calls come back here; or,
when nothing is promoted, ``jax.jit``'s own callable, so a function pejit
could not help costs exactly what ``jax.jit`` costs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import operator
import sys
import threading
import types
import weakref
from collections.abc import Callable
from typing import Any

import jax
import numpy as np

from . import _compat
from ._calls._argnums import interleave
from ._calls._cache import DEFAULT_CACHE_SIZE, CacheInfo
from ._calls._info import positions, split_call
from ._calls._keys import immutable
from ._calls._passthrough import JitPath
from ._calls._path import CallPath, make_path
from ._calls._unfolded import explained
from ._fold._options import FoldOptions
from ._fold import _cost, _known
from ._reports._report import FoldReport

#: The default ``auto_min_flops`` (see :data:`pejit._fold._cost.PROMOTION_MIN_FLOPS`).
DEFAULT_MIN_FLOPS = _cost.PROMOTION_MIN_FLOPS

WATCHING, PROMOTED, DEMOTED, DYNAMIC = "watching", "promoted", "demoted", "kept dynamic"


@dataclasses.dataclass
class Decision:
    """What pejit decided about one argument (a position or a keyword), and why."""

    state: str = WATCHING
    why: str = ""
    ref: Any = dataclasses.field(default=None, repr=False)  # weakref to the last object seen
    streak: int = 0  # consecutive calls with that object
    changes: int = 0  # calls whose object differed from the previous call's


class AutoCacheInfo(CacheInfo):
    """[`CacheInfo`][pejit.CacheInfo] of the promoted specializations, plus the auto counters.

    Unpacks as the four fields of ``CacheInfo``; ``promotions``,
    ``demotions`` and ``generic_calls`` (calls served by the generic
    program) are attributes.
    """

    promotions: int
    demotions: int
    generic_calls: int

    def __new__(cls, info: CacheInfo, promotions: int, demotions: int, generic_calls: int):
        self = super().__new__(cls, *info, info.maxbytes, info.currbytes)
        self.promotions, self.demotions, self.generic_calls = promotions, demotions, generic_calls
        return self

    def __repr__(self) -> str:
        return (f"AutoCacheInfo(hits={self.hits}, misses={self.misses}, maxsize={self.maxsize}, "
                f"currsize={self.currsize}, maxbytes={self.maxbytes}, currbytes={self.currbytes}, promotions={self.promotions}, demotions={self.demotions}, "
                f"generic_calls={self.generic_calls})")


@dataclasses.dataclass(frozen=True)
class AutoReport:
    """What an automatic-constants function decided, and the fold it uses for a call.

    ``arguments`` maps each watched argument (position or keyword) to
    ``(state, why)``; ``fold`` is the [`FoldReport`][pejit.FoldReport] of the
    specialization these arguments run (``None`` when they run the generic
    program). Other attributes are the fold's (``r.residual``,
    ``r.flops_removed``, ...).
    """

    arguments: dict
    fold: FoldReport | None

    def __getattr__(self, name: str) -> Any:
        if self.fold is None:
            raise AttributeError(f"{name}: these arguments run the generic program (nothing folded)")
        return getattr(self.fold, name)

    def __str__(self) -> str:
        lines = [f"argument {k!r}: {state} ({why})" for k, (state, why) in self.arguments.items()]
        lines.append(str(self.fold) if self.fold is not None else "this call runs the generic program (jax.jit)")
        return "\n".join(lines)


class AutoPejitted:
    """A function that promotes repeated array arguments to folded constants.

    Made by ``pejit(f, constant_argnums="auto")`` (or ``pe``); see the module
    docstring and docs/auto.md for the decision rule. Results, errors and
    transformations are ``jax.jit``'s: until an argument is promoted, and for
    every call whose promoted arguments changed, the call *is* ``jax.jit(f)``.

    Examples:
      >>> import jax.numpy as jnp
      >>> from pejit import pejit
      >>> def loss(w, X):
      ...     return jnp.sum(jnp.linalg.cholesky(X.T @ X) @ w)
      >>> f = pejit(loss, constant_argnums="auto", auto_min_flops=0)
      >>> X = 2 * jnp.eye(3)
      >>> [float(f(w, X)) for w in (jnp.ones(3), jnp.zeros(3), jnp.ones(3))]  # X folded from the 2nd call
      [6.0, 0.0, 6.0]
      >>> f.cache_info().promotions
      1
      >>> f.decisions()[1][0]
      'promoted'
    """

    # State in slots, as in Pejitted (which says why).
    __slots__ = (
        "_pejit_kwargs", "_plain", "_special", "_fun", "_jit", "_after", "_demote_after", "_min_flops", "_generic",
        "_excluded_nums", "_excluded_names", "_decisions", "_promoted", "_estimates", "_one_program", "_options",
        "_lock", "promotions", "demotions", "generic_calls", "_dispatch", "__dict__", "__weakref__",
    )

    def __init__(
        self,
        fun: Callable,
        *,
        auto_after: int = 2,
        auto_demote_after: int = 3,
        auto_min_flops: float | None = None,
        jit: bool = True,
        fold_options: Any = None,
        cache_size: int | None = DEFAULT_CACHE_SIZE,
        constant_shardings: Any = None,
        **jit_kwargs: Any,
    ):
        self._pejit_kwargs = dict(jit=jit, fold_options=fold_options, cache_size=cache_size,
                                  constant_shardings=constant_shardings, **jit_kwargs)
        self._options = dict(auto_after=auto_after, auto_demote_after=auto_demote_after,
                             auto_min_flops=auto_min_flops, **self._pejit_kwargs)  # what pickling keeps
        # Built now, as pejit's without constants: checks the function and every
        # option (jax.jit's keywords too); for pejit, its call is jax.jit(fun).
        self._plain = make_path(fun, self._pejit_kwargs)
        self._special: dict[tuple, CallPath | JitPath] = {(): self._plain}
        self._fun, self._jit = fun, jit
        self._after, self._demote_after = auto_after, auto_demote_after
        self._min_flops = DEFAULT_MIN_FLOPS if auto_min_flops is None else auto_min_flops
        self._generic = self._plain.dispatch if jit else fun
        info = self._plain.info  # no constants: its fixed arguments are the static ones
        # Static arguments are keyed by value anyway, donated ones are consumed.
        self._excluded_nums = info.fixed_nums | info.donate_nums
        self._excluded_names = info.fixed_names | info.donate_names
        self._decisions: dict[int | str, Decision] = {}
        self._promoted: tuple = ()  # keys, positions first, then names
        self._estimates: dict = {}
        self._one_program: set[tuple] = set()  # promoted sets folded by one compiled program (see _one_compiled_fold)
        self._lock = threading.RLock()
        self.promotions = self.demotions = self.generic_calls = 0
        self._watch()
        functools.update_wrapper(self, fun)

    # The call is whatever ``_dispatch`` holds (a C-level property, as in
    # Pejitted).
    __call__ = property(operator.attrgetter("_dispatch"))

    # -- watching ---------------------------------------------------------
    def _watching(self, *args, **kwargs):
        with self._lock:
            target = self._observe(args, kwargs)
            if target is None:
                self.generic_calls += 1
                target = self._generic
        return target(*args, **kwargs)

    def _watch(self) -> None:
        """Calls go to ``_watching`` through a weak reference: a bound method
        kept on the instance would be a reference cycle, and keep it (and what
        ``fun`` closes over) alive past its last reference."""
        self._dispatch = functools.partial(_call_watching, weakref.ref(self))

    def _candidates(self, args: tuple, kwargs: dict):
        for i, v in enumerate(args):
            if i not in self._excluded_nums and i - len(args) not in self._excluded_nums:
                yield i, v
        for k, v in kwargs.items():
            if k not in self._excluded_names:
                yield k, v

    def _observe(self, args: tuple, kwargs: dict) -> Callable | None:
        """Update the decisions with this call; the call path it runs, or None (generic)."""
        decisions = self._decisions
        stable = []
        for key, value in self._candidates(args, kwargs):
            d = decisions.get(key)
            if d is None:
                if not _is_array(value):
                    continue  # only arrays are candidates
                d = decisions[key] = Decision()
            if d.state in (DEMOTED, DYNAMIC) or isinstance(value, _compat.Tracer):
                continue  # a transformation's tracer says nothing about the next call
            if isinstance(value, np.ndarray) and not immutable(value):
                if d.state == PROMOTED:
                    self.demotions += 1
                    self._promoted = tuple(k for k in self._promoted if k != key)
                d.state, d.ref = DYNAMIC, None
                d.why = "a NumPy array whose memory may be written (it may change in place)"
                continue
            if d.ref is not None and d.ref() is value:
                d.streak += 1
            else:
                d.changes += d.streak > 0
                d.ref, d.streak = (weakref.ref(value, self._forget), 1) if _promotable(value) else (None, 0)
                if d.changes > self._demote_after:
                    why = f"changed {d.changes} times (more than auto_demote_after={self._demote_after})"
                    if d.state == PROMOTED:
                        self.demotions += 1
                        self._promoted = tuple(k for k in self._promoted if k != key)
                    d.state, d.why, d.ref = (DEMOTED if d.state == PROMOTED else DYNAMIC), why, None
                    continue
            if d.streak == self._after:
                if d.state == WATCHING:
                    stable.append(key)
                else:  # promoted before, and stable again on a new object: its fold is due
                    self.promotions += 1
                    d.why = f"the same object again on {self._after} consecutive calls (changes so far: {d.changes})"
        if stable:
            self._consider(stable, args, kwargs)
        if self._promoted and all(_holds(decisions[k], args, kwargs, k, self._after) for k in self._promoted):
            target = self._specialized(self._promoted)
        else:
            target = None
        self._settle(len(args))
        return target

    def _consider(self, stable: list, args: tuple, kwargs: dict) -> None:
        """Promote ``stable`` arguments if folding them removes enough work per call."""
        old = self._promoted
        new = _ordered((*old, *stable))
        try:
            # Work on no argument at all (``jnp.eye(n)``) counts in both: jax.jit folds it too.
            gain = self._removed(new, args, kwargs) - self._removed(old, args, kwargs)
        except Exception as e:  # noqa: BLE001 -- the generic call then raises jax.jit's error, if any
            self._decide(stable, DYNAMIC, f"could not trace it to estimate the saving: {type(e).__name__}: {e}")
            return
        if not _cost.promotion_pays(gain, self._min_flops):
            self._decide(stable, DYNAMIC, f"folding it would remove {gain:.3g} FLOPs per call, "
                                          f"less than auto_min_flops={self._min_flops:.3g}")
            return
        self._promoted = new
        if self._one_compiled_fold(new, args, kwargs):
            self._one_program.add(new)
        self.promotions += len(stable)
        self._decide(stable, PROMOTED, f"the same object on {self._after} consecutive calls; folding removes "
                                       f"{gain:.3g} FLOPs per call")

    def _specialized(self, keys: tuple) -> CallPath:
        """The call path with the arguments ``keys`` constant (one per set, kept)."""
        special = self._special.get(keys)
        if special is None:
            nums = tuple(k for k in keys if isinstance(k, int))
            names = tuple(k for k in keys if isinstance(k, str))
            kwargs = self._pejit_kwargs
            options = kwargs["fold_options"] or FoldOptions()
            one_program = keys in self._one_program and options.backend == "auto"
            if one_program:  # each promoted value folded concretely, in one pass, as pe(x, ...) does
                kwargs = {**kwargs, "fold_options": dataclasses.replace(options, backend="compiled"),
                          "one_value": True}
            special = self._special[keys] = make_path(
                self._fun, {"constant_argnums": nums, "constant_argnames": names, **kwargs})
        return special

    def _one_compiled_fold(self, keys: tuple, args: tuple, kwargs: dict) -> bool:
        """Whether to fold the promoted ``keys`` by one compiled program: a promotion
        folds one value, usually in a process that has not evaluated these
        primitives on these types before (:func:`pejit._fold._cost.one_program_pays`)."""
        try:
            return _cost.one_program_pays(self._known_work(keys, args, kwargs).folded)
        except Exception:  # noqa: BLE001 -- _consider traced the same; keep the default fold
            return False

    def _decide(self, keys, state: str, why: str) -> None:
        for k in keys:
            d = self._decisions[k]
            d.state, d.why = state, why
            if state != PROMOTED:
                d.ref = None

    def _removed(self, keys: tuple, args: tuple, kwargs: dict) -> float:
        """Estimated FLOPs per call that folding the arguments ``keys`` removes."""
        return self._known_work(keys, args, kwargs).saved.flops

    def _known_work(self, keys: tuple, args: tuple, kwargs: dict) -> _known.KnownWork:
        """What folding the arguments ``keys`` saves a call (:func:`pejit._fold._known.known_work`)."""
        closed, ranges = self._traced(args, kwargs)
        known = {j for key in keys for j in ranges.get(key, ())}
        options = self._pejit_kwargs["fold_options"] or FoldOptions()
        return _known.known_work(closed, [i in known for i in range(len(closed.jaxpr.invars))],
                                 lazy=options.rematerialize, ratio=options.expansion_ratio,
                                 min_bytes=options.expansion_min_bytes)

    def _traced(self, args: tuple, kwargs: dict):
        """The function's jaxpr, every non-static argument abstract, and each argument's inputs in it.

        Its inputs are the leaves of the non-static positional arguments, then
        of the keyword ones by name, as ``jax.jit`` flattens them. Kept for
        the last argument types and static values seen (decisions are rare).
        """
        info = self._plain.info  # no constants: its fixed arguments are the static ones
        static, static_kw, dyn_args, dyn_kw = split_call(info, args, kwargs)
        leaves, tree = jax.tree_util.tree_flatten((dyn_args, dyn_kw))
        key = (tree, tuple(jax.typeof(leaf) for leaf in leaves), static, static_kw)
        if self._estimates.get("key") == key:
            return self._estimates["value"]
        ranges, j = {}, 0
        owners = [*positions(info, len(args))[1], *sorted(dyn_kw)]  # flattening order
        for owner, sub in zip(owners, [*dyn_args, *(dyn_kw[k] for k in sorted(dyn_kw))]):
            n = len(jax.tree_util.tree_leaves(sub))
            ranges[owner], j = range(j, j + n), j + n
        fun = self._fun

        def flat(*leaves):
            a, kw = jax.tree_util.tree_unflatten(tree, leaves)
            return fun(*interleave(static, a), **kw, **dict(static_kw))

        with _compat.at_top_level():
            if self._jit:
                # jax.jit's own trace: the generic call before this one made
                # it (same types and static values), so it costs a cache hit
                closed = self._plain.trace(args, kwargs).jaxpr
            else:
                closed = jax.make_jaxpr(flat)(*leaves)
        self._estimates = {"key": key, "value": (closed, ranges)}
        return closed, ranges

    def _settle(self, n: int) -> None:
        """When every argument is decided, make the call a generated function: the
        dispatcher, for ``n`` positional arguments, of the promoted arguments' call path."""
        self._watch()  # until every argument is decided (and a dispatcher is made: not for too many arguments)
        decisions = self._decisions
        if any(d.state == WATCHING or (d.state == PROMOTED and d.streak < self._after) for d in decisions.values()):
            return
        if not self._promoted:
            self._dispatch = self._generic
            return
        # Its memo serves the promoted objects; every other call comes back to
        # a guard per promoted argument, by position or keyword (other keywords
        # pass through: an array keyword first seen after this stays dynamic).
        special = self._specialized(self._promoted)
        guards = tuple((k, decisions[k].ref) for k in self._promoted)
        watching = functools.partial(_call_watching, weakref.ref(self))  # see _watch
        others = functools.partial(_guarded, guards, special, watching)
        self._dispatch = special.dispatcher(n, others, others)

    @property
    def _forget(self) -> Callable:
        """The callback of a watched argument's weak reference: when the object
        dies, its identity may be reused, so the guard is no longer trusted. It
        holds this object weakly (see ``_watch``)."""
        return functools.partial(_forget, weakref.ref(self))

    # -- introspection ----------------------------------------------------
    def decisions(self) -> dict:
        """``{argument: (state, why)}`` for every array argument seen so far."""
        with self._lock:
            return {k: (d.state, d.why or f"the same object on {d.streak} consecutive call(s), changed {d.changes} "
                        f"time(s) so far") for k, d in self._decisions.items()}

    def cache_info(self) -> AutoCacheInfo:
        """The promoted specializations' cache statistics, with promotions, demotions and generic calls.

        Example:
          >>> import jax.numpy as jnp
          >>> from pejit import pejit
          >>> f = pejit(lambda w, X: (X.T @ X) @ w, constant_argnums="auto")
          >>> X = jnp.ones((3, 3))
          >>> _ = [f(jnp.full(3, float(i)), X) for i in range(3)]
          >>> info = f.cache_info()
          >>> info.generic_calls, info.promotions  # X.T @ X is too small to be worth a fold
          (3, 0)
        """
        infos = [p.cache_info() for p in self._special.values()]
        total = CacheInfo(sum(i.hits for i in infos), sum(i.misses for i in infos), infos[0].maxsize,
                          sum(i.currsize for i in infos), infos[0].maxbytes, sum(i.currbytes for i in infos))
        return AutoCacheInfo(total, self.promotions, self.demotions, self.generic_calls)

    def clear_cache(self) -> None:
        """Forget every decision and specialization, and clear ``jax.jit``'s caches of the function."""
        with self._lock:
            for p in self._special.values():
                p.clear_cache()
            self._decisions.clear()
            self._promoted = ()
            self._estimates.clear()
            self.promotions = self.demotions = self.generic_calls = 0
            self._watch()

    def cache_clear(self) -> None:
        """The same as ``clear_cache`` (the name ``functools.lru_cache`` gives it)."""
        self.clear_cache()

    def _cache_size(self) -> int:
        """Compiled entries: the generic program's (``jax.jit``'s), and the promoted specializations."""
        return sum(p.cache_size() for p in self._special.values())  # the plain path's: jax.jit's

    def _route(self, args: tuple, kwargs: dict) -> CallPath | None:
        """The call path these arguments would run now, or None (generic); no state changes."""
        with self._lock:
            promoted = self._promoted
            if promoted and all(_holds(self._decisions[k], args, kwargs, k, self._after) for k in promoted):
                return self._specialized(promoted)
        return None

    @_compat.api_boundary
    def report(self, *args, **kwargs) -> AutoReport:
        """The decisions, and the [`FoldReport`][pejit.FoldReport] of the fold these arguments run."""
        special = self._route(args, kwargs)
        return AutoReport(self.decisions(), None if special is None else special.specialize(args, kwargs).report)

    @_compat.api_boundary  # an error in the user's function shows no pejit frames, as under pejit.explain
    def explain(self, *args, **kwargs) -> AutoReport:
        """As `report`, with the fold's `before` program (see [`explain`][pejit.explain])."""
        special = self._route(args, kwargs)
        return AutoReport(self.decisions(), None if special is None else explained(special, args, kwargs))

    # -- jax.jit's staged API: the generic program's ------------------------
    def lower(self, *args, **kwargs):
        """Lower the generic program, as ``jax.jit(f).lower`` does."""
        self._plain.require_jit("lower")
        return self._plain.lower(args, kwargs)

    def trace(self, *args, **kwargs):
        """Trace the generic program, as ``jax.jit(f).trace`` does."""
        self._plain.require_jit("trace")
        return self._plain.trace(args, kwargs)

    def eval_shape(self, *args, **kwargs):
        """Output shapes and dtypes, as ``jax.eval_shape`` gives them."""
        return jax.eval_shape(self._generic, *args, **kwargs)

    def __get__(self, obj, objtype=None):
        if obj is None:
            return self
        return types.MethodType(self, obj)  # a bound method, as jax.jit's

    def __getstate__(self) -> dict:
        """The function and its options, as ``Pejitted``'s; decisions and caches are not pickled."""
        return {"function_name": self._plain.info.name, "fun": self._fun, "options": self._options}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["fun"], **state["options"])

    def __repr__(self) -> str:
        """``jax.jit``'s repr, as the generic program's until an argument is promoted."""
        return repr(self._plain)


def _call_watching(auto_ref: weakref.ref, *args, **kwargs):
    """A call while watching (see ``AutoPejitted._watch``); the caller holds the object."""
    return auto_ref()._watching(*args, **kwargs)


def _guarded(guards: tuple, special: CallPath, watching: Callable, args: tuple, kwargs: dict):
    """A call that the promoted dispatcher's memo did not serve (see ``AutoPejitted._settle``):
    ``special``'s if it passes the promoted objects (``guards``: each argument's key and
    weak reference), else ``watching``'s."""
    for key, ref in guards:
        value = (args[key] if key < len(args) else None) if isinstance(key, int) else kwargs.get(key)
        obj = ref()
        if obj is None or value is not obj:
            return watching(*args, **kwargs)
    return special.route(args, kwargs)


def _forget(auto_ref: weakref.ref, _ref: weakref.ref, _finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
    """A watched argument died (see ``AutoPejitted._forget``). Not while the
    interpreter shuts down, which clears the modules ``_watch`` needs."""
    auto = auto_ref()
    if auto is not None and not _finalizing():
        auto._watch()


def _is_array(value: Any) -> bool:
    return isinstance(value, (jax.Array, np.ndarray))


def _promotable(value: Any) -> bool:
    """An object whose identity fixes its value: a concrete jax.Array or frozen NumPy."""
    if isinstance(value, np.ndarray):
        return immutable(value)
    return isinstance(value, jax.Array) and not isinstance(value, _compat.Tracer)


def _holds(d: Decision, args: tuple, kwargs: dict, key, after: int) -> bool:
    """The guard of one promoted argument: this call passes the object it was promoted on."""
    if isinstance(key, int):
        value = args[key] if -len(args) <= key < len(args) else None
    else:
        value = kwargs.get(key)
    obj = d.ref() if d.ref is not None else None
    return obj is not None and value is obj and d.streak >= after


def _ordered(keys) -> tuple:
    unique = set(keys)
    return (*sorted(k for k in unique if isinstance(k, int)), *sorted(k for k in unique if isinstance(k, str)))


def options(constant_argnums: Any, **auto: Any) -> dict | None:
    """Validate the ``auto_*`` keywords; ``None`` unless ``constant_argnums == "auto"``."""
    given = {k: v for k, v in auto.items() if v is not None}
    if isinstance(constant_argnums, str):
        if constant_argnums != "auto":
            raise TypeError(
                f"constant_argnums must be an int, a sequence of ints or 'auto', got str {constant_argnums!r}"
            )
    elif given:
        raise TypeError(f"{', '.join(sorted(given))} only apply with constant_argnums='auto'")
    else:
        return None
    for name in ("auto_after", "auto_demote_after"):
        if name in given:
            v, low = given[name], 1 if name == "auto_after" else 0
            if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < low:
                raise ValueError(f"{name} must be an int >= {low}, got {v!r}")
            given[name] = int(v)
    if "auto_min_flops" in given:
        v = given["auto_min_flops"]
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)) or math.isnan(v) or v < 0:
            raise ValueError(f"auto_min_flops must be a number >= 0 (FLOPs per call), got {v!r}")
        given["auto_min_flops"] = float(v)
    return given


__all__ = ["AutoCacheInfo", "AutoPejitted", "AutoReport", "DEFAULT_MIN_FLOPS"]
