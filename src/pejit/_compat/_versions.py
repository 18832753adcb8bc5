"""Which JAX this is, and the error for a JAX pejit cannot run on.

pejit tells JAX versions apart by what they have, probed where the
difference is handled (the other modules of :mod:`pejit._compat`), not by
their numbers: a number says nothing of a development build, and a probe
fails loudly when the thing probed moves. The numbers are read here only,
for what records them (reports, the persistent cache's keys) and for the
one fact no probe can give: which XLA flags this jaxlib accepts, which must
be set before its backend starts (an unknown flag aborts it).
"""

from __future__ import annotations

import jax
import jaxlib

#: What pejit's CI has run (see .ci/run); :func:`missing`'s error quotes it.
SUPPORTED_JAX = "0.7.0 to 0.12.x"

#: The versions of JAX and jaxlib, as they name themselves.
JAX_VERSION: str = jax.__version__
JAXLIB_VERSION: str = jaxlib.__version__


def release(version: str) -> tuple[int, ...]:
    """The leading numbers of a version: ``(0, 11, 1)`` of ``"0.11.1.dev20250101"``."""
    numbers = []
    for part in version.split("."):
        if not part.isdigit():
            break
        numbers.append(int(part))
    return tuple(numbers)


#: Whether this jaxlib's XLA:CPU has the experimental "YNN" fusion (0.9 on),
#: and so accepts the flag that turns it off (:mod:`pejit._xla_flags`).
JAXLIB_HAS_YNN_FUSION: bool = release(JAXLIB_VERSION)[:2] >= (0, 9)


def missing(what: str, detail: str) -> ImportError:
    """The error for a JAX that lacks ``what`` pejit needs, naming it and the supported versions."""
    return ImportError(
        f"pejit supports JAX {SUPPORTED_JAX}, but JAX {JAX_VERSION} lacks what it needs: "
        f"{what} ({detail}). Install a supported JAX (pip install 'jax>=0.7,<0.13') or a pejit "
        "release that supports this one."
    )
