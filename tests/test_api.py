"""The two forms of pe/pejit: argument numbers, caching, pytrees, jit keywords."""

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from pejit import pe, pejit

from ._util import Counter, primitive_names


def f4(a, b, c, d):
    return a + 10 * b + 100 * c + 1000 * d


# -- TFC form: argument numbers ----------------------------------------------


@pytest.mark.parametrize(
    "nums, call_args",
    [
        ([2, 1], (1.0, 4.0)),  # TFC returns 4311 here
        ([1, 2], (1.0, 4.0)),
        ([-1, 0], (2.0, 3.0)),
        ([3, -4], (2.0, 3.0)),
        ([0, 1, 2, 3], ()),
        ([], (1.0, 2.0, 3.0, 4.0)),
    ],
)
def test_constant_arg_nums_any_order(nums, call_args):
    g = pejit(1.0, 2.0, 3.0, 4.0, constant_arg_nums=nums)(f4)
    assert g(*call_args) == 4321.0
    g = pe(1.0, 2.0, 3.0, 4.0, constant_arg_nums=nums)(f4)
    assert g(*call_args) == 4321.0


@pytest.mark.parametrize(
    "nums, exc, match",
    [
        ([0, 0], ValueError, r"entry 0 names argument 0, which entry 0 already names"),
        ([1, -3], ValueError, r"entry -3 names argument 1"),
        ([4], ValueError, r"constant_arg_nums: entry 4 is out of range for 4"),
        ([-5], ValueError, r"entry -5 is out of range"),
        ([1.0], TypeError, r"constant_arg_nums: entry 1.0 of type float is not an integer"),
        (["1"], TypeError, r"entry '1' of type str"),
        ([True], TypeError, r"entry True of type bool"),
        ("0", TypeError, r"constant_arg_nums must be an int or a sequence of ints"),
    ],
)
def test_constant_arg_nums_errors(nums, exc, match):
    with pytest.raises(exc, match=match):
        pejit(1.0, 2.0, 3.0, 4.0, constant_arg_nums=nums)(f4)


def test_tfc_form_arity_error_names_counts():
    g = pejit(1.0, 2.0, 3.0, 4.0, constant_arg_nums=[0, 1])(f4)
    with pytest.raises(TypeError, match=r"takes 2 positional arguments \(the non-constant ones\) but 3"):
        g(1.0, 2.0, 3.0)


def test_tfc_form_with_nothing_bound_checks_its_calls_alike():
    g = pejit(1.0, 2.0, 3.0, 4.0, constant_arg_nums=[])(f4)
    assert g(1.0, 2.0, 3.0, 4.0) == f4(1.0, 2.0, 3.0, 4.0)
    with pytest.raises(TypeError, match=r"takes 4 positional arguments \(the non-constant ones\) but 3"):
        g(1.0, 2.0, 3.0)
    with pytest.raises(TypeError, match=r"takes its non-constant arguments by position"):
        g(1.0, 2.0, 3.0, d=4.0)


def test_tfc_form_with_nothing_bound_stages_as_jax_jit():
    # nothing to fold: its calls, lowering and trace are jax.jit's of the function
    f = lambda a, b: jnp.sin(a) * b  # noqa: E731
    a, b = jnp.arange(3.0), jnp.ones(3)
    g = pejit(a, b, constant_arg_nums=[])(f)
    want = jax.jit(f)(a, 2 * b)
    np.testing.assert_allclose(g.lower(a, b).compile()(a, 2 * b), want)
    np.testing.assert_allclose(g.trace(a, b).lower().compile()(a, 2 * b), want)
    assert [e.primitive.name for e in g.trace(a, b).jaxpr.eqns] == ["sin", "mul"]
    assert g.report(a, b).fallbacks == ("no constant arguments: every call is jax.jit's, nothing is folded",)


def test_tfc_form_folds_at_creation_and_respecializes_on_new_shape():
    counted = Counter(lambda A, x: jnp.linalg.inv(A) @ x)
    A = jnp.eye(3) * 2
    g = pejit(A, jnp.ones(3), constant_arg_nums=[0])(counted)
    assert counted.calls == 1
    np.testing.assert_allclose(g(jnp.ones(3)), 0.5 * np.ones(3))
    assert counted.calls == 1
    np.testing.assert_allclose(g(jnp.ones((3, 2))), 0.5 * np.ones((3, 2)))
    assert counted.calls == 2


