"""Rematerialising the decoder layers (and scanning over them) changes what the backward keeps and
how the program is laid out, never the numbers; the train step passes its policy down."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from matpo_jax import parallel
from matpo_jax.model import DecoderConfig, CausalLM
from matpo_jax.model.remat import remat_policy
from matpo_jax.trainer import step as ts
from matpo_jax.trainer.packing import PackedBatch
from fixtures.losses import default_loss

LOSS = default_loss()  # the default experiment's loss

CONFIG = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=3,
                     num_attention_heads=4, num_key_value_heads=2, head_dim=8)


def test_every_policy_and_layer_scan_give_identical_values_and_gradients():
    graphdef, params = nnx.split(CausalLM(CONFIG, rngs=nnx.Rngs(0)))
    rng = np.random.default_rng(0)
    tokens = jnp.asarray(rng.integers(0, CONFIG.vocab_size, (2, 24)), jnp.int32)
    segments = jnp.asarray([[1] * 10 + [2] * 14, [1] * 20 + [0] * 4])
    weights = jnp.asarray(rng.normal(size=(2, 24, CONFIG.hidden_size)), jnp.float32)

    def value_and_grads(remat, scan_layers):
        def f(params):
            hidden = nnx.merge(graphdef, params).hidden_states(
                tokens, None, segments, remat=remat, scan_layers=scan_layers)
            return jnp.sum(hidden * weights)
        return jax.jit(jax.value_and_grad(f))(params)

    value, grads = value_and_grads("none", False)
    # dots_no_batch differs from dots only in which matmuls it keeps.
    for remat, scan_layers in (("full", False), ("dots", False), ("full", True)):
        other_value, other_grads = value_and_grads(remat, scan_layers)
        np.testing.assert_allclose(other_value, value, rtol=1e-6, err_msg=remat)
        for a, b in zip(jax.tree.leaves(other_grads), jax.tree.leaves(grads)):
            # A scanned layer stack may sum in another order: equal to float32 rounding.
            scale = float(np.abs(b).max())
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-5,
                                       atol=1e-6 * scale, err_msg=f"{remat} scan={scan_layers}")


def test_train_step_traces_the_configured_policy():
    model = CausalLM(CONFIG, rngs=nnx.Rngs(0))
    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    graphdef, state, shardings = ts.init_train_state(model, optax.sgd(0.1), mesh)
    ints, floats = jnp.zeros((2, 16), jnp.int32), jnp.zeros((2, 16), jnp.float32)
    batch = PackedBatch(tokens=ints, positions=ints, segment_ids=ints + 1, role_ids=ints,
                        loss_mask=floats, advantages=floats, old_logprobs=floats,
                        loss_weights=floats, rollout_ids=ints)

    def program(**kw):
        step = ts.make_gradient_fn(graphdef, ts.TrainStepConfig(**kw, loss=LOSS), mesh, shardings)
        traced = jax.make_jaxpr(lambda s, b: step(s, b))(state, batch)
        return str(traced)

    plain, full = program(), program(remat="full", scan_layers=True)
    assert "remat" not in plain and "remat" in full
    layers_scan = f"length={CONFIG.num_hidden_layers}"
    assert layers_scan not in plain and layers_scan in full


def test_unknown_policy_is_refused_by_name():
    with pytest.raises(ValueError, match="remat policy 'some'"):
        remat_policy("some")
    with pytest.raises(ValueError, match="TrainStepConfig.remat='some'"):
        ts.TrainStepConfig(remat="some", loss=LOSS)
