"""The YNN workaround, for pejit's own programs (demo, tests, benchmarks).

jaxlib 0.9 to 0.10.2 miscompile some CPU reductions in their experimental
"YNN" fusion (JAX issue #39103); like other JAX projects, pejit's programs
turn it off. XLA reads ``XLA_FLAGS`` when its backend starts, so this must run
before the first computation. Older jaxlibs have no YNN fusion and abort on
the unknown flag, so it is added only where it exists. Library code never
calls this: flags are the program's choice.
"""

from __future__ import annotations

import os

from . import _compat

YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="


def turn_off_ynn_fusion() -> None:
    """Add the flag to ``XLA_FLAGS`` (once), where this jaxlib knows it."""
    flags = os.environ.get("XLA_FLAGS", "")
    if _compat.JAXLIB_HAS_YNN_FUSION and YNN_OFF not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} {YNN_OFF}".strip()
