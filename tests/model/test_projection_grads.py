"""The hand-written backward passes of projection.py equal JAX's automatic ones, and the model's
Linear layers keep nnx.Linear's parameters and forward numbers."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from matpo_jax.model import projection


def _vjp(fn, cot, *args):
    out, vjp = jax.vjp(fn, *args)
    return (out, *vjp(cot))


def _assert_close(got, want, rtol=1e-5, atol=1e-6):
    for name, g, w in zip(["out", *[f"d{i}" for i in range(len(got) - 1)]], got, want):
        assert g.dtype == w.dtype, name
        np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(w, np.float32),
                                   rtol=rtol, atol=atol, err_msg=name)


@pytest.mark.parametrize("lead", [(7,), (2, 5), (3, 4, 2)])
def test_project_matches_autodiff(lead):
    rng = np.random.default_rng(len(lead))
    x = jnp.asarray(rng.standard_normal((*lead, 6)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((6, 9)), jnp.float32)
    cot = jnp.asarray(rng.standard_normal((*lead, 9)), jnp.float32)
    want = _vjp(lambda a, b: jnp.einsum("...d,df->...f", a, b), cot, x, w)
    _assert_close(jax.jit(lambda: _vjp(projection.project, cot, x, w))(), want)


def test_project_float32_output_from_bfloat16():
    """The lm-head use: bfloat16 operands, float32 logits; gradients come back in bfloat16."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal((4, 8)), jnp.bfloat16)
    w = jnp.asarray(rng.standard_normal((8, 5)), jnp.bfloat16)
    cot = jnp.asarray(rng.standard_normal((4, 5)), jnp.float32)
    want = _vjp(lambda a, b: jnp.einsum("td,dv->tv", a, b, preferred_element_type=jnp.float32),
                cot, x, w)
    got = _vjp(lambda a, b: projection.project(a, b, jnp.float32), cot, x, w)
    assert got[0].dtype == jnp.float32
    _assert_close(got, want, rtol=2e-2, atol=5e-2)


def test_swiglu_matches_autodiff():
    rng = np.random.default_rng(1)
    gate, up, cot = (jnp.asarray(rng.standard_normal((3, 11)) * 4, jnp.float32) for _ in range(3))
    want = _vjp(lambda g, u: jax.nn.silu(g) * u, cot, gate, up)
    _assert_close(jax.jit(lambda: _vjp(projection.swiglu, cot, gate, up))(), want)


def test_linear_is_nnx_linear():
    plain = nnx.Linear(5, 3, use_bias=False, rngs=nnx.Rngs(0))
    ours = projection.Linear(5, 3, use_bias=False, rngs=nnx.Rngs(0))
    assert isinstance(ours, nnx.Linear)
    assert jax.tree.structure(nnx.state(plain)) == jax.tree.structure(nnx.state(ours))
    x = jnp.asarray(np.random.default_rng(2).standard_normal((2, 4, 5)), jnp.float32)
    np.testing.assert_array_equal(np.asarray(ours(x)), np.asarray(plain(x)))
