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
residual's compile (:func:`start`), once the caller has compiled
``jax.jit``'s program (:func:`compile_ahead`): on two cores the fold would
slow that compile down (XLA's codegen runs on several threads), and the
first result is what the user waits for. With one core nothing runs
beside: the first call folds.

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

import concurrent.futures
import contextvars
import functools
import logging
from collections.abc import Callable
from typing import Any

from .. import _compat
from .._fold import _gc, _offload
from .._fold._staging import specializing

_log = logging.getLogger("pejit")
_pool: concurrent.futures.ThreadPoolExecutor | None = None


def possible() -> bool:
    """Whether a fold can run beside the caller: a second core, and the caller at the top level."""
    return _offload.spare_core() and _compat.TRACE.value is _compat.eval_trace


def start(fold: Callable[[], Any], finish: Callable[[Any], None], name: str) -> concurrent.futures.Future:
    """Run ``fold()`` (the folded specialization) on the worker, then ``finish`` on it (the
    checks of a new specialization, and its compile)."""
    global _pool
    if _pool is None:
        _pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="pejit-beside")
    context = contextvars.copy_context()  # pejit's own settings (a device profile asked for)
    return _pool.submit(context.run, _run, _compat.carry_config(), fold, finish, name)


def _run(carried, fold: Callable[[], Any], finish: Callable[[Any], None], name: str) -> Any:
    with carried(), _gc.paused(), specializing():
        spec = fold()
        finish(spec)
    _log.debug("pejit %s: the fold beside the first call is ready", name)
    return spec


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


__all__ = ["Beside", "compile_ahead", "possible", "settled", "start"]
