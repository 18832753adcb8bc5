"""``scan``'s parameters, read and rebuilt in either of their forms.

Hoisting known work out of a loop and splitting a loop in two
(:mod:`pejit._residual.rules.loops`) build new ``scan`` equations from old
ones, with other constants, carries and scanned inputs. Inputs are
``[*consts, *carry, *xs]`` and outputs ``[*carry, *ys]`` in every version,
but how the parameters record that grouping changed: ``num_consts`` and
``num_carry`` (and ``linear``, per input, before 0.10; JAX 0.7 transposes a
scan by it) until 0.10.2, flat trees ``ft_in``/``ft_out``
(``jax._src.flattree``) from 0.11.0. No public API builds them; this
module does as ``jax/_src/lax/control_flow/loops.py`` does.
"""

from __future__ import annotations

from collections.abc import Sequence

from ._internals import flattree


class ScanParams:
    """Reads and rebuilds ``scan``'s parameters, in either of their forms.

    Inputs are ``[*consts, *carry, *xs]`` and outputs ``[*carry, *ys]``;
    JAX <= 0.10 records the counts (``num_consts``, ``num_carry``, and
    ``linear`` per input), JAX >= 0.11 flat trees (``ft_in``, ``ft_out``)
    whose groups we keep, so that JAX's output grouping is unchanged.
    """

    def __init__(self, params: dict):
        self.params = params
        if "ft_in" in params:
            consts, carry, xs = params["ft_in"].unpack()
            self.num_consts, self.num_carry, self.num_xs = len(consts), len(carry), len(xs)
        else:
            self.num_consts, self.num_carry = params["num_consts"], params["num_carry"]
            self.num_xs = len(params["jaxpr"].in_avals) - self.num_consts - self.num_carry

    def with_consts(self, jaxpr, num_consts: int) -> dict:
        """Parameters for ``jaxpr`` taking ``num_consts`` constants, the same carries and xs."""
        if "ft_in" in self.params:
            _, carry, xs = self.params["ft_in"].unpack()
            return dict(self.params, jaxpr=jaxpr, ft_in=flattree.pack((flattree.nones(num_consts), carry, xs)))
        return dict(self.params, jaxpr=jaxpr, num_consts=num_consts, **_linear(self.params, num_consts, self.num_consts))

    def split(self, jaxpr, *, consts: int, carry: Sequence[bool], xs: Sequence[bool], ys: Sequence[bool],
              extra_xs: int = 0, extra_ys: int = 0) -> dict:
        """Parameters of a scan keeping some of this scan's carries, xs and ys.

        ``carry``/``xs``/``ys`` mask which are kept. The new scan takes
        ``consts`` constants first, and ``extra_xs`` scanned inputs after the
        kept ones; it returns ``extra_ys`` stacked outputs after the kept ys.
        As in ``jax._src.lax.control_flow.loops._scan_partial_eval``.
        """
        n_carry = sum(carry)
        if "ft_in" in self.params:
            _, carry_g, xs_g = self.params["ft_in"].unpack()
            _, ys_g = self.params["ft_out"].unpack()
            carry_g = carry_g.filter_with_mask(list(carry))
            xs_g = xs_g.filter_with_mask(list(xs))
            ys_g = ys_g.filter_with_mask(list(ys))
            if extra_xs:
                xs_g = flattree.pack((xs_g, flattree.nones(extra_xs)))
            if extra_ys:
                ys_g = flattree.pack((ys_g, flattree.nones(extra_ys)))
            return dict(
                self.params, jaxpr=jaxpr,
                ft_in=flattree.pack((flattree.nones(consts), carry_g, xs_g)), ft_out=flattree.pack((carry_g, ys_g)),
            )
        return dict(self.params, jaxpr=jaxpr, num_consts=consts, num_carry=n_carry,
                    **_linear(self.params, consts, self.num_consts, [*carry, *xs], extra_xs))


def _linear(params: dict, consts: int, old_consts: int, kept: Sequence[bool] | None = None, extra: int = 0) -> dict:
    """``scan``'s ``linear`` (JAX < 0.10) for ``consts`` new constants, the carries and xs ``kept``
    masks (all: None; as they were: JAX 0.7 transposes a scan by them) and ``extra`` new xs."""
    if "linear" not in params:
        return {}
    old = [lin for i, lin in enumerate(params["linear"][old_consts:]) if kept is None or kept[i]]
    return {"linear": (False,) * consts + tuple(old) + (False,) * extra}