# -- jax.jit form: caching ----------------------------------------------------


def test_call_time_form_traces_once_per_constant():
    counted = Counter(lambda A, x: jnp.linalg.inv(A) @ x)
    g = pejit(counted, constant_argnums=0)
    A = jnp.eye(3) * 2
    x = jnp.arange(3.0)
    for _ in range(3):
        np.testing.assert_allclose(g(A, x), x / 2)
    assert counted.calls == 1
    g(A, x + 1)  # new dynamic value, same aval: no retrace
    assert counted.calls == 1
    g(A, jnp.arange(3))  # new dtype: retrace
    g(A, jnp.ones((3, 4)))  # new shape: retrace
    assert counted.calls == 3
    B = jnp.eye(3) * 4  # new jax.Array: new specialization ...
    np.testing.assert_allclose(g(B, x), x / 4)
    assert g.cache_info().misses == 4
    assert counted.calls == 3  # ... of the same structure: no retrace (tests/test_cache.py)


def test_numpy_constant_mutation_is_never_stale():
    counted = Counter(lambda A, x: A.sum() * x)
    g = pejit(counted, constant_argnums=0)
    A = np.ones((4, 4), np.float32)
    assert g(A, 1.0) == 16.0
    A[0, 0] = 5.0
    assert g(A, 1.0) == 20.0  # re-specialized (by the folding program: no retrace)
    assert g.cache_info().misses == 2
    assert g(A.copy(), 1.0) == 20.0  # same content: reused
    assert g.cache_info().misses == 2
    assert counted.calls == 1


def test_python_scalars_and_static_leaves_by_value():
    counted = Counter(lambda cfg, x: x * cfg["scale"] if cfg["mode"] == "scale" else x + cfg["scale"])
    g = pejit(counted, constant_argnums=0)
    assert g({"mode": "scale", "scale": 3}, 2.0) == 6.0
    assert g({"mode": "scale", "scale": 3}, 5.0) == 15.0
    assert counted.calls == 1
    assert g({"mode": "shift", "scale": 3}, 2.0) == 5.0
    assert g({"mode": "scale", "scale": 3.0}, 2.0) == 6.0  # 3 vs 3.0: different types
    assert counted.calls == 3


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # basis @ xi + x folds nothing
def test_constant_argnames_and_decorator_factory():
    counted = Counter(lambda x, xi, *, basis: basis @ xi + x)

    g = pejit(constant_argnums=0, constant_argnames="basis")(counted)
    b = jnp.eye(2) * 3
    np.testing.assert_allclose(g(1.0, jnp.ones(2), basis=b), [4.0, 4.0])
    np.testing.assert_allclose(g(1.0, jnp.arange(2.0), basis=b), [1.0, 4.0])
    assert counted.calls == 1


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # folds nothing, on purpose
def test_constant_argnum_passed_by_keyword():
    g = pejit(lambda A, x: A @ x, constant_argnums=0)
    A = jnp.eye(2) * 2
    np.testing.assert_allclose(g(A=A, x=jnp.ones(2)), [2.0, 2.0])
    np.testing.assert_allclose(g(A, jnp.ones(2)), [2.0, 2.0])


def test_constant_argnames_unknown_name():
    with pytest.raises(ValueError, match=r"constant_argnums/constant_argnames: 'basis' is not a parameter"):
        pejit(lambda x, y: x, constant_argnames="basis")


def test_call_time_form_argnum_errors():
    with pytest.raises(ValueError, match=r"constant_argnums: entry 2 is out of range for 2"):
        pejit(lambda x, y: x, constant_argnums=2)
    with pytest.raises(TypeError, match=r"constant_argnums: entry 'a'"):
        pejit(lambda x, y: x, constant_argnums=["a"])


def test_front_end_misuse():
    with pytest.raises(TypeError, match=r"got 2 positional argument\(s\) but no constant_arg_nums"):
        pejit(1.0, 2.0)
    with pytest.raises(TypeError, match=r"either constant_arg_nums .* or constant_argnums"):
        pejit(1.0, constant_arg_nums=[0], constant_argnums=0)
    with pytest.raises(TypeError, match=r"Expected a callable value, got 3"):  # jax.jit's message
        pejit(constant_argnums=0)(3)


def test_dynamic_non_array_leaf_is_an_error():
    g = pejit(lambda c, x: c + len(x), constant_argnums=0)
    with pytest.raises(TypeError, match=r"argument 1 is dynamic but has a leaf of type str"):
        g(1.0, "abc")


