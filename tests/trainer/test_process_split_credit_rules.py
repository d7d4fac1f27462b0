"""Exact over processes, for every credit rule (MATPO's, per-agent normalisation, setwise ratio):
each process packs its own questions' rollouts with the whole batch's totals (`matpo_batch(...,
gather=...)`, as multihost.allgather supplies them) and the data-parallel all-reduce sums what
every process computed. So the parts' losses and gradients must sum to the one-process batch's.
A real 2-process run of the default rule is tests/run/test_multiprocess.py; this covers the rules
it does not run, in seconds (docs/METHOD.md sections 4.5 and 5.1). Also with per-role LoRA
adapters (docs/lora.md): the parts' adapter gradients sum to the whole batch's."""
import jax
import numpy as np
import optax
import pytest

from matpo_jax import parallel
from matpo_jax.agents.trajectory import WORKER
from matpo_jax.rl import rewards
from matpo_jax.rl.batch import matpo_batch
from matpo_jax.trainer import step as ts
from fixtures.losses import default_loss
from fixtures.rl_batches import tiny_lora_model

PACK_LEN, MICRO = 48, 2
RULES = {  # name -> (loss options, rl.group_by)
    "matpo": ({}, "planner"),
    "agent_norm": ({}, "agent"),
    "setwise": ({"ratio": "setwise"}, "planner"),
}


@pytest.fixture(scope="module")
def scored(rollout_batch):
    rollouts, golds = rollout_batch(seed=11, queries=4, group=3, max_workers=2)
    for r in rollouts:  # the planners sample two turns: spread the workers over both
        if r.role == WORKER:
            r.spawn_turn = r.rollout_id % 2
    return rollouts, rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds))


def _batch(rollouts, reward, name, gather=None):
    options, group_by = RULES[name]
    config = default_loss(**options)
    setwise = config.ratio == "setwise"
    return matpo_batch(rollouts, reward, loss_config=config, pack_len=PACK_LEN,
                       row_multiple=MICRO, group_by=group_by, gather=gather,
                       set_classes=MICRO if setwise else None).batch, config


def _loss_and_grads(model, batch, config):
    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    graphdef, state, shardings = ts.init_train_state(model, optax.sgd(0.1), mesh)
    grads_of = ts.make_gradient_fn(graphdef, ts.TrainStepConfig(loss=config, micro_batches=MICRO),
                                   mesh, shardings)
    loss, grads, _ = grads_of(state, batch)
    return float(loss), [np.asarray(g, np.float64) for g in jax.tree.leaves(grads)]


@pytest.fixture(scope="module", params=["full", "per_role_lora"])
def model(request, tiny_model):
    return tiny_model if request.param == "full" else tiny_lora_model("per_role")


@pytest.mark.parametrize("name", list(RULES))
def test_two_processes_parts_sum_to_the_one_process_step(name, scored, model):
    rollouts, reward = scored
    whole, config = _batch(rollouts, reward, name)
    whole_loss, whole_grads = _loss_and_grads(model, whole, config)
    # Process p holds questions p and p + 2 (whole groups, as the question sharding does).
    parts = [[r for r in rollouts if r.query_index % 2 == p] for p in (0, 1)]
    part_rewards = [{r.rollout_id: reward[r.rollout_id] for r in part if r.rollout_id in reward}
                    for part in parts]
    inputs = []  # pass 1: each part's collective input; pass 2: all of them, in process order
    for part, part_reward in zip(parts, part_rewards):
        _batch(part, part_reward, name,
               gather=lambda v: inputs.append(np.asarray(v)) or np.asarray(v)[None])
    gathered = np.stack(inputs)
    built = [_batch(part, part_reward, name, gather=lambda v: gathered)[0]
             for part, part_reward in zip(parts, part_rewards)]
    assert built[0].shape == built[1].shape  # every process steps the same shapes
    results = [_loss_and_grads(model, batch, config) for batch in built]
    assert abs(whole_loss) > 1e-4  # a step that moves something
    np.testing.assert_allclose(sum(loss for loss, _ in results), whole_loss, rtol=1e-5)
    scale = max(float(np.abs(g).max()) for g in whole_grads)
    for i, whole_grad in enumerate(whole_grads):
        np.testing.assert_allclose(results[0][1][i] + results[1][1][i], whole_grad,
                                   rtol=1e-4, atol=1e-6 * scale)
