"""``python -m pejit demo``.

jaxlib 0.9 to 0.10.2 miscompile some CPU reductions in their YNN fusion (JAX
issue #39103), so this program turns that fusion off. XLA reads
``XLA_FLAGS`` when the backend starts (at the first computation), which is
after the package import that ``python -m`` performs but before anything
here runs, so setting it now is in time.
"""

import sys

from pejit._xla_flags import turn_off_ynn_fusion

turn_off_ynn_fusion()

from pejit._demo import main  # noqa: E402  (after XLA_FLAGS)

sys.exit(main())
