"""The MATPO step on the host (rl.batch.matpo_batch), checked token by token against values worked
out by hand for five rollouts: group advantages per planner, the planner's A_i on every trained
token of its workers, role ids, aggregation weights over the whole batch, inert groups left out."""
import math

import numpy as np
import pytest

from matpo_jax.agents.trajectory import PLANNER, WORKER, Rollout
from matpo_jax.rl.batch import matpo_batch
from matpo_jax.trainer.packing import bucket_rows
from fixtures.losses import default_loss


def rollout(rid, role, query, sample, parent, pieces):
    """pieces: (length, trainable); sampled tokens get log-probs -(rid + 1) / 10."""
    r = Rollout(rid, role, query, sample, parent)
    for length, trainable in pieces:
        r.append(range(10 * rid + 1, 10 * rid + 1 + length), trainable=trainable,
                 logprobs=[-(rid + 1) / 10] * length if trainable else None)
    return r


@pytest.fixture
def scored():
    rollouts = [
        rollout(0, PLANNER, 0, 0, None, [(3, False), (4, True), (2, False), (3, True)]),  # 7 trained
        rollout(1, PLANNER, 0, 1, None, [(3, False), (2, True)]),  # 2 trained
        rollout(2, WORKER, 0, 0, 0, [(2, False), (5, True)]),  # planner 0's worker: 5 trained
        rollout(3, PLANNER, 1, 0, None, [(3, False), (3, True)]),  # query 1: both score 0.5
        rollout(4, PLANNER, 1, 1, None, [(3, False), (1, True)]),
    ]
    rollouts[0].child_ids = [2]
    rewards = {0: 1.0, 1: 0.0, 3: 0.5, 4: 0.5}
    return rollouts, rewards


def token_values(batch, field, rid):
    """The field's values on rollout `rid`'s loss tokens, and on its other tokens."""
    mine = np.asarray(batch.rollout_ids) == rid
    loss = mine & (np.asarray(batch.loss_mask) > 0)
    values = np.asarray(getattr(batch, field))
    return values[loss], values[mine & ~loss]


def test_matpo_batch_by_hand(scored):
    rollouts, rewards = scored
    out = matpo_batch(rollouts, rewards, loss_config=default_loss(loss_agg="matpo"),
                      pack_len=16, min_rows=1, row_multiple=2)
    # Query 0's planners scored 1 and 0: mean 0.5, unbiased std sqrt(0.5); query 1's alike: 0.
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert out.advantages == pytest.approx({0: a, 1: -a, 2: a, 3: 0.0, 4: 0.0})
    batch = out.batch
    # Rollouts 3 and 4 carry no gradient and are left out; 12 + 7 + 5 tokens fill two rows of 16.
    assert sorted(set(batch.rollout_ids[batch.rollout_ids >= 0].tolist())) == [0, 1, 2]
    assert batch.shape == (2, 16)
    # matpo: 1 / (G * N_i), G = 4 planners, N_i = tokens of planner i and its workers.
    expected = {0: (a, 0, 1 / (4 * 12), 7), 1: (-a, 0, 1 / (4 * 2), 2),
                2: (a, 1, 1 / (4 * 12), 5)}
    for rid, (advantage, role, weight, trained) in expected.items():
        adv, adv_rest = token_values(batch, "advantages", rid)
        assert len(adv) == trained
        np.testing.assert_allclose(adv, advantage, rtol=1e-6)
        assert not adv_rest.any()  # the prompt and tool-result tokens carry nothing
        roles, other_roles = token_values(batch, "role_ids", rid)
        assert (roles == role).all() and (other_roles == role).all()
        weights, _ = token_values(batch, "loss_weights", rid)
        np.testing.assert_allclose(weights, weight, rtol=1e-6)
        old, _ = token_values(batch, "old_logprobs", rid)
        np.testing.assert_allclose(old, -(rid + 1) / 10, rtol=1e-6)
    assert out.metrics == pytest.approx({"trained_sequence_frac": 3 / 5, "packed_rows": 2,
                                         "packing_efficiency": 24 / 32, "trained_sequences": 3,
                                         "sequences": 5, "trained_tokens": 14})


@pytest.mark.parametrize("aggregation", ["token-mean", "matpo", "seq-mean-token-mean",
                                         "seq-mean-token-sum"])
def test_parts_of_a_batch_with_gathered_totals_weigh_as_the_whole(scored, aggregation):
    """Two processes, each with whole groups: with `gather` supplying both parts' totals, every
    token's weight is its weight in the one-process batch, and both parts pack the same rows."""
    rollouts, rewards = scored
    config = default_loss(loss_agg=aggregation)
    whole = matpo_batch(rollouts, rewards, loss_config=config, pack_len=16)
    parts = [[r for r in rollouts if r.query_index == q] for q in (0, 1)]
    part_rewards = [{r.rollout_id: rewards[r.rollout_id] for r in part if r.rollout_id in rewards}
                    for part in parts]
    # Pass 1 records each part's values (a collective's inputs); pass 2 gives every part all of
    # them, stacked in process order, as multihost.allgather does.
    inputs = []
    for part, part_reward in zip(parts, part_rewards):
        matpo_batch(part, part_reward, loss_config=config, pack_len=16,
                    gather=lambda v: inputs.append(np.asarray(v)) or np.asarray(v)[None])
    gathered = np.stack(inputs)
    built = [matpo_batch(part, part_reward, loss_config=config, pack_len=16,
                         gather=lambda v: gathered)
             for part, part_reward in zip(parts, part_rewards)]
    assert built[0].batch.shape[0] == built[1].batch.shape[0]
    whole_weights = {}
    for rid in range(len(rollouts)):
        weights, _ = token_values(whole.batch, "loss_weights", rid)
        whole_weights[rid] = weights
    for part, out in zip(parts, built):
        for r in part:
            weights, _ = token_values(out.batch, "loss_weights", r.rollout_id)
            if whole_weights[r.rollout_id].size == 0:  # a part keeps one inert sequence
                advantages, _ = token_values(out.batch, "advantages", r.rollout_id)
                assert not advantages.any()
                continue
            np.testing.assert_allclose(weights, whole_weights[r.rollout_id], rtol=1e-6)
    assert sum(out.metrics["trained_tokens"] for out in built) == whole.metrics["trained_tokens"]


def test_weights_count_the_whole_batch_and_rows_are_bucketed(scored):
    rollouts, rewards = scored
    # token-mean: 1 / all 18 trained tokens, the left-out groups' tokens included.
    out = matpo_batch(rollouts, rewards, loss_config=default_loss(), pack_len=16, min_rows=4,
                      row_multiple=2)
    weights = out.batch.loss_weights[out.batch.loss_mask > 0]
    np.testing.assert_allclose(weights, 1 / 18, rtol=1e-6)
    assert out.batch.shape == (4, 16)  # min_rows
    # Rows: powers of two from the minimum, rounded to the multiple.
    assert [bucket_rows(n, 4, 2) for n in (1, 4, 5, 9)] == [4, 4, 8, 16]
    assert bucket_rows(3, 1, 6) == 6
    # A KL term gives every sequence a gradient: nothing is left out.
    out = matpo_batch(rollouts, rewards, loss_config=default_loss(kl_coef=0.1), pack_len=16)
    assert sorted(set(out.batch.rollout_ids[out.batch.rollout_ids >= 0].tolist())) == [0, 1, 2,
                                                                                        3, 4]
