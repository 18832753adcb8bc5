"""Opaque kernels of a fold, run on a worker thread beside the rest of it.

A fold runs on one thread: the trace, then each batch, JAX's dispatch and
the NumPy host rules one equation after the other. A kernel that no host
rule covers and that JAX runs as a call into native code (TFC's basis
``H``, a custom call into its C++ library) then waits for everything before
it, though its inputs were known long before, and the arithmetic after it
waits for the kernel, though most of that arithmetic reads older values.
Where such kernels are a large share of the batch (TFC's basis on a
full-size PDE, beside the NumPy arithmetic on its tangents), the second
core sits idle through all of it.

Compiled, such a kernel runs in XLA without the GIL, and NumPy's loops
release it too. So :class:`Kernels` hands each kernel to one worker thread
as soon as its inputs are known: while the trace records it, if they are
concrete then (a folding program's constants count, by their first value:
:meth:`Kernels.given`), else when the batch has computed them (:class:`Ahead`), in
the batch's order, while the results not yet read stay under
:data:`AHEAD_BYTES`. The batch takes each result where the equation stands,
and computes the kernels the worker has not started while it waits. The
worker runs the primitive's own lowering (what ``jax.jit`` of it runs, and
what JAX's eager dispatch compiles for JAX's own primitives), so the values
are the eager ones. Programs are lowered on the folding thread, under its
configuration (``jax.enable_x64`` is per thread).

Smaller kernels, and those whose inputs the trace does not know yet, are
computed by their batch, but their programs need not wait for it:
:meth:`Kernels.warm` has the worker compile each as the trace records it,
which JAX's eager dispatch would do at the batch, tens of milliseconds per
primitive and input type: a short fold's first value can otherwise spend a
large share of its time compiling a few primitives, which the worker
compiles while the trace runs.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import functools
import os
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import jax
import numpy as np

from .. import _compat
from . import _device, _host
from ._primitives import (
    CALLS,
    CUSTOM_CALLS,
    called_jaxpr,
    fused_first,
    fusible,
)
from ._values import value_key

#: Bytes of results handed out and not yet read by the batch: how far the
#: worker may run ahead (room for several large basis kernels' results).
AHEAD_BYTES = 256 * 2**20

#: Smaller outputs are computed in place: a hand-off costs tens of
#: microseconds, and small kernels are quick.
MIN_BYTES = 2**20

_worker: concurrent.futures.ThreadPoolExecutor | None = None
_MISSING = object()


class _Handed(NamedTuple):
    future: concurrent.futures.Future
    kernel: _Kernel
    args: list
    early: bool  # handed out by the trace (else by a batch's Ahead)


def worth_a_kernel(prim, params: dict, out_bytes: int) -> bool:
    """Whether an equation on known values is a kernel worth handing to the worker: no host
    rule, not a call, not what a compiled segment would fuse (``plan_batch`` runs it
    eagerly), compilable, with outputs of :data:`MIN_BYTES` or more."""
    return (prim not in _host.HOST_RULES and prim.name not in CALLS and prim.name not in CUSTOM_CALLS
            and not fusible(prim, params) and out_bytes >= MIN_BYTES and _compat.has_lowering(prim, "cpu"))


class Kernels:
    """The kernels of one fold handed to the worker, by recipe
    (:class:`pejit._fold._recipe.Recipe`), and their results not yet read.

    Those handed out by the trace and by a batch wait under separate
    budgets of :data:`AHEAD_BYTES`: a batch runs only what its values
    need, and must not find the budget held by kernels that it does not
    run, or runs later. Not ``enabled``, none is handed out (a fold whose
    first value is one compiled program has no use for them).
    """

    def __init__(self, enabled: bool = True):
        self.enabled = enabled and _cores() > 1 and _device.host_computes()
        self._handed: dict[Any, _Handed] = {}
        self._waiting = {True: 0, False: 0}  # by early: bytes handed out, not read yet
        self._puts: dict[tuple, Any] = {}  # small NumPy inputs (see _host.to_jax_once)
        # by id, a folding program's abstract constants -> their first value
        # while it is traced (see given); the recipes handed out on them, by
        # what they compute; and those values, held so that an id stays theirs
        self._given: dict[int, Any] | None = None
        self._by_inputs: dict[tuple, Any] = {}
        self._held: list = []

    @contextlib.contextmanager
    def given(self, tracers: Sequence[Any], values: Sequence[Any]) -> Iterator[None]:
        """Within, the abstract constants of a folding program's trace
        (``pejit._calls._specializer.trace_program``) have these first values:
        a kernel on them starts as the trace records it, as on concrete
        constants. The first value's batch, whose equations are other
        recipes, takes its result where an equation computes the same:
        same primitive, parameters and inputs (by
        :func:`pejit._fold._values.value_key`). TFC's basis ``H`` reads the
        coordinates alone: its kernels ran during the TFC form's concrete
        trace, and during the call-time form's first value, on cores the
        batch needs. The tracers are not kept (a residual must not keep its
        folding trace alive)."""
        self._given = {id(t): v for t, v in zip(tracers, values)}
        self._held.extend(values)
        try:
            yield
        finally:
            self._given = None

    def _jax(self, args: Sequence[Any]) -> list:
        """A kernel's inputs as ``jax.Array``s, each small NumPy value put once
        (the kernels of TFC's basis read the same grids)."""
        return [_host.to_jax_once(a, self._puts) for a in args]

    def kernel(self, recipe) -> bool:
        """Whether ``recipe`` is a kernel worth a hand-off (:func:`worth_a_kernel`)."""
        return self.enabled and worth_a_kernel(recipe.prim, recipe.params, recipe.out_bytes())

    def early(self, recipe, args: Sequence[Any] | None = None) -> None:
        """Hand ``recipe`` out as the trace records it, if it is a kernel on
        concrete inputs (not values of other recipes, not abstract but for
        those :meth:`given`); else start compiling what its batch would
        compile for it (see :meth:`warm`). ``args`` are its inputs where
        the trace knows more of them than the recipe reads (a uniform value)."""
        args = recipe.args if args is None else args
        given = self._given
        if given is not None:
            args = [given.get(id(a), a) if isinstance(a, _compat.Tracer) else a for a in args]
        if not self.kernel(recipe) or any(isinstance(a, (_compat.Var, _compat.Tracer)) for a in args):
            self.warm(recipe)
        elif given is None:
            self.hand(recipe, args, early=True)
        else:  # known by its inputs, not by this recipe, which holds the trace's tracers
            key = _inputs_key(recipe, args)
            if key is None:
                return
            stand_in = dataclasses.replace(recipe, args=tuple(args))
            self.hand(stand_in, args, early=True)
            if stand_in in self._handed:  # not past the budget, and lowered
                self._by_inputs[key] = stand_in

    def warm(self, recipe) -> None:
        """Compile ``recipe``'s program on the worker now, if its batch would
        compile it on its own: JAX compiles each primitive (each ``jnp.sin``)
        for each input type the first time it runs, tens of milliseconds apiece,
        and the trace, which records ``recipe`` long before its batch runs,
        is pure Python that the compiler (which releases the GIL) need not
        wait for. The batch then runs that program (see :meth:`take`)."""
        if self.enabled and _compiled_alone(recipe.prim, recipe.params):
            kernel = _lowered(recipe, _specs(recipe.args, abstract=True))
            if kernel is not None:
                kernel.compile_ahead()

    def hand(self, recipe, args: Sequence[Any], early: bool = False) -> bool:
        """Hand ``recipe`` out on these inputs; False while too many results wait."""
        waiting = self._waiting[early]
        if waiting and waiting + recipe.out_bytes() > AHEAD_BYTES:
            return False
        kernel = _lowered(recipe, _specs(args))
        if kernel is not None:
            args = self._jax(args)
            self._handed[recipe] = _Handed(_pool().submit(kernel, args), kernel, args, early)
            self._waiting[early] += recipe.out_bytes()
        return True

    def __contains__(self, recipe) -> bool:
        return recipe in self._handed

    def alike(self, recipe, args: Sequence[Any], take: bool = False) -> Any:
        """The recipe handed out on the :meth:`given` values that computes what
        ``recipe`` on ``args`` does (forgotten, with ``take``), if any."""
        if not self._by_inputs or not self.kernel(recipe):
            return None
        key = _inputs_key(recipe, args)
        if key is None:
            return None
        return self._by_inputs.pop(key, None) if take else self._by_inputs.get(key)

    def recall(self) -> None:
        """Take back the kernels the trace handed out that the worker has not
        started: a batch hands them out again in the order it needs them.
        Those on :meth:`given` values stay: the batch knows them by their inputs."""
        given = set(self._by_inputs.values())
        for recipe, handed in list(self._handed.items()):
            if handed.early and recipe not in given and handed.future.cancel():
                del self._handed[recipe]
                self._waiting[True] -= recipe.out_bytes()

    def close(self) -> None:
        """Let go of what no batch took (the fold is over): unstarted kernels are not run."""
        for handed in self._handed.values():
            handed.future.cancel()
        self._handed.clear()
        self._puts.clear()
        self._by_inputs.clear()
        self._held.clear()
        self._waiting = {True: 0, False: 0}

    def compute(self, recipe, args: Sequence[Any]) -> Any:
        """The outputs of ``recipe`` on ``args`` by its lowered kernel, on this
        thread, if it is a kernel; else None. (JAX's eager ``impl`` may hold
        the GIL, as TFC's ``H`` does, and stall the worker: see :meth:`take`.)"""
        if not self.kernel(recipe):
            return None
        kernel = _lowered(recipe, _specs(args))
        try:
            return None if kernel is None else kernel(self._jax(args))
        except Exception:  # noqa: BLE001 - evaluated by the batch instead, where an error is the eager one
            return None

    def prepare(self, recipe, args: Sequence[Any]) -> Callable[[], Any] | None:
        """A call of ``recipe``'s kernel on ``args`` for another thread, lowered
        here (under this thread's configuration); None if it is no kernel."""
        if not self.kernel(recipe):
            return None
        kernel = _lowered(recipe, _specs(args))
        return None if kernel is None else functools.partial(kernel, self._jax(args))

    def take(self, recipe, args: Sequence[Any]) -> Any:
        """The outputs of ``recipe`` on ``args``, if it is a kernel; else None.

        While the worker computes it, this thread computes the next kernels
        the worker has not started (XLA runs two at once, one per core).
        A kernel the worker has not started is computed here, and so is one
        not handed out while the worker is busy, compiled too: JAX's eager
        ``impl`` may hold the GIL (TFC's ``H`` does) and stall the worker.
        One never handed out runs here by the program :meth:`warm` compiled
        for it, if any.
        """
        handed = self._handed.pop(recipe, None)
        if handed is None:
            same = self.alike(recipe, args, take=True)
            if same is not None:
                handed = self._handed.pop(same, None)
                recipe = same
        try:
            if handed is None:
                busy = self._handed and self.kernel(recipe)
                if busy:
                    kernel = _lowered(recipe, _specs(args))
                    return None if kernel is None else kernel(self._jax(args))
                kernel = _warmed(recipe, args) if self.enabled else None
                return None if kernel is None else kernel(args)
            self._waiting[handed.early] -= recipe.out_bytes()
            if handed.future.cancel():
                return handed.kernel(handed.args)
            self.help(handed.future)
            return handed.future.result()
        except Exception:  # noqa: BLE001 - evaluated by the batch instead, where an error is the eager one
            return None

    def help(self, future: concurrent.futures.Future) -> None:
        """Until ``future`` is done, compute here the kernels handed out that the
        worker has not started (XLA runs two at once, one per core)."""
        for other, later in self._handed.items():
            if future.done():
                return
            if later.future.cancel():
                self._handed[other] = _Handed(_ran(later.kernel, later.args), *later[1:])


class Ahead:
    """The kernels of a batch's eager ``recipes``, handed out as their inputs
    come: call :meth:`submit` before each equation the batch evaluates.

    ``env`` is the batch's environment, in which a ``Var`` is known once
    the batch has defined it.
    """

    def __init__(self, kernels: Kernels, recipes: Sequence[Any], env: dict):
        self._kernels = kernels
        self._recipes = recipes
        self._env = env
        self._queue = [i for i, r in enumerate(recipes) if kernels.kernel(r)]
        self._next = 0  # the first entry of _queue not yet handed out or passed
        kernels.recall()

    def submit(self, position: int) -> None:
        """Hand out the kernels after ``position`` whose inputs are known, in order."""
        queue = self._queue
        while self._next < len(queue) and queue[self._next] <= position:
            self._next += 1  # reached by the batch before it could be handed out
        while self._next < len(queue):
            r = self._recipes[queue[self._next]]
            if r not in self._kernels:  # else handed out while traced
                args = [self._env.get(a, _MISSING) if isinstance(a, _compat.Var) else a for a in r.args]
                if any(a is _MISSING for a in args):
                    return  # inputs not computed yet: later
                if self._kernels.alike(r, args) is None and not self._kernels.hand(r, args):
                    return  # too far ahead: later
            self._next += 1


def spare() -> concurrent.futures.Executor | None:
    """The worker, where a second core can run it beside the folding thread (else
    None): for other work of the fold that releases the GIL, after its kernels."""
    return _pool() if spare_core() else None


def spare_core() -> bool:
    """Whether this process may run on a second core (without starting the worker,
    whose module a first call that never needs it does not import)."""
    return _cores() > 1


def _cores() -> int:
    affinity = getattr(os, "sched_getaffinity", None)  # not on macOS
    return len(affinity(0)) if affinity else os.cpu_count() or 1


def _ran(fn: Callable, *args) -> concurrent.futures.Future:
    """The future of ``fn(*args)``, computed here and now."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    try:
        future.set_result(fn(*args))
    except Exception as e:  # noqa: BLE001 - raised where the result is read, as the worker's would be
        future.set_exception(e)
    return future


def _pool() -> concurrent.futures.ThreadPoolExecutor:
    global _worker
    if _worker is None:
        _worker = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pejit-kernels")
    return _worker


class _Kernel:
    """One primitive lowered for one set of parameters and input types,
    compiled by whichever thread first runs it."""

    def __init__(self, lowered):
        self._lowered = lowered
        self._compiled = None
        self._lock = threading.Lock()
        self.ahead = False  # compiled, or being compiled, on the worker

    def compile_ahead(self) -> None:
        if not self.ahead:
            self.ahead = True
            _pool().submit(self._compile)

    def _compile(self) -> None:
        with self._lock:
            if self._compiled is None:
                try:
                    self._compiled = self._lowered.compile()
                except Exception:
                    self.ahead = False  # not a program to take (see _warmed): JAX's eager dispatch, once
                    raise

    def __call__(self, args: Sequence[Any]) -> Any:
        self._compile()
        return self._compiled(*args)


#: Per primitive, parameters and input types: the kernel, or None where it
#: is left to the batch (``pejit._fold._batch.clear_programs`` empties it).
lowered_kernels: dict[Any, _Kernel | None] = {}
_MAX_KERNELS = 256
#: Call bodies, by identity: whether a batch compiles a call of them alone.
_alone_bodies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
#: The calls a user's program binds (not pejit's own, which no batch compiles alone).
_USER_CALLS = frozenset(["jit", "pjit", "closed_call"])


def _specs(args: Sequence[Any], abstract: bool = False) -> tuple | None:
    """The input types of a kernel on ``args``, as ``(shape, dtype)`` pairs
    (asked per equation of a batch: a ``jax.ShapeDtypeStruct`` apiece cost
    more than the lookup), or None where it is left to the batch: Python
    scalars and weak types (the kernel's result would not be weak), keys.
    With ``abstract``, a recipe's variables and abstract constants count,
    by their types."""
    specs = []
    for a in args:
        if abstract and isinstance(a, (_compat.Var, _compat.Tracer)):
            a = a.aval
        elif not isinstance(a, (np.ndarray, jax.Array)) or isinstance(a, _compat.Tracer):
            return None
        if a.dtype not in _host.DTYPES or getattr(a, "weak_type", False):
            return None
        specs.append((a.shape, a.dtype))
    return tuple(specs)


def _compiled_alone(prim, params: dict) -> bool:
    """Whether a batch would have JAX compile ``prim`` for itself: no host
    rule covers it, and no compiled segment would fuse it, or not
    always (a run starting at a ``sin`` may stay eager; see
    ``pejit._fold._plan.plan_batch``)."""
    if prim.name in CALLS:
        body = called_jaxpr(prim, params)
        return prim.name in _USER_CALLS and body is not None and _body_alone(body)
    return (prim not in _host.HOST_RULES and prim.name not in CUSTOM_CALLS and _unfused(prim, params)
            and _compat.has_lowering(prim, "cpu"))


def _unfused(prim, params: dict) -> bool:
    """Whether a batch may evaluate this equation outside a compiled run: it
    is not fusible, or a run starts at it (a run that may stay eager)."""
    return not fusible(prim, params) or fused_first(prim, params)


def _body_alone(body) -> bool:
    """:func:`_compiled_alone` for a call of ``body``, asked once per body
    (each ``jnp`` function called on the same types binds the same one),
    which the answer does not keep alive."""
    alone = _alone_bodies.get(body)
    if alone is None:
        alone = _alone_bodies[body] = (any(_unfused(e.primitive, e.params) for e in body.eqns)
                                       and not _host.covers(body))
    return alone


def _warmed(recipe, args: Sequence[Any]) -> _Kernel | None:
    """The kernel :meth:`Kernels.warm` compiled for ``recipe`` on these inputs, if any."""
    if not _compiled_alone(recipe.prim, recipe.params):
        return None
    kernel = lowered_kernels.get(_key(recipe, _specs(args)))
    return kernel if kernel is not None and kernel.ahead else None


def _inputs_key(recipe, args: Sequence[Any]) -> tuple | None:
    """What identifies ``recipe``'s result on ``args`` (see :meth:`Kernels.given`), or None."""
    try:
        key = (recipe.prim, recipe.params_key, tuple(map(value_key, args)))
        hash(key)
    except TypeError:
        return None
    return key


def _key(recipe, specs: tuple | None) -> tuple | None:
    if specs is None:
        return None
    try:
        key = (recipe.prim, recipe.params_key, specs)
        hash(key)
    except TypeError:
        return None
    return key


def _lowered(recipe, specs: tuple | None) -> _Kernel | None:
    """``recipe``'s primitive lowered for inputs of these types (cached), or None where it is left to the batch."""
    key = _key(recipe, specs)
    if key is None:
        return None
    if key not in lowered_kernels:
        if len(lowered_kernels) >= _MAX_KERNELS:
            lowered_kernels.pop(next(iter(lowered_kernels)))
        lowered_kernels[key] = _lower(recipe.prim, recipe.params, specs)
    return lowered_kernels[key]


def _lower(prim, params, specs) -> _Kernel | None:
    structs = [jax.ShapeDtypeStruct(shape, dtype) for shape, dtype in specs]
    try:
        if _compat.primitive_effects(prim, [_compat.typeof(a) for a in structs], params):
            return None  # effects keep their order: not moved to another thread
        return _Kernel(jax.jit(functools.partial(_bind, prim, params)).lower(*structs))
    except Exception:  # noqa: BLE001 - no lowering for these inputs: left to the batch
        return None


def submit(fn: Callable[[], Any]) -> concurrent.futures.Future:
    """Run ``fn`` on the worker, after what it was handed before."""
    return _pool().submit(fn)


def compiled_ahead(lowered) -> _Kernel:
    """``lowered``, compiling on the worker from now: call it with its arguments
    as one sequence (it waits for the compilation, or compiles here)."""
    kernel = _Kernel(lowered)
    kernel.compile_ahead()
    return kernel


def _bind(prim, params, *args):
    return prim.bind(*args, **params)
