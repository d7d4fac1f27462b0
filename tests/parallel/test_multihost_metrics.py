"""How per-process RL metrics combine into the global ones process 0 logs."""
import math

import pytest

from matpo_jax.parallel.multihost import combine_metrics


def test_counts_sum_extremes_stay_extremes_ratios_come_from_the_summed_counts():
    parts = [
        {"reward/mean": 0.2, "rollouts/planner": 4.0, "trained_tokens": 30.0,
         "trained_sequences": 1.0, "sequences": 6.0, "trained_sequence_frac": 1 / 6,
         "response_tokens_min/worker": 3.0, "response_tokens_max/worker": 9.0,
         "time_rollout_s": 2.0, "reward/format_worker": float("nan")},
        {"reward/mean": 0.6, "rollouts/planner": 4.0, "trained_tokens": 10.0,
         "trained_sequences": 3.0, "sequences": 4.0, "trained_sequence_frac": 3 / 4,
         "response_tokens_min/worker": 1.0, "response_tokens_max/worker": 5.0,
         "time_rollout_s": 5.0, "reward/format_worker": 0.5},
    ]
    out = combine_metrics(parts)
    # Every process holds the same number of planners: the mean of means is the global mean.
    assert out["reward/mean"] == pytest.approx(0.4)
    assert out["rollouts/planner"] == 8.0 and out["trained_tokens"] == 40.0
    assert out["trained_sequence_frac"] == pytest.approx(4 / 10)  # not the mean of 1/6 and 3/4
    assert out["response_tokens_min/worker"] == 1.0 and out["response_tokens_max/worker"] == 9.0
    assert out["time_rollout_s"] == 5.0
    assert out["reward/format_worker"] == 0.5  # a process without workers reports nan


def test_one_process_is_unchanged():
    part = {"reward/mean": 0.3, "rollouts/planner": 2.0, "x": math.pi}
    assert combine_metrics([part]) == part
