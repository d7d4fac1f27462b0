"""The train step with LoRA adapters (model/lora.py): exact under any micro-batch / device split
(loss and adapter gradients), the base frozen (no gradient, no optimizer state, unchanged by
updates), per-role adapters trained only by their role's tokens, and the KL reference = the
base with adapters off, from the same parameter tree."""
import jax
import numpy as np
import optax
import pytest
from flax import nnx

from matpo_jax import parallel
from matpo_jax.model import CausalLM
from matpo_jax.rl import advantages, rewards
from matpo_jax.rl.batch import sequences_from_rollouts
from matpo_jax.trainer import packing
from matpo_jax.trainer import step as ts
from fixtures.losses import default_loss
from fixtures.rl_batches import tiny_lora_model as lora_model, tiny_model_config

LOSS = default_loss()
MAX_LEN, ROWS = 48, 16
SPLITS = ((8, 1), (8, 2), (8, 4))  # (devices, micro-batches) compared with (1, 1)


@pytest.fixture(scope="module")
def sequences(rollout_batch):
    rollouts, golds = rollout_batch(seed=5, queries=2, group=3, max_workers=2)
    reward = rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds))
    seqs = sequences_from_rollouts(rollouts, advantages.assign_advantages(rollouts, reward))
    assert {s.role_id for s in seqs} == {0, 1}
    return seqs


@pytest.fixture(scope="module")
def meshes():
    return {1: parallel.make_mesh(devices=jax.devices()[:1]),
            8: parallel.make_mesh(data=2, fsdp=2, tensor=2)}


@pytest.fixture(scope="module", params=["shared", "per_role"])
def setup(request, meshes):
    model = lora_model(request.param)
    tx = optax.sgd(0.1)
    states = {n: ts.init_train_state(model, tx, mesh) for n, mesh in meshes.items()}

    def gradient_fn(devices, micro):
        graphdef, _, shardings = states[devices]
        return ts.make_gradient_fn(graphdef, ts.TrainStepConfig(micro_batches=micro, loss=LOSS),
                                   meshes[devices], shardings)

    return request.param, model, states, gradient_fn


def _host(tree):
    return jax.tree.map(lambda x: np.array(x), tree)


def test_any_split_gives_the_same_loss_and_adapter_gradients(sequences, setup):
    roles, _, states, gradient_fn = setup
    batch = packing.pack_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=LOSS)
    loss, grads, _ = gradient_fn(1, 1)(states[1][1], batch)
    assert float(np.abs(loss)) > 0
    paths = [parallel.path_to_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(grads)[0]]
    assert paths and all("/lora_" in p for p in paths)  # gradients of the adapters only
    scale = max(float(np.abs(g).max()) for g in jax.tree.leaves(grads))
    assert scale > 0
    if roles == "per_role":  # planner and worker tokens both train their own adapter
        for adapter in (0, 1):
            assert max(float(np.abs(g[adapter]).max()) for g in jax.tree.leaves(grads)) > 0
    for devices, micro in SPLITS:
        split_loss, split_grads, _ = gradient_fn(devices, micro)(states[devices][1], batch)
        np.testing.assert_allclose(split_loss, loss, rtol=1e-5)
        for g, r in zip(jax.tree.leaves(split_grads), jax.tree.leaves(grads)):
            np.testing.assert_allclose(np.asarray(g), np.asarray(r), rtol=1e-5,
                                       atol=1e-6 * scale)


def test_updates_move_the_adapters_and_leave_the_base_bit_for_bit(sequences, setup, meshes):
    _, model, _, _ = setup
    tx = ts.make_optimizer(ts.OptimizerConfig(learning_rate=1e-2))
    graphdef, state, shardings = ts.init_train_state(model, tx, meshes[8])
    adapter_size = sum(x.size for x in jax.tree.leaves(state.params))
    base_size = sum(x.size for x in jax.tree.leaves(state.frozen))
    assert adapter_size < base_size
    # Adam's two moments of the adapters, and nothing of the base.
    moments = sum(x.size for x in jax.tree.leaves(state.opt_state) if x.ndim > 0)
    assert moments == 2 * adapter_size
    step = ts.make_train_step(graphdef, tx, ts.TrainStepConfig(micro_batches=2, loss=LOSS),
                              meshes[8], shardings)
    batch = packing.pack_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=LOSS)
    base_before, adapters_before = _host(state.frozen), _host(state.params)
    for _ in range(2):
        state, metrics = step(state, batch)
    assert int(metrics["skipped_updates"]) == 0
    for a, b in zip(jax.tree.leaves(_host(state.frozen)), jax.tree.leaves(base_before)):
        np.testing.assert_array_equal(a, b)
    assert any(not np.array_equal(a, b) for a, b in
               zip(jax.tree.leaves(_host(state.params)), jax.tree.leaves(adapters_before)))


def test_per_role_adapters_are_trained_by_their_own_roles_tokens(sequences, meshes):
    model = lora_model("per_role")
    graphdef, state, shardings = ts.init_train_state(model, optax.sgd(0.1), meshes[1])
    grads_of = ts.make_gradient_fn(graphdef, ts.TrainStepConfig(loss=LOSS), meshes[1], shardings)
    planners = [s for s in sequences if s.role_id == 0]
    batch = packing.pack_sequences(planners, MAX_LEN, rows=ROWS, loss_config=LOSS)
    _, grads, _ = grads_of(state, batch)
    for g in jax.tree.leaves(grads):
        assert not np.asarray(g[1]).any()  # the worker adapter: exactly zero
    assert max(float(np.abs(g[0]).max()) for g in jax.tree.leaves(grads)) > 0


def test_the_kl_reference_is_the_base_with_adapters_off(sequences, meshes):
    mesh = meshes[8]
    config = ts.TrainStepConfig(micro_batches=2, loss=LOSS)
    batch = packing.pack_sequences(sequences, MAX_LEN, rows=ROWS, loss_config=LOSS)
    graphdef, state, shardings = ts.init_train_state(lora_model("per_role"), optax.sgd(0.1), mesh)
    reference = ts.make_logprob_fn(graphdef, config, mesh, shardings, adapters=False)(
        state.params, state.frozen, batch)
    policy = ts.make_logprob_fn(graphdef, config, mesh, shardings)(
        state.params, state.frozen, batch)
    base_def, base_state, base_sh = ts.init_train_state(CausalLM(tiny_model_config(),
                                                                 rngs=nnx.Rngs(0)),
                                                        optax.sgd(0.1), mesh)
    base = ts.make_logprob_fn(base_def, config, mesh, base_sh)(base_state.params,
                                                               base_state.frozen, batch)
    mask = batch.loss_mask != 0
    np.testing.assert_allclose(reference[mask], base[mask], rtol=1e-6, atol=1e-6)
    assert np.abs(policy[mask] - base[mask]).max() > 1e-3  # the adapters change the policy
