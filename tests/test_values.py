"""Uniform values: found bit for bit, in host memory and where values live on a device."""

import jax.numpy as jnp
import numpy as np
import pytest

from pejit._fold import _values

from ._util import Compiles

DTYPES = [jnp.bool_, jnp.int4, jnp.uint4, jnp.int8, jnp.int32, jnp.bfloat16, jnp.float8_e4m3fn,
          jnp.float16, jnp.float32, jnp.complex64]


def one_and_other(dtype):
    one = jnp.ones((3, 4), dtype)
    return one, one.at[1, 2].set(jnp.zeros((), dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_uniform_values_in_host_memory(dtype):
    one, other = one_and_other(dtype)
    assert _values.uniform_value(one) == np.asarray(one)[0, 0]
    assert _values.uniform_value(other) is None


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: np.dtype(d).name)
def test_the_device_program_takes_every_dtype(dtype):
    # what uniform_value runs where a value is not in host memory (a GPU's):
    # one program per type, booleans, 4-bit integers and complex numbers too
    one, other = one_and_other(dtype)
    same, element = _values._uniform_on_device(one)
    assert bool(same) and np.asarray(element) == np.asarray(one)[0, 0]
    assert not bool(_values._uniform_on_device(other)[0])


def test_the_device_program_compares_bits():
    # -0.0 is not 0.0, and a NaN is itself, in real and imaginary parts alike
    assert not bool(_values._uniform_on_device(jnp.array([0.0, -0.0]))[0])
    assert bool(_values._uniform_on_device(jnp.array([np.nan, np.nan]))[0])
    assert not bool(_values._uniform_on_device(jnp.array([0j, complex(0.0, -0.0)], jnp.complex64))[0])


def test_the_device_program_compiles_once_per_type():
    a, b, c = jnp.zeros(7, jnp.float32), jnp.ones(7, jnp.float32), jnp.full(7, 2.0, jnp.float32)
    _values._uniform_on_device(a)
    with Compiles() as compiles:
        _values._uniform_on_device(b)
        _values._uniform_on_device(c)
    assert compiles.count == 0


def test_a_numpy_scalar_is_keyed_by_its_value():
    # a literal of a replayed jaxpr is a NumPy scalar before JAX 0.10 (a 0-d array
    # after): a broadcast of it is then a zero however the program spelled it
    zero = _values.value_key(np.zeros((), np.float32))
    assert _values.value_key(np.float32(0)) == zero == _values.value_key(np.float32(0.0))
    assert _values.value_key(np.float32(-0.0)) != zero
    assert _values.value_key(np.float64(0)) != zero
