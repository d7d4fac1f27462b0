"""Same seed, same machine, same numbers: a short whole job (world -> SFT -> eval -> MATPO RL ->
eval) run twice, the second time while two other processes saturate the CPU, logs the same
numbers and ends with bitwise-identical parameters. Only wall-clock fields may differ (listed in
WALL_CLOCK_FIELDS). docs/findings.md ("Same seed, same numbers") records what was measured."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import jax
import numpy as np
from test_end_to_end import _final_params as final_params, _train_command as train_command, shrink

from fixtures.compile_cache import cache_env

# Fields that measure time, not the run: every other logged number must match exactly.
WALL_CLOCK_FIELDS = frozenset({
    "time",  # the record's timestamp
    "time_update_s", "sft/time_update_s",  # the train step's duration
    "time_rollout_s", "time_batch_s",  # RL: rollouts, rewards + packing
    "rollout/wall_time_s", "rollout/rollouts_per_s",
})
# The CPU hogs: plain busy loops, one per core of this 2-core machine, bounded in time.
_BUSY_LOOP = "import time\nend = time.time() + {seconds}\nwhile time.time() < end: pass"


def _busy_processes(count: int, seconds: float) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", _BUSY_LOOP.format(seconds=seconds)])
            for _ in range(count)]


def _records(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _same(a, b) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and math.isnan(a)
                      and math.isnan(b))


def _differences(path_a: str, path_b: str) -> list[str]:
    """Every logged number, except the wall-clock fields, that is not the same in both files."""
    rows_a, rows_b = _records(path_a), _records(path_b)
    out = [] if len(rows_a) == len(rows_b) else [f"{len(rows_a)} vs {len(rows_b)} rows"]
    for a, b in zip(rows_a, rows_b):
        for key in sorted((set(a) | set(b)) - WALL_CLOCK_FIELDS):
            if not _same(a.get(key), b.get(key)):
                out.append(f"step {a.get('step')} {key}: {a.get(key)!r} vs {b.get(key)!r}")
    return out


def test_a_run_beside_cpu_hogs_logs_the_same_numbers_and_params(tmp_path, compilation_cache_dir):
    overrides = shrink(str(tmp_path / "tfds"), rl_steps=2)
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS="", **cache_env(compilation_cache_dir))
    quiet, loaded = str(tmp_path / "quiet"), str(tmp_path / "loaded")
    subprocess.run(train_command(quiet, overrides), check=True, env=env, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, timeout=600)
    hogs = _busy_processes(2, seconds=600)
    try:
        subprocess.run(train_command(loaded, overrides), check=True, env=env,
                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()

    for name in ("metrics.jsonl", os.path.join("sft", "metrics.jsonl")):
        assert not _differences(os.path.join(quiet, name), os.path.join(loaded, name)), name
    for tag in ("sft", "final"):  # evaluations, and the transcripts they decoded
        for name in (f"{tag}.json", f"{tag}_samples.txt"):
            with open(os.path.join(quiet, "eval", name)) as a, \
                    open(os.path.join(loaded, "eval", name)) as b:
                assert a.read() == b.read(), name
    step_a, params_a = final_params(quiet)
    step_b, params_b = final_params(loaded)
    assert step_a == step_b == 2
    leaves_a, leaves_b = jax.tree.leaves(params_a), jax.tree.leaves(params_b)
    assert len(leaves_a) == len(leaves_b) > 0
    for a, b in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
