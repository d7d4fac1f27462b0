"""Dr. MAS per-agent advantage normalisation, rl.group_by="agent" (docs/METHOD.md section 4.5),
against hand-computed vectors, and where it differs from the AT-GRPO-style "role" grouping."""
import numpy as np
import pytest

from matpo_jax.agents.trajectory import PLANNER, WORKER, Rollout
from matpo_jax.rl import advantages, rewards

EPS = advantages.STD_EPS


def _batch(workers_per_planner):
    """One question, G planners with the given worker counts (rewards set by the test)."""
    rollouts, next_id = [], len(workers_per_planner)
    for g, count in enumerate(workers_per_planner):
        planner = Rollout(rollout_id=g, role=PLANNER, query_index=0, sample_index=g,
                          parent_id=None)
        rollouts.append(planner)
        for _ in range(count):
            rollouts.append(Rollout(rollout_id=next_id, role=WORKER, query_index=0,
                                    sample_index=g, parent_id=g))
            planner.child_ids.append(next_id)
            next_id += 1
    return rollouts


def test_agent_check_vector_differs_from_role():
    # Planner rewards 1.0 / 0.0 / 0.5; planner 0 spawned two workers, planner 1 one, planner 2 none.
    rollouts = _batch([2, 1, 0])
    reward = {0: 1.0, 1: 0.0, 2: 0.5}
    agent = advantages.assign_advantages(rollouts, reward, group_by="agent")
    role = advantages.assign_advantages(rollouts, reward, group_by="role")
    # Planners (both modes, section 4.1): mean 0.5, unbiased std 0.5.
    planners = [0.5 / (0.5 + EPS), -0.5 / (0.5 + EPS), 0.0]
    np.testing.assert_allclose([agent[i] for i in range(3)], planners, rtol=1e-6)
    np.testing.assert_allclose([role[i] for i in range(3)], planners, rtol=1e-6)
    # agent: worker statistics over the delegating planners once each, rewards {1.0, 0.0}:
    # mean 0.5, std sqrt(0.5) -> +-0.5 / 0.707107.
    a = 0.5 / (np.sqrt(0.5) + EPS)
    np.testing.assert_allclose([agent[i] for i in (3, 4, 5)], [a, a, -a], rtol=1e-6)
    # role: one entry per worker rollout, rewards {1.0, 1.0, 0.0}: mean 2/3, std sqrt(1/3)
    # -> (1/3) / 0.577350 = 0.577350 and -(2/3) / 0.577350 = -1.154701.
    s = np.sqrt(1 / 3) + EPS
    np.testing.assert_allclose([role[i] for i in (3, 4, 5)], [1 / 3 / s, 1 / 3 / s, -2 / 3 / s],
                               rtol=1e-6)
    assert not np.isclose(agent[3], role[3])


def test_agent_equals_role_when_every_delegating_planner_spawns_alike(rollout_batch):
    # With max_workers=1 a planner spawns 0 or 1 worker: one entry per delegating planner is one
    # entry per worker, so the two rules coincide.
    rollouts, golds = rollout_batch(seed=3, queries=3, group=4, max_workers=1)
    reward = rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds))
    assert any(r.role == WORKER for r in rollouts)
    assert (advantages.assign_advantages(rollouts, reward, group_by="agent")
            == advantages.assign_advantages(rollouts, reward, group_by="role"))


def test_agent_worker_group_of_one_and_dr_grpo():
    rollouts = _batch([3, 0, 0])  # one delegating planner: its worker group has one entry
    reward = {0: 0.7, 1: 0.0, 2: 0.2}
    agent = advantages.assign_advantages(rollouts, reward, group_by="agent")
    np.testing.assert_allclose([agent[i] for i in (3, 4, 5)], [0.7 / (1 + EPS)] * 3, rtol=1e-6)
    rollouts = _batch([1, 2])
    reward = {0: 1.0, 1: 0.0}
    centred = advantages.assign_advantages(rollouts, reward, group_by="agent", norm_by_std=False)
    np.testing.assert_allclose([centred[i] for i in (2, 3, 4)], [0.5, -0.5, -0.5])


@pytest.mark.parametrize("value", advantages.GROUP_BY)
def test_every_group_by_value_is_accepted(value, rollout_batch):
    rollouts, golds = rollout_batch(seed=0, queries=1, group=2)
    reward = rewards.rewards_by_id(rewards.rollout_rewards(rollouts, golds))
    assert set(advantages.assign_advantages(rollouts, reward, group_by=value)) == {
        r.rollout_id for r in rollouts}
