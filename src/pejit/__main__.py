"""``python -m pejit demo``.

jaxlib 0.10.2 miscompiles some CPU reductions in its YNN fusion (JAX issue
#39103), so this program turns that fusion off. XLA reads ``XLA_FLAGS`` when
the backend starts (at the first computation), which is after the package
import that ``python -m`` performs but before anything here runs, so setting
it now is in time. Library code never does this: it is the program's choice.
"""

import os
import sys

_YNN_OFF = "--xla_cpu_experimental_ynn_fusion_type="
if _YNN_OFF not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _YNN_OFF).strip()

from pejit._demo import main  # noqa: E402  (after XLA_FLAGS)

sys.exit(main())
