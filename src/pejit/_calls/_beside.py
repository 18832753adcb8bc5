"""Folding beside the first call: ``jax.jit``'s program serves while the fold runs on a worker.

A fold that pays per call may still cost the first call more than it saves
it: a factorization of the constants and the products around it compile a
program each on the folding thread (op by op, or as a folding program), and
the residual compiles after them, where ``jax.jit`` compiles the whole
program once. A user who swaps ``jax.jit`` for pejit should not wait for
that. Where the look says so (``Look.beside``, from
:func:`pejit._fold._cost.fold_first`), the first specialization is
``jax.jit``'s program with the constants passed, and its ``pending`` fold
runs here, on one worker thread: the folding trace, the first value, the
residual's compile, ahead of the calls after it (:func:`start`,
:func:`compile_ahead`). It starts when a second call has its result
(:func:`served`, then :func:`start_after`): work for later calls is paid for
by a function called again, not by one called once, as most of a script's
are, whose next programs' compiles and runs it would slow (XLA's codegen
and its CPU kernels run on several threads, and a fold's trace holds
Python's lock: on two cores, 20 small programs called once each took
1.3-1.5x ``jax.jit``'s time with their work beside them started after each
first result). With one core nothing runs beside: the first call folds.

Small constants whose work XLA folds as it compiles (``Look.compile_in``)
need nothing beside: the first call compiles them in, one compile, as
``jax.jit`` compiles the arrays a function closes over (their work folded,
the program often compiles faster than ``jax.jit``'s with them passed:
``benchmarks/first_call.py``).

When the fold is ready, the cache swaps it in for the call's key
(:meth:`pejit._calls._cache.Caches.specialization`): the next call runs the
folded program. Until then calls run ``jax.jit``'s, whose values agree with
the folded program's to a few ulps (as ``jax.jit``'s own with constants
closed over and passed do). The staged API (``specialize``, ``report``,
``lower``, ``explain``) asks for the folded program and waits
(:func:`settled`), and so does another value of the same structure
(:class:`Beside`), which then folds with the structure's folding program. A
trace that needs constant values folds this value concretely, still on the
worker, and so does a program whose custom rules close over constants,
served meanwhile by ``jax.jit``'s program, whose evaluation runs no rule
(:attr:`~pejit._calls._program.PerValue.serves`). A fold that fails leaves
``jax.jit``'s program to serve calls; the staged API then folds again on the
caller's thread, which raises there.

The worker runs under the caller's configuration (``jax.enable_x64``, a
default device: :func:`pejit._compat.carry_config`) and context variables
(a device profile asked for). Only calls at the top
level fold beside (not under a transformation, nor with donated arguments,
nor with placed constants), and only programs without effects.
"""

from __future__ import annotations

import _thread
import concurrent.futures
import contextvars
import functools
import logging
import sys
import threading
import time
import weakref
from collections.abc import Callable

# (imported with pejit, not by the first call that starts the worker: its module's
# import is a millisecond or two of that call)
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import jax

from .. import _compat
from .._fold import _gc, _offload
from .._fold._room import with_room
from .._fold._staging import specializing

_log = logging.getLogger("pejit")
_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


def possible() -> bool:
    """Whether a fold can run beside the caller: a second core, and the caller at the top level."""
    return _offload.spare_core() and _compat.TRACE.value is _compat.eval_trace


def start(fold: Callable[[], Any], finish: Callable[[Any], None], name: str) -> concurrent.futures.Future:
    """Run ``fold()`` (the folded specialization) on the worker, then ``finish`` on it (the
    checks of a new specialization, and its compile), once a second call of the
    specialization it runs beside has its result (:func:`served`), or someone waits
    for it (:func:`settled`); then what :func:`when_ready` asked for."""
    context = contextvars.copy_context()  # pejit's own settings (a device profile asked for)
    job = _Job(fold, finish, functools.partial(context.run, _run, _compat.carry_config(), name))
    pending = concurrent.futures.Future()  # (not the job's: it is its key in _jobs)
    _jobs[pending] = job
    return pending


class _Job:
    """A fold beside a call: its work (the fold and its finish, until it starts), the
    worker's call that runs it, and what to do with the folded specialization before
    anyone waiting for it wakes (the cache's swap)."""

    __slots__ = ("work", "run", "ready", "calls")

    def __init__(self, fold: Callable[[], Any], finish: Callable[[Any], None], run: Callable[..., None]):
        self.work: tuple | None = (fold, finish)  # until the worker takes it
        self.run: Callable[..., None] | None = run  # until handed to the worker
        self.ready: list[Callable[[Any], None]] = []
        self.calls = 0  # the calls served while it waits (see served)


#: The job of each pending fold, by its future.
_jobs: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


