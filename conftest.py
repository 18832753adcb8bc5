"""Test configuration shared by tests/ and the doctests in src/.

jaxlib 0.9 to 0.10.2 miscompile some CPU reductions in their YNN fusion (JAX
issue #39103); like other JAX projects we turn that fusion off for tests.
This must happen before JAX initializes its backend, hence here.
"""

from pejit._xla_flags import turn_off_ynn_fusion

turn_off_ynn_fusion()