def test_unhashable_static_leaf():
    g = pejit(lambda c, x: x, constant_argnums=0)

    class Unhashable:
        __hash__ = None

    with pytest.raises(TypeError, match=r"argument 0 has a leaf of type Unhashable"):
        g(Unhashable(), 1.0)


# -- pytrees ------------------------------------------------------------------


class Params(NamedTuple):
    w: jax.Array
    b: jax.Array


@jax.tree_util.register_pytree_node_class
class PLN:
    """A registered class holding data (constants) and parameters, as in seed 003."""

    def __init__(self, Y, X, n):
        self.Y, self.X, self.n = Y, X, n

    def tree_flatten(self):
        return (self.Y, self.X), self.n

    @classmethod
    def tree_unflatten(cls, n, children):
        return cls(*children, n)


@dataclasses.dataclass(frozen=True)
class Module:
    """An Equinox-style module: array fields are leaves, the rest is static."""

    weight: jax.Array
    activation: str = "tanh"


jax.tree_util.register_dataclass(Module, data_fields=["weight"], meta_fields=["activation"])


def test_pytree_constants_and_outputs():
    def f(consts, dyn):
        data, params, model, module = consts
        y = data["A"] @ dyn["x"] + params.b
        z = model.Y.sum() * model.n + module.weight @ dyn["x"]
        act = getattr(jnp, module.activation)
        return {"y": act(y), "pair": (z, dyn["x"] * 2)}

    consts = (
        {"A": jnp.arange(6.0).reshape(2, 3), "tag": "ignored"},
        Params(jnp.ones(3), jnp.array([1.0, 2.0])),
        PLN(jnp.ones((4, 2)), jnp.zeros((4, 1)), 7),
        Module(jnp.full((3,), 0.5), "sin"),
    )
    dyn = {"x": jnp.array([1.0, -1.0, 2.0])}
    expected = jax.jit(lambda d: f(consts, d))(dyn)
    for g in (pejit(f, constant_argnums=0), pe(f, constant_argnums=0)):
        out = g(consts, dyn)
        assert jax.tree_util.tree_structure(out) == jax.tree_util.tree_structure(expected)
        jax.tree_util.tree_map(np.testing.assert_allclose, out, expected)
    out = pejit(consts, dyn, constant_arg_nums=[0])(f)(dyn)  # TFC fails here ("Too few leaves")
    jax.tree_util.tree_map(np.testing.assert_allclose, out, expected)


def test_dict_constant_folds():
    g = pejit(lambda d, x: jnp.linalg.inv(d["A"]) @ x, constant_argnums=0)
    d = {"A": jnp.eye(3) * 2}
    assert "lu" not in primitive_names(jax.make_jaxpr(lambda x: g(d, x))(jnp.ones(3)))
    np.testing.assert_allclose(g(d, jnp.ones(3)), 0.5 * np.ones(3))


def test_callable_constant_acts_static():
    counted = Counter(lambda act, x: act(x))
    g = pejit(counted, constant_argnums=0)
    np.testing.assert_allclose(g(jnp.sin, 1.0), np.sin(1.0), rtol=1e-6)
    np.testing.assert_allclose(g(jnp.cos, 1.0), np.cos(1.0), rtol=1e-6)
    g(jnp.sin, 2.0)
    assert counted.calls == 2


# -- constants are concrete while tracing -------------------------------------


def test_data_dependent_shapes_on_constant():
    def f(x, y):
        return x[x > 1.5].sum() * y + x[x > 1.5].shape[0]

    x = jnp.array([1.0, 2.0, 3.0, 0.5])
    assert pejit(f, constant_argnums=0)(x, 2.0) == 12.0
    assert pejit(x, 2.0, constant_arg_nums=[0])(f)(1.0) == 7.0
    with pytest.raises(jax.errors.NonConcreteBooleanIndexError):
        jax.jit(f)(x, 2.0)


def test_python_if_on_constant_reduction():
    def f(x, y):
        if x.sum() > 0:
            return y * 2
        return y * 3

    g = pejit(f, constant_argnums=0)
    assert g(jnp.ones(3), 1.0) == 2.0
    assert g(-jnp.ones(3), 1.0) == 3.0


