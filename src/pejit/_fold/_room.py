"""Room on CPython's frame stack for a trace, so that it never crosses a chunk's edge.

CPython (3.11 on) keeps a thread's Python frames on a stack of chunks, 16
KiB or more each. A call whose frame does not fit in the top chunk gets a
new chunk (an ``mmap``), which is freed (an ``munmap``) as soon as the frame
at its base returns. A trace that calls small functions from a depth just
below a chunk's edge, over and over, pays a system call and page faults on
each of them (python/cpython#142183: since March 2026 CPython keeps one
chunk cached, in 3.13 and later; 3.11 and 3.12 take no such fixes). How
often that happens depends on how deep the caller's stack is, so it is
luck, and a ``jax.jit`` call is as exposed as pejit's: tinygp's GP
regression traced in 49 ms from a script's top level and in 66 ms twenty
frames deeper; thirty frames deeper, ``strace`` counted six times the
``munmap`` calls.

:func:`with_room` calls a function from a frame that starts a chunk of its
own, 2 MiB with 1 MiB free above the frame: room for a thousand frames of
a trace, a fold or a lowering (Python's default recursion limit), so no
call of theirs makes or frees a chunk. The frame is large only in its
evaluation stack, which CPython neither clears nor reads, so the memory is
reserved but not touched; it costs an ``mmap`` and an ``munmap``, about ten
microseconds, which pejit pays where it traces a new specialization only.

Examples:
  >>> with_room(divmod, 7, 2)
  (3, 1)
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any

#: Slots of the frame's evaluation stack: CPython sizes a new chunk to the
#: smallest power of two above the frame plus 1000 slots, so a frame just over
#: half of 2 MiB leaves the other half free above it.
ROOM_SLOTS = (1 << 20) // 8 - 1000 + 1


def _call(fun, *args, **kwargs):
    return fun(*args, **kwargs)


_code = _call.__code__
with_room: Callable[..., Any] = types.FunctionType(
    _code.replace(co_stacksize=_code.co_stacksize + ROOM_SLOTS), _call.__globals__, "with_room")
with_room.__doc__ = "``fun(*args, **kwargs)``, called with room on the frame stack (see the module docstring)."
