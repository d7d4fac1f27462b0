"""Group advantages (docs/METHOD.md section 10 vectors) and their assignment to planners and workers."""
import numpy as np
import pytest

from matpo_jax.agents.trajectory import PLANNER, WORKER
from matpo_jax.rl import advantages, rewards


@pytest.mark.parametrize("group, expected", [
    ([1, 0, 0, 1], [0.866024, -0.866024, -0.866024, 0.866024]),
    ([1, 0, 0, 0, 0], [1.788850, -0.447213, -0.447213, -0.447213, -0.447213]),
    ([0.3, 0.3, 0.3], [0.0, 0.0, 0.0]),
])
def test_grpo_check_vectors(group, expected):
    np.testing.assert_allclose(advantages.group_advantages(group), expected, atol=1e-6)


def test_singleton_group_and_dr_grpo():
    # A group of one: mean 0, std 1, so the advantage is the reward itself (veRL semantics).
    np.testing.assert_allclose(advantages.group_advantages([0.7]), [0.7 / (1 + 1e-6)], rtol=1e-6)
    np.testing.assert_allclose(advantages.group_advantages([1, 0, 0, 1], norm_by_std=False),
                               [0.5, -0.5, -0.5, 0.5])
    with pytest.raises(ValueError):
        advantages.group_advantages([])


def test_workers_inherit_their_parents_scalar_advantage(rollout_batch):
    rollouts, golds = rollout_batch(seed=1, queries=3, group=4, max_workers=3)
    reward = rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds))
    adv = advantages.assign_advantages(rollouts, reward)
    planners = [r for r in rollouts if r.role == PLANNER]
    workers = [r for r in rollouts if r.role == WORKER]
    assert workers and set(adv) == {r.rollout_id for r in rollouts}
    for q in range(3):  # planners of a query: exactly the GRPO vector of their rewards
        group = [p for p in planners if p.query_index == q]
        expected = advantages.group_advantages([reward[p.rollout_id] for p in group])
        np.testing.assert_allclose([adv[p.rollout_id] for p in group], expected)
    for w in workers:
        assert adv[w.rollout_id] == adv[w.parent_id]


def test_role_grouping_forms_worker_groups_from_parent_rewards(rollout_batch):
    rollouts, golds = rollout_batch(seed=2, queries=2, group=4, max_workers=3)
    reward = rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds))
    by_planner = advantages.assign_advantages(rollouts, reward, group_by="planner")
    by_role = advantages.assign_advantages(rollouts, reward, group_by="role")
    for r in rollouts:
        if r.role == PLANNER:  # planner groups are unchanged
            assert by_role[r.rollout_id] == by_planner[r.rollout_id]
    for q in range(2):
        workers = [r for r in rollouts if r.role == WORKER and r.query_index == q]
        expected = advantages.group_advantages([reward[w.parent_id] for w in workers])
        np.testing.assert_allclose([by_role[w.rollout_id] for w in workers], expected)
    with pytest.raises(ValueError, match="group_by"):
        advantages.assign_advantages(rollouts, reward, group_by="query")


def test_missing_reward_is_an_error(rollout_batch):
    rollouts, _ = rollout_batch(seed=0, queries=1, group=2)
    with pytest.raises(KeyError, match="no reward"):
        advantages.assign_advantages(rollouts, {})


def test_token_advantages_cover_every_trainable_token():
    out = advantages.token_advantages(-0.5, [False, True, True, False, True])
    np.testing.assert_array_equal(out, [0, -0.5, -0.5, 0, -0.5])