@pytest.mark.parametrize("convert", [float, complex, int, bool])
def test_python_number_from_deferred_constant_work(convert):
    # sin(x) is deferred (not evaluated on the spot), so its sum is a tracer
    # that only the policy can make concrete; JAX's float() and complex()
    # do not ask for the concrete value by themselves.
    def f(x, y):
        return y * jnp.abs(convert(jnp.sin(x).sum()))

    x = jnp.linspace(0.0, 3.0, 64)
    want = abs(convert(np.sin(np.linspace(0.0, 3.0, 64, dtype=np.float32)).sum()))
    np.testing.assert_allclose(pejit(f, constant_argnums=0)(x, 2.0), 2 * want, rtol=1e-5)


def test_lazy_expansion_is_concrete_to_python():
    # ones((64, 64)) * c stays in the residual program (it is a cheap
    # expansion), yet Python may still branch on values computed from it.
    def f(c, x):
        big = jnp.ones((64, 64)) * c
        if big.sum() > 100:
            return big + x
        return big - x

    g = pejit(f, constant_argnums=0)
    np.testing.assert_allclose(g(2.0, 1.0), np.full((64, 64), 3.0))
    np.testing.assert_allclose(g(0.01, 1.0), np.full((64, 64), -0.99), rtol=1e-6)
    assert g.report(2.0, 1.0).folded_bytes <= 64


# -- jit keywords -------------------------------------------------------------


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # folds nothing, on purpose
def test_static_argnums_refer_to_called_signature():
    def f(A, n, x):
        for _ in range(n):
            x = A @ x
        return x

    A = jnp.eye(2) * 2
    g = pejit(f, constant_argnums=0, static_argnums=1)
    np.testing.assert_allclose(g(A, 3, jnp.ones(2)), [8.0, 8.0])
    np.testing.assert_allclose(g(A, 1, jnp.ones(2)), [2.0, 2.0])
    # TFC form: static_argnums count in the reduced signature (n, x).
    h = pejit(A, 2, jnp.ones(2), constant_arg_nums=[0], static_argnums=0)(f)
    np.testing.assert_allclose(h(2, jnp.ones(2)), [4.0, 4.0])
    np.testing.assert_allclose(h(3, jnp.ones(2)), [8.0, 8.0])


def test_constant_and_static_or_donated_overlap():
    with pytest.raises(ValueError, match=r"argument 0 is both in constant_argnums/constant_argnames and in static_argnums"):
        pejit(lambda a, b: a, constant_argnums=0, static_argnums=0)
    with pytest.raises(ValueError, match=r"argument 1 is both in constant_argnums/constant_argnames and in donate_argnums"):
        pejit(lambda a, b: a, constant_argnums=[0, 1], donate_argnums=(1,))
    with pytest.raises(ValueError, match=r"argument 'b' is both"):
        pejit(lambda a, *, b: a, constant_argnames="b", donate_argnames="b")


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # folds nothing, on purpose
def test_donate_argnums_remapped():
    g = pejit(lambda A, x: A @ x, constant_argnums=0, donate_argnums=1)
    x = jnp.ones(4)
    lowered = g.lower(jnp.eye(4), x)
    # runner(*consts, x): the donated input is x, not the folded constants
    (*consts_info, x_info), _ = lowered.args_info
    assert consts_info
    assert x_info.donated
    assert not any(c.donated for c in consts_info)
    np.testing.assert_allclose(g(jnp.eye(4), x), np.ones(4))


@pytest.mark.parametrize(
    "kwargs",
    [
        {"keep_unused": True},
        {"inline": True},
        {"compiler_options": {"xla_embed_ir_in_executable": False}},
        {"out_shardings": None},
        {"in_shardings": (None, None)},
    ],
)
def test_jit_keywords_accepted(kwargs):
    g = pejit(lambda A, x: jnp.linalg.inv(A) @ x, constant_argnums=0, **kwargs)
    np.testing.assert_allclose(g(jnp.eye(2) * 2, jnp.ones(2)), [0.5, 0.5])


def test_in_shardings_length_checked():
    g = pejit(lambda A, x: A @ x, constant_argnums=0, in_shardings=(None,))
    with pytest.raises(ValueError, match=r"in_shardings has 1 entries but .* 2 positional"):
        g(jnp.eye(2), jnp.ones(2))


def test_pe_rejects_jit_keywords():
    with pytest.raises(TypeError, match=r"pe does not compile, so it takes no jax.jit keywords; got \['donate_argnums'\]"):
        pe(lambda a: a, constant_argnums=0, donate_argnums=0)