#: The calls of a specialization whose work beside waits, the last of which starts it (see :func:`served`).
CALLS_BEFORE_WORK = 2


def served(pending: concurrent.futures.Future, out: Any) -> bool:
    """A call of the specialization whose work beside is ``pending`` has dispatched its
    result ``out``: the :data:`CALLS_BEFORE_WORK`-th starts the work (:func:`start_after`).
    Whether it has started (no later call needs to come back here)."""
    job = _jobs.get(pending)
    if job is None or job.run is None:
        return True
    job.calls += 1
    if job.calls < CALLS_BEFORE_WORK:
        return False
    start_after(pending, out)
    return True


def start_after(pending: Any, out: Any) -> None:
    """Start the work ``pending`` (a specialization's ``pending``) once ``out`` (a call's
    result; None: none, or someone waits for the work) is ready. Until then it would
    take the interpreter and a core from what the user waits for: the trace and
    lowering of a fold or of a compile hold Python's lock, and an execution uses
    every core.

    The job goes to the worker from a thread of its own: the first start of the
    worker's thread waits for it to run (a third to half a millisecond, a share of a
    small program's first call)."""
    job = None if callable(pending) else _jobs.get(pending)
    if job is None:
        return
    with _pool_lock:
        run, job.run = job.run, None
    if run is not None:
        try:
            _thread.start_new_thread(_submit, (run, job, pending, out))
        except RuntimeError:  # no thread to spare: handed over from here
            _submit(run, job, pending, out)


def _submit(run: Callable[..., None], job: _Job, pending: concurrent.futures.Future, out: Any) -> None:
    global _pool
    try:
        with _pool_lock:
            if _pool is None:
                _pool = ThreadPoolExecutor(1, thread_name_prefix="pejit-beside")
        _pool.submit(run, job, pending, out)
    except BaseException as e:  # noqa: BLE001 -- the interpreter is shutting down: nothing runs beside
        pending.set_exception(e)


def when_ready(pending: concurrent.futures.Future, then: Callable[[Any], None]) -> None:
    """Call ``then`` with the folded specialization on the worker, before ``pending``
    resolves: whoever waits for it (the staged API) finds what ``then`` did done."""
    _jobs[pending].ready.append(then)


def _run(carried, name: str, job: _Job, pending: concurrent.futures.Future, out: Any) -> None:
    try:
        try:
            jax.block_until_ready(out)
            # the caller, woken by the same result, takes it first (it waits for the
            # interpreter's lock, which this thread would hold for a switch interval)
            time.sleep(sys.getswitchinterval())
        except Exception as e:  # noqa: BLE001 -- a failed result: start anyway
            _log.debug("pejit %s: the fold beside starts without the call's result (%s)", name, type(e).__name__)
        (fold, finish), job.work = job.work, None  # (the constants are the entry's to keep alive, not the job's)
        with carried(), _gc.paused(), specializing():
            spec = with_room(fold)  # (a trace and a compile: see _fold._room)
            with_room(finish, spec)
        del fold, finish
        for then in job.ready:
            then(spec)
        _log.debug("pejit %s: the fold beside the first call is ready", name)
        pending.set_result(spec)
    except BaseException as e:  # noqa: BLE001 -- the staged API folds again on its own thread, where it raises
        pending.set_exception(e)


class Beside:
    """What the programs' cache holds for a structure while its first fold runs beside
    the call (``serving`` is that call's specialization): another value of the structure
    waits for the fold, then folds with its program, rather than run ``jax.jit``'s."""

    __slots__ = ("serving",)

    def __init__(self, serving: Any):
        self.serving = serving

    def wait(self) -> None:
        if not callable(self.serving.pending):  # (started: a future)
            settled(self.serving)


def settled(spec: Any) -> Any:
    """``spec`` once its fold is ready: the folded specialization, or None where the fold
    failed (``jax.jit``'s program stays; a fold on the caller's thread then raises, as a
    call without ``FoldOptions.beside`` would)."""
    pending = spec.pending
    if pending is None:
        return spec
    start_after(pending, None)  # (waited for: start now)
    try:
        return pending.result()
    except Exception:  # noqa: BLE001 -- raised again by the caller's own fold
        return None


def compile_ahead(spec: Any, dyn_args: tuple, dyn_kwargs: dict) -> None:
    """Lower and compile the program ``spec.call`` runs for these arguments (JAX keeps the
    executable for the call). A failure is left to the call, which raises it."""
    call = spec.call
    fun, given = (call.func, call.args) if isinstance(call, functools.partial) else (call, ())
    try:
        fun.lower(*given, *dyn_args, **dyn_kwargs).compile()
    except Exception:  # noqa: BLE001
        pass


__all__ = ["Beside", "compile_ahead", "possible", "served", "settled", "start", "start_after", "when_ready"]
