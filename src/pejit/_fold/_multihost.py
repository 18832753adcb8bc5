"""Multi-process JAX (``jax.distributed``): what Python may ask of a constant.

Under multi-controller JAX a constant may be a global array sharded over
every process's devices. Folding works on such arrays as it does on one
host (each process runs the same SPMD programs on its own shards), and
Python control flow on a value works when every process holds that value
whole: a scalar from a reduction (``if a.sum() > 0``) is replicated.
A value that stays sharded (a boolean mask for ``a[a > 0]``) cannot be
handed to Python in any process; JAX's own error would point into pejit,
so :func:`check_fetchable` names the user's line instead.
"""

from __future__ import annotations

import linecache
import os
import sys
from typing import Any

import jax
import numpy as np


def _library_dirs() -> tuple[str, ...]:
    import jaxlib

    dirs = [os.path.dirname(os.path.abspath(m.__file__)) for m in (jax, jaxlib, np)]
    pejit = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # this module is in pejit/_fold
    return (*(d + os.sep for d in dirs), pejit + os.sep)


def user_line() -> str:
    """``file:line`` and source of the innermost frame outside JAX, NumPy and pejit."""
    libs = _library_dirs()
    frame = sys._getframe(1)
    while frame is not None:
        path = os.path.abspath(frame.f_code.co_filename)
        if not path.startswith(libs) and not path.startswith("<frozen"):
            code = linecache.getline(path, frame.f_lineno).strip()
            return f"{path}:{frame.f_lineno}" + (f" ({code})" if code else "")
        frame = frame.f_back
    return "an unknown line"


def check_fetchable(value: Any) -> None:
    """Raise if Python cannot read ``value`` in this process (see the module doc).

    Examples:
      >>> import jax.numpy as jnp
      >>> check_fetchable(jnp.ones(3))  # one process: always fetchable
    """
    if not isinstance(value, jax.Array) or value.is_fully_addressable or value.is_fully_replicated:
        return
    raise ValueError(
        f"pejit: Python needs the value of a {value.dtype}{list(value.shape)} array computed from "
        f"constants at {user_line()}, but that array is sharded across the "
        f"{jax.process_count()} processes (sharding {value.sharding}), so no process can "
        "read it whole. Under multi-process JAX, Python control flow and shapes may depend "
        "only on values every process holds whole, such as scalars from reductions "
        "(`if a.sum() > 0`). Compute this with jnp operations instead (e.g. jnp.where "
        "rather than a boolean mask), or replicate the value first "
        "(jax.lax.with_sharding_constraint to a replicated sharding)."
    )
