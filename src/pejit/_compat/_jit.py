"""What pejit's call path takes from ``jax.jit``'s: checks, dispatch state, staged objects.

A pejit function should behave as ``jax.jit``'s at its edges, so the call
path (:mod:`pejit._calls`) reads what ``jax.jit``'s reads, where ``jax.config``
and the public API have no cheap or exact equivalent:

* ``api_util.check_callable`` and ``util.fun_name``: what ``jax.jit``
  accepts as a function (its ``TypeError``\\ s, word for word, in every
  version) and the name it gives one (``functools.partial`` unwrapped).
* ``array.ArrayImpl``: the concrete type of ``jax.Array``; the hot path
  compares ``type(x) is ArrayImpl``, much cheaper than ``isinstance``.
* ``config.disable_jit``: the state behind ``jax.disable_jit()``, read on
  every call as ``jax.jit``'s own dispatch reads it.
* ``core.get_axis_env`` and the axis-environment state: the named axes
  (``vmap``/``shard_map`` axis names and sizes) a call runs under, which
  ``jax.jit`` keys its caches on. The environment is an ``AxisEnv`` whose
  ``axis_sizes`` map names to sizes in every version; the state holds the
  (interned) ``AxisEnv`` itself in ``core`` on recent JAX, its hashable key
  (``()`` at top level) in ``config`` on 0.7.
* ``jax.stages.Traced``'s state and ``jax.export``'s lowering parameters:
  pejit's :class:`~pejit._calls._stages.Traced` is a subclass of JAX's,
  made from a trace ``jax.jit`` returns by copying its state (the layout
  changes between versions: :func:`as_traced`); ``jax.export`` (0.7 to
  0.12) lowers ``fun.trace(...)`` with
  ``_private_parameters=LoweringParameters(for_export=True)``, which is how
  a trace knows it is being exported (:func:`lowering_for_export`). JAX's
  trace can be called from 0.9 on (:data:`TRACED_IS_CALLABLE`).
* ``config.config_states``: every configuration state, whose thread-local
  values (``jax.enable_x64(True)`` as a context manager, say) a fold run on
  another thread must see as the caller's (:func:`carry_config`). Each state
  has ``get_local``/``swap_local``/``set_local`` from 0.7 on.
* ``traceback_util.api_boundary`` / ``register_exclusion``: an error raised
  in the user's function while pejit traces it shows the user's frames,
  not pejit's, exactly as ``jax.jit`` hides JAX's (and
  ``JAX_TRACEBACK_FILTERING=off`` turns both off). Without them (a JAX that
  moved them), tracebacks are whole.
* ``source_info_util.register_exclusion``: the frames an equation records
  (its source location in the lowered program, in XLA's op metadata and in
  profiles) are the user's, as under ``jax.jit``, not pejit's, which would
  otherwise add four to six frames to each (taking the places of the user's
  under JAX's limit of ten).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import jax

from ._internals import api_boundary, api_util, array, config, core, hide_from_tracebacks, source_info_util, util
from ._versions import missing

ArrayImpl = array.ArrayImpl
check_callable = api_util.check_callable
fun_name = util.fun_name
#: ``jax.disable_jit()``'s state: ``DISABLE_JIT.value`` is true under it (read
#: per call, so the hot path reads the attribute itself).
DISABLE_JIT = config.disable_jit

#: The named axes in effect: ``AXIS_ENV.value is NO_AXES`` at top level (a
#: cheap check for the hot path; see :func:`axis_env_key` for the key).
if hasattr(core, "axis_env_state"):
    AXIS_ENV, NO_AXES = core.axis_env_state, core.top_axis_env
elif hasattr(config, "axis_env_state"):  # JAX 0.7: the environment's hashable key
    AXIS_ENV, NO_AXES = config.axis_env_state, ()
else:  # pragma: no cover - only on an unsupported JAX
    raise missing("core.axis_env_state", "the named axes in effect")


def axis_env_key() -> tuple:
    """The named axes a call runs under (names and sizes), ``()`` at top level.

    Part of a specialization's key, as of ``jax.jit``'s: a function may read
    them (``lax.axis_size``), and folding evaluates what it reads.
    """
    env = core.get_axis_env()
    spmd = getattr(env, "spmd_axis_names", ())
    if not env.axis_sizes and not spmd:
        return ()
    return tuple(env.axis_sizes.items()), frozenset(spmd)


if api_boundary is None:  # pragma: no cover - a JAX that moved them: tracebacks are whole

    def api_boundary(fun, **_):
        return fun


def register_exclusion(path: str) -> None:
    """Treat the code under ``path`` as JAX treats its own: hidden from tracebacks
    (where this JAX filters them) and from the source locations of equations."""
    if hide_from_tracebacks is not None:
        hide_from_tracebacks(path)
    source_info_util.register_exclusion(path)


#: Whether ``jax.stages.Traced`` can be called (evaluating its jaxpr): JAX 0.9 on.
TRACED_IS_CALLABLE: bool = any("__call__" in vars(klass) for klass in jax.stages.Traced.__mro__[:-1])


def as_traced(traced: jax.stages.Traced, cls: type) -> jax.stages.Traced:
    """``traced`` as an instance of ``cls``, a subclass of ``jax.stages.Traced``.

    ``jax.stages.Traced`` has no public constructor, and its fields differ
    between versions; a copy of every slot (and of ``__dict__``, where the
    class has one) carries whatever this JAX keeps.

    Example:
      >>> import jax, jax.numpy as jnp
      >>> class Mine(jax.stages.Traced):
      ...     __slots__ = ()
      >>> t = as_traced(jax.jit(jnp.sin).trace(1.0), Mine)
      >>> type(t).__name__, t.lower().compile()(0.0)
      ('Mine', Array(0., dtype=float32, weak_type=True))
    """
    new = object.__new__(cls)
    for klass in type(traced).__mro__:
        slots = getattr(klass, "__slots__", ())
        for name in (slots,) if isinstance(slots, str) else slots:
            if name not in ("__dict__", "__weakref__") and hasattr(traced, name):
                setattr(new, name, getattr(traced, name))
    if hasattr(traced, "__dict__"):
        new.__dict__.update(traced.__dict__)
    return new


def lowering_for_export(lower_kwargs: dict[str, Any]) -> bool:
    """Whether ``Traced.lower(**lower_kwargs)`` is ``jax.export`` lowering the trace."""
    return bool(getattr(lower_kwargs.get("_private_parameters"), "for_export", False))


def carry_config() -> Callable[[], contextlib.AbstractContextManager]:
    """A context manager factory that sets, in another thread, the configuration this
    thread runs under (its thread-local values: ``with jax.enable_x64(True)``, a
    default device, a matmul precision), as a call on this thread would see it.

    Example:
      >>> import threading, jax
      >>> with jax.default_matmul_precision("highest"):
      ...     carried = carry_config()
      >>> seen = []
      >>> def worker():
      ...     with carried():
      ...         seen.append(jax.config.jax_default_matmul_precision)
      >>> t = threading.Thread(target=worker); t.start(); t.join()
      >>> seen
      ['highest']
    """
    local = [(state, value) for state in _CONFIG_STATES
             if (value := state.get_local()) is not _UNSET]

    @contextlib.contextmanager
    def carried() -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for state, value in local:
                stack.enter_context(state(value))
            yield

    return carried


_CONFIG_STATES = tuple(s for s in config.config_states.values() if hasattr(s, "get_local"))
_UNSET = config.config_ext.unset if hasattr(config, "config_ext") else object()
