"""Fault injection, training side: a short run SIGKILLed at random points (5 seeds, one process
sequence), every rerun resuming, and the newest checkpoint then torn: the last rerun falls back to
the one before and the run ends with exactly the rows and parameters of an uninterrupted run."""
from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time

import numpy as np

import loop_worker
from test_loop import logged_rows

from fixtures.compile_cache import cache_env

STEPS, SEEDS = 20, range(5)
WORKER = os.path.abspath(loop_worker.__file__)
REPO = os.path.dirname(os.path.dirname(os.path.dirname(WORKER)))


def newest_checkpoint(workdir) -> int:
    directory = os.path.join(workdir, "checkpoints")
    steps = [int(n) for n in os.listdir(directory) if n.isdigit()] if os.path.isdir(directory) \
        else []
    return max(steps, default=0)


def test_kill_9_at_random_points_then_a_torn_checkpoint_end_like_an_uninterrupted_run(
        tmp_path, compilation_cache_dir):
    reference = loop_worker.run(str(tmp_path / "reference"), STEPS)
    workdir = str(tmp_path / "killed")
    env = dict(os.environ, PYTHONPATH=REPO, STEP_SLEEP="0.05", **cache_env(compilation_cache_dir))
    command = [sys.executable, WORKER, workdir, str(STEPS)]
    resumed_from = []
    for seed in SEEDS:
        rng = random.Random(seed)
        start = newest_checkpoint(workdir)
        log_path = tmp_path / f"run{seed}.log"
        with open(log_path, "w") as log:
            proc = subprocess.Popen(command, env=env, cwd=REPO, stdout=log, stderr=log)
            # A random point: one or two steps past where this run starts, then a random part
            # of a step (the batch, the update, an async save, a metrics write).
            target = start + rng.randint(1, 2)
            deadline = time.time() + 300
            while newest_checkpoint(workdir) < target and proc.poll() is None \
                    and time.time() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.1))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
        assert proc.returncode == -signal.SIGKILL, log_path.read_text()[-2000:]
        if start:
            resumed_from.append(start)
            assert f"tiny resumed at step {start}" in log_path.read_text()
    assert len(resumed_from) == len(SEEDS) - 1 and resumed_from == sorted(resumed_from)
    assert newest_checkpoint(workdir) < STEPS

    # Tear the newest checkpoint: the last rerun falls back to the one before it.
    newest = newest_checkpoint(workdir)
    torn_params = os.path.join(workdir, "checkpoints", str(newest), "params")
    for root, _, files in os.walk(torn_params):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "r+b") as f:
                f.truncate(os.path.getsize(path) // 2)
    final = subprocess.run(command, env=env, cwd=REPO, capture_output=True, text=True,
                           timeout=300)
    assert final.returncode == 0, final.stderr[-2000:]
    assert f"checkpoint {os.path.join(workdir, 'checkpoints', str(newest))} is unreadable" \
        in final.stderr
    assert f"tiny resumed at step {newest - 1}" in final.stderr

    with np.load(os.path.join(workdir, loop_worker.FINAL_PARAMS)) as saved:
        params = [saved[f"arr_{i}"] for i in range(len(saved.files))]
    expected = loop_worker.host_leaves(reference)
    assert len(params) == len(expected) > 0
    for a, b in zip(params, expected):
        np.testing.assert_array_equal(a.view(np.uint8), b.view(np.uint8))
    assert logged_rows(workdir) == logged_rows(tmp_path / "reference")
