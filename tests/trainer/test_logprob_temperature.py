"""Old log-probs (recorded by the real sampler at T = 0.7) and the train step's log-probs agree
before any update: the importance ratio is 1 on every sampled token when the step takes its
log-probs at the rollout temperature, and it is not when it takes them at 1."""
import jax
import numpy as np
import optax
import pytest
from flax import nnx

from matpo_jax import parallel
from matpo_jax.agents.trajectory import PLANNER, Rollout
from matpo_jax.sampler.loop import Sampling, generate
from matpo_jax.rl.batch import sequences_from_rollouts
from matpo_jax.trainer import logprobs, packing
from matpo_jax.trainer import step as ts
from fixtures.losses import default_loss

TEMPERATURE = 0.7
PROMPTS = [[5, 9, 2], [17, 3, 3, 40, 8], [60], [11, 12, 13, 14]]


@pytest.fixture(scope="module")
def sampled_batch(tiny_model):
    graphdef, state = nnx.split(tiny_model)
    sampling = Sampling(temperature=TEMPERATURE, max_turn_tokens=12)
    tokens, old_logprobs = generate(state, graphdef, PROMPTS, 12, sampling, (),
                                    jax.random.key(3), max_len=32)
    rollouts = []
    for i, (prompt, sampled, logp) in enumerate(zip(PROMPTS, tokens, old_logprobs)):
        rollout = Rollout(rollout_id=i, role=PLANNER, query_index=i, sample_index=0,
                          parent_id=None)
        rollout.append(prompt, trainable=False)
        rollout.append(sampled, trainable=True, logprobs=logp)
        rollouts.append(rollout)
    advantages = {i: (1.0 if i % 2 else -1.0) for i in range(len(PROMPTS))}
    seqs = sequences_from_rollouts(rollouts, advantages)
    return packing.pack_sequences(seqs, 32, rows=2, loss_config=default_loss())


def test_ratio_is_one_at_the_rollout_temperature(tiny_model, sampled_batch):
    batch = sampled_batch
    mask = batch.loss_mask > 0
    assert mask.sum() == 12 * len(PROMPTS)  # every sampled token is scored

    current = jax.jit(lambda b: logprobs.score_tokens(
        tiny_model, b.tokens, b.positions, b.segment_ids, temperature=TEMPERATURE)[0])(batch)
    log_ratio = np.asarray(current)[mask] - batch.old_logprobs[mask]
    assert np.abs(log_ratio).max() < 2e-5

    # Through the train step: with the temperature wired in, no token is clipped and the
    # approximate KL to the behaviour policy is 0.
    mesh = parallel.make_mesh(devices=jax.devices()[:1])
    graphdef, state, shardings = ts.init_train_state(tiny_model, optax.sgd(0.1), mesh)
    for temperature, consistent in ((TEMPERATURE, True), (1.0, False)):
        config = ts.TrainStepConfig(temperature=temperature, loss=default_loss())
        _, _, metrics = ts.make_gradient_fn(graphdef, config, mesh, shardings)(state, batch)
        kl = float(metrics["planner/approx_kl"])
        assert (kl < 1e-9) if consistent else (kl > 1e-4), (temperature, kl)