def test_lower_trace_eval_shape():
    g = pejit(lambda A, x: jnp.linalg.inv(A) @ x, constant_argnums=0)
    A = jnp.eye(3) * 2
    x = jnp.ones(3)
    text = g.lower(A, x).as_text()
    assert "lapack" not in text.lower() and "custom_call" not in text
    compiled = g.lower(A, x).compile()
    np.testing.assert_allclose(compiled(A, x), 0.5 * np.ones(3))
    with pytest.raises(ValueError, match=r"specialized for other constant values"):
        compiled(A * 2, x)
    traced = g.trace(A, x)
    assert "dot_general" in str(traced.jaxpr)
    shape = g.eval_shape(A, jax.ShapeDtypeStruct((3, 5), jnp.float32))
    assert (shape.shape, shape.dtype) == ((3, 5), jnp.float32)
    tfc = pejit(A, x, constant_arg_nums=[0])(lambda A, x: jnp.linalg.inv(A) @ x)
    np.testing.assert_allclose(tfc.lower(x).compile()(x), 0.5 * np.ones(3))
    assert tfc.eval_shape(x).shape == (3,)


@pytest.mark.filterwarnings("ignore::pejit.NothingFoldedWarning")  # folds nothing, on purpose
def test_pe_has_no_lower():
    g = pe(lambda A, x: A @ x, constant_argnums=0)
    with pytest.raises(AttributeError, match=r"use pejit, not pe"):
        g.lower(jnp.eye(2), jnp.ones(2))


def test_methods():
    class Model:
        def __init__(self, A):
            self.A = A

        @pejit(constant_argnums=0)
        def apply(self, x):
            return jnp.linalg.inv(self.A) @ x

        def __hash__(self):
            return id(self)

    m = Model(jnp.eye(2) * 4)
    np.testing.assert_allclose(m.apply(jnp.ones(2)), [0.25, 0.25])


@pytest.mark.parametrize("wrap", [pe, pejit])
def test_folded_scalar_output_is_an_array(wrap):
    out, y = wrap(lambda c, x: (c * 2, x), constant_argnums=0)(3.0, jnp.ones(2))
    assert isinstance(out, jax.Array) and out == 6.0
    assert jax.typeof(out) == jax.typeof(jax.jit(lambda: 3.0 * 2)())


# -- the objects the public methods return --------------------------------------------


def test_public_methods_return_exported_types():
    import pejit as package

    f = pejit(lambda A, x: jnp.linalg.inv(A) @ x, constant_argnums=0)
    A, x = 2 * jnp.eye(3), jnp.arange(3.0)
    spec = f.specialize(A, x)
    assert isinstance(spec, package.Specialization)
    np.testing.assert_allclose(spec.call(x), x / 2)
    lowered = f.lower(A, x)
    assert isinstance(lowered, package.Lowered)
    assert "lu" not in lowered.as_text()  # jax.stages.Lowered's own attributes pass through
    compiled = lowered.compile()
    assert isinstance(compiled, package.Compiled)
    np.testing.assert_allclose(compiled(A, 2 * x), x)
    with pytest.raises(ValueError, match="specialized for other constant values"):
        compiled(3 * jnp.eye(3), x)
    g = pejit(A, x, constant_arg_nums=[0])(lambda A, x: jnp.linalg.inv(A) @ x)
    assert isinstance(g.specialize(x), package.Specialization)
    tfc_compiled = g.lower(x).compile()
    assert isinstance(tfc_compiled, package.Compiled)
    np.testing.assert_allclose(tfc_compiled(4 * x), 2 * x)  # the TFC form's compiled call takes x only


def test_options_are_parsed_once_into_an_immutable_info():
    def fn(a, b, *, scale, c):
        return a * b * scale + c

    f = pejit(fn, constant_argnums=0, constant_argnames="c", static_argnames="scale", donate_argnums=1)
    info = f.info
    assert (info.name, info.jit, info.nargs) == ("fn", True, 2)
    assert info.fixed_nums == {0} and info.fixed_names == {"a", "c", "scale"}  # a may come by name
    assert info.donate_nums == {1} and not info.one_value
    with pytest.raises(dataclasses.FrozenInstanceError):
        info.jit = False
    with pytest.raises(TypeError):
        info.jit_kwargs["keep_unused"] = True  # a read-only view
    np.testing.assert_allclose(f(2.0, jnp.ones(2), scale=3.0, c=1.0), [7.0, 7.0])
    assert f.info is info
