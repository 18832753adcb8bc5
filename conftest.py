"""Test configuration shared by tests/ and the doctests in src/.

jaxlib 0.10.2 miscompiles some CPU reductions in its YNN fusion (JAX issue
#39103); like other JAX projects we turn that fusion off for tests. This must
happen before JAX initializes its backend, hence here. Older jaxlibs have no
YNN fusion and abort on the unknown flag, so it is set only where it exists.
"""

import os
from importlib.metadata import version

_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="
_YNN_SINCE = (0, 9)  # first jaxlib with the flag


def _jaxlib_version() -> tuple[int, ...]:
    return tuple(int(p) for p in version("jaxlib").split(".")[:2] if p.isdigit())


if _jaxlib_version() >= _YNN_SINCE and _YNN_OFF not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _YNN_OFF).strip()
