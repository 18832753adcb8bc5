"""Test configuration shared by tests/ and the doctests in src/.

jaxlib 0.10.2 miscompiles some CPU reductions in its YNN fusion (JAX issue
#39103); like other JAX projects we turn that fusion off for tests. This must
happen before JAX initializes its backend, hence here.
"""

import os

_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="
if _YNN_OFF not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _YNN_OFF).strip()
