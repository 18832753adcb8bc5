"""What folding costs beyond its arithmetic and its compiles (issue 24).

Structural, never timed: calls into JAX's per-value machinery are counted
with patches, and the count must not grow with the number of folded values;
memory is checked by what is still referenced, not by RSS.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import pe, pejit
from pejit import _compat


def many_constants(a, x, k):
    """``k`` folded constants, each read by the residual (``x`` is dynamic)."""
    return sum(jnp.sin(a + float(i)) @ x for i in range(k))


class Counting:
    """Counts calls to ``jax.block_until_ready`` and to ``Tracer.__getattr__``."""

    def __init__(self, monkeypatch):
        self.blocks = 0
        self.getattrs: list[str] = []
        block, getattr_ = jax.block_until_ready, _compat.Tracer.__getattr__

        def counting_block(x):
            self.blocks += 1
            return block(x)

        def counting_getattr(tracer, name):
            self.getattrs.append(name)
            return getattr_(tracer, name)

        monkeypatch.setattr(jax, "block_until_ready", counting_block)
        monkeypatch.setattr(_compat.Tracer, "__getattr__", counting_getattr)


@pytest.mark.parametrize("form", ["call-time", "tfc"])
def test_no_per_value_overhead(monkeypatch, form):
    """Neither blocking nor tracer attribute lookups grow with the folded values.

    The call-time form folds under ``jax.jit`` (a folding program), where the
    folded values are tracers: asking one for ``block_until_ready`` goes
    through JAX's error-message machinery (tens of milliseconds each).
    """
    a, x = np.eye(3, dtype=np.float32), np.ones(3, np.float32)
    counts = {}
    for k in (4, 24):
        c = Counting(monkeypatch)
        fun = lambda a, x: many_constants(a, x, k)  # noqa: E731
        if form == "call-time":
            out = pejit(fun, constant_argnums=0)(a, x)
        else:
            out = pejit(a, x, constant_arg_nums=[0])(fun)(x)
        np.testing.assert_allclose(out, jax.jit(fun)(a, x), rtol=1e-5)
        counts[k] = (c.blocks, len(c.getattrs))
        assert "block_until_ready" not in c.getattrs
        monkeypatch.undo()
    assert counts[24] == counts[4], counts
    assert counts[4][0] <= 1, counts


def test_specialize_again_no_per_value_overhead(monkeypatch):
    """A second constant value runs the folding program: no per-value overhead either."""
    f = pejit(lambda a, x: many_constants(a, x, 24), constant_argnums=0)
    a, x = np.eye(3, dtype=np.float32), np.ones(3, np.float32)
    f(a, x)
    c = Counting(monkeypatch)
    f(jnp.asarray(2 * a), x)
    assert c.blocks <= 1 and not c.getattrs
