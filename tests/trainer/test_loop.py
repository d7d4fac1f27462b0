"""The one training loop: a resumed run logs exactly the rows and ends with exactly the state of
an uninterrupted one (counters, skipped updates, RNG, data position, params); non-finite steps are
skipped, counted and stop the run naming the step and the last good checkpoint."""
from __future__ import annotations

import json
import math
import os

import jax
import numpy as np
import pytest

import loop_worker
from matpo_jax.report.metrics import read_records
from matpo_jax.trainer import checkpoint as ckpt_lib
from matpo_jax.trainer import loop as loop_lib

STEPS = 6
TIMING = ("time", "time_update_s")  # wall-clock keys: the only ones allowed to differ


class Interrupted(Exception):
    pass


@pytest.fixture(autouse=True)
def _compile_once(compilation_cache_dir):
    """Every test here builds the same tiny phase several times; it compiles once."""


def logged_rows(workdir) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in TIMING}
            for r in read_records(os.path.join(workdir, "metrics.jsonl"))]


def assert_same_state(a, b):
    for name in loop_lib.COUNTER_FIELDS:
        np.testing.assert_array_equal(np.asarray(getattr(a, name)), np.asarray(getattr(b, name)),
                                      err_msg=name)
    for x, y in zip(loop_worker.host_leaves(a), loop_worker.host_leaves(b), strict=True):
        np.testing.assert_array_equal(x.view(np.uint8), y.view(np.uint8))


def test_resumed_run_logs_the_rows_and_ends_in_the_state_of_an_uninterrupted_one(tmp_path):
    straight = loop_worker.run(str(tmp_path / "straight"), STEPS, nan_steps={1})

    workdir = str(tmp_path / "resumed")
    loop, batch_fn, data = loop_worker.build(workdir, STEPS, nan_steps={1})

    def stops_at_step_4(step, state):
        if step == 3:
            raise Interrupted  # as if killed after step 3 was saved
        return batch_fn(step, state)

    from matpo_jax.report.metrics import MetricsWriter
    with MetricsWriter(workdir, tensorboard=False) as writer, pytest.raises(Interrupted):
        loop.run(stops_at_step_4, writer=writer, data=data)
    # A row of the interrupted step that never reached a checkpoint must not survive the resume.
    with open(os.path.join(workdir, "metrics.jsonl"), "a") as f:
        f.write(json.dumps({"step": 4, "loss": 123.0}) + "\n")
    resumed = loop_worker.run(workdir, STEPS, nan_steps={1})

    rows = logged_rows(workdir)
    assert rows == logged_rows(tmp_path / "straight")
    assert [r["step"] for r in rows] == list(range(1, STEPS + 1))
    # The counters the rows carry are the whole run's, across the resume.
    assert [r["skipped_updates_total"] for r in rows] == [0, 1, 1, 1, 1, 1]
    assert [r["optimizer_steps"] for r in rows] == [1, 1, 2, 3, 4, 5]
    assert [r["data_seed"] for r in rows] == [1001 + s for s in range(STEPS)]
    assert rows[1]["nonfinite_streak"] == 1 and rows[2]["nonfinite_streak"] == 0
    assert int(resumed.step) == STEPS and int(resumed.skipped_steps) == 1
    assert_same_state(resumed, straight)


def test_non_finite_steps_are_skipped_then_stop_the_run_naming_the_last_good_checkpoint(tmp_path):
    workdir = str(tmp_path / "nan")
    with pytest.raises(loop_lib.NonFiniteTraining) as stop:
        loop_worker.run(workdir, STEPS, nan_steps={2, 3, 4}, max_nonfinite_steps=2)
    last_good = os.path.join(workdir, "checkpoints", "3")
    assert "tiny step 4: 2 consecutive steps" in str(stop.value)
    assert str(stop.value).endswith(f"the last good checkpoint is {last_good}")
    rows = logged_rows(workdir)
    assert [r["skipped_updates"] for r in rows] == [0, 0, 1, 1]
    assert math.isnan(rows[-1]["loss"])

    # An infinite learning rate: every update would make the parameters non-finite, so none is
    # applied, and the only checkpoint holds the finite initial parameters.
    workdir = str(tmp_path / "inf_lr")
    loop, _, _ = loop_worker.build(workdir, STEPS)
    initial = loop_worker.host_leaves(loop.state)
    with pytest.raises(loop_lib.NonFiniteTraining, match="tiny step 2: 2 consecutive"):
        loop_worker.run(workdir, STEPS, learning_rate=float("inf"), max_nonfinite_steps=2)
    with ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints")) as c:
        assert c.all_steps() == [1]
        restored = c.restore_latest(loop.state.params)
    for a, b in zip(jax.tree.leaves(restored.params), initial, strict=True):
        np.testing.assert_array_equal(np.asarray(a), b)
