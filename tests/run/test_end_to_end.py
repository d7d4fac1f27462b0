"""The whole job on a shrunken synthetic_tiny through the training command: world -> SFT -> eval ->
MATPO RL -> eval -> plots, and exact resume after the process is SIGKILLed in the middle of RL
(one straight run serves both: its outputs are checked, then a killed-and-rerun copy must end in
its parameters). The killed-and-rerun copy runs beside a process that saturates the CPU, so it
is also the determinism check (same seed, same machine, same numbers whatever the load): every
logged number but the wall-clock fields, both evaluations and their transcripts, and the final
parameters must be the straight run's (docs/findings.md, "Same seed, same numbers")."""
from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from matpo_jax.trainer import checkpoint as ckpt_lib
from matpo_jax.report import metrics as metrics_lib
from matpo_jax.run import provenance
from matpo_jax.run.eval import paired
from matpo_jax.config import load_config_file, read_saved_config, to_typed
from fixtures.xla import xla_flags

# Fields that measure time, not the run: every other logged number must match exactly.
WALL_CLOCK_FIELDS = frozenset({
    "time",  # the record's timestamp
    "time_update_s", "sft/time_update_s",  # the train step's duration
    "time_rollout_s", "time_batch_s",  # RL: rollouts, rewards + packing
    "rollout/wall_time_s", "rollout/rollouts_per_s",
})
# The CPU hog: a plain busy loop, bounded in time. Beside the run's own XLA threads it keeps more
# threads runnable than a 2-core machine has cores (a second one only slowed the other tests).
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


REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TINY = os.path.join(REPO, "configs", "synthetic_tiny.py")


def shrink(data_dir: str, rl_steps: int) -> str:
    """Overrides that make synthetic_tiny run in seconds (tiny model, world and budgets)."""
    return ",".join([
        "model.arch.hidden_size=32", "model.arch.intermediate_size=64",
        "model.arch.num_hidden_layers=1", "model.arch.num_attention_heads=2",
        "model.arch.num_key_value_heads=1", "model.arch.head_dim=16",
        "data.num_entities=60", "data.num_questions=240", "data.max_hops=2", "data.batch_size=2",
        f"data.data_dir={data_dir}",
        "rollout.group_size=2", "rollout.max_new_tokens_per_turn=24", "rollout.max_turns_planner=2",
        "rollout.max_turns_worker=2", "rollout.decode_slots=8",
        "sft.steps=4", "sft.num_demos=16", "sft.batch_size=2",  # step 4: a copy-rehearsal step
        f"train.steps={rl_steps}", "train.checkpoint_every=1", "train.eval_every=0",
        "train.async_checkpointing=false", "eval.num_questions=4",
    ])


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("tfds"))


def test_sft_only_run_is_the_shared_start_of_an_rl_run(tmp_path, data_dir):
    """train.steps=0 stops after SFT; sft.init_checkpoint starts RL from those params (the
    reproduction grid's shared starting point) without training SFT again."""
    from matpo_jax.run.experiment import run_experiment
    from matpo_jax.sampler.loop import _slot_loop as slot_loop

    base = shrink(data_dir, rl_steps=0) + ",sft.modes=matpo+single"
    start = str(tmp_path / "sft_only")
    summary = run_experiment(to_typed(load_config_file(TINY, base)), start)
    assert summary["sft_only"] and not os.path.exists(os.path.join(start, "eval"))
    shared = os.path.join(start, "checkpoints", "sft")
    # Every checkpoint records the run that wrote it (issue 48 item 2): its config.json and the
    # hash of its tokenizer, which export and evaluate check what they pair it with against.
    identity = provenance.read_identity(shared, 4)
    assert identity["config"] == read_saved_config(start)
    assert identity["config_sha256"] == provenance.config_sha256(read_saved_config(start))
    overrides = f"{shrink(data_dir, rl_steps=1)},rollout.mode=single,sft.init_checkpoint={shared}"
    run = str(tmp_path / "rl")
    # The SFT start's evaluation (greedy, one sample), the rollouts (sampled, G=2, one prefix
    # per question) and the final evaluation run one compiled sampler loop: a loop with host
    # callbacks is compiled again by every process (the persistent cache does not keep it).
    slot_loop._clear_cache()
    summary = run_experiment(to_typed(load_config_file(TINY, overrides)), run)
    assert slot_loop._cache_size() == 1
    assert summary["mode"] == "single" and summary["final_eval"]["eval/questions"] == 4
    assert not os.path.exists(os.path.join(run, "checkpoints", "sft"))  # no SFT of its own
    rl_identity = provenance.read_identity(os.path.join(run, "checkpoints", "rl"), 1)
    assert rl_identity["tokenizer_sha256"] == identity["tokenizer_sha256"]  # the same world
    assert rl_identity["config"]["rollout"]["mode"] == "single"
    assert not metrics_lib.load_metrics(os.path.join(run, "sft", "metrics.jsonl"))  # no SFT step

    # The finished run extended by one step evaluates its new parameters (it once re-logged the
    # step-1 eval/final.json as step 2's); rerunning the finished extension evaluates nothing.
    final = os.path.join(run, "eval", "final.json")
    before = os.stat(final).st_mtime_ns
    longer = to_typed(load_config_file(TINY, overrides.replace("train.steps=1", "train.steps=2")))
    summary = run_experiment(longer, run, allow_config_change="train.steps")
    extended = os.stat(final).st_mtime_ns
    assert extended > before and summary["rl_steps"] == 2
    finals = [r["step"] for r in metrics_lib.read_records(os.path.join(run, "metrics.jsonl"))
              if "eval/accuracy" in r]
    assert finals == [0, 1, 2]
    run_experiment(longer, run)
    assert os.stat(final).st_mtime_ns == extended


def _train_command(workdir: str, overrides: str) -> list[str]:
    return [sys.executable, "-m", "matpo_jax.train", f"--config={TINY}:{overrides}",
            f"--workdir={workdir}"]


def _final_params(workdir: str):
    """The newest RL checkpoint's parameters, read back without a target tree."""
    directory = os.path.join(workdir, "checkpoints", "rl")
    with ckpt_lib.Checkpointer(directory) as c:
        step = c.latest_step()
    return step, ocp.StandardCheckpointer().restore(os.path.join(directory, str(step), "params"))


def _consumed(workdir: str) -> dict[int, list[str]]:
    out = {}
    with open(os.path.join(workdir, "consumed.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            out[record["step"]] = record["ids"]  # a redone step overwrites the killed run's
    return out


def _curve(workdir: str) -> list[tuple[int, float, float]]:
    """(step, curve/questions, curve/accuracy) of every row of the validation curve, as logged."""
    return [(r["step"], r["curve/questions"], r["curve/accuracy"])
            for r in metrics_lib.read_records(os.path.join(workdir, "metrics.jsonl"))
            if "curve/accuracy" in r]


def _logged_twice(workdir: str) -> list[tuple[int, str]]:
    """(step, metric) pairs written in more than one row (a resumed run must not repeat one)."""
    seen, twice = set(), []
    for record in metrics_lib.read_records(os.path.join(workdir, "metrics.jsonl")):
        for key in set(record) - {"step", "time"}:
            if (record["step"], key) in seen:
                twice.append((record["step"], key))
            seen.add((record["step"], key))
    return twice


def _check_whole_job(workdir: str, rl_steps: int) -> None:
    """What a finished run leaves: RL and SFT metrics per step, both evaluations with their
    samples, the validation curve at step 0, every train.eval_every steps and at the end, the
    figures, the last RL checkpoint."""
    cfg = read_saved_config(workdir)  # the config the run recorded
    records = metrics_lib.load_metrics(os.path.join(workdir, "metrics.jsonl"))
    rl_steps_logged = [r for r in records if "loss" in r]
    assert [r["step"] for r in rl_steps_logged] == list(range(1, rl_steps + 1))
    for r in rl_steps_logged:
        assert np.isfinite(r["loss"]) and r["reward/mean"] >= 0.0
        assert r["rollouts/planner"] == cfg["data"]["batch_size"] * cfg["rollout"]["group_size"]
        assert 0.0 < r["packing_efficiency"] <= 1.0
    # sft.copy_every=4 (the config's): step 4 trained on a copy-rehearsal batch, not logged as SFT
    assert cfg["sft"]["copy_every"] == 4
    sft_records = metrics_lib.load_metrics(os.path.join(workdir, "sft", "metrics.jsonl"))
    assert [r["step"] for r in sft_records] == [1, 2, 3]
    with open(os.path.join(workdir, "summary.json")) as f:
        summary = json.load(f)
    for tag in ("sft", "final"):
        assert summary[f"{tag}_eval"]["eval/questions"] == 4
        assert os.path.exists(os.path.join(workdir, "eval", f"{tag}_samples.txt"))
    # Each evaluation's outcome per question: the question-by-question comparison of the two
    # reads the accuracies the summary logged.
    questions = {tag: os.path.join(workdir, "eval", f"{tag}_questions.jsonl")
                 for tag in ("sft", "final")}
    gains = paired.compare(questions["sft"], questions["final"], by="hops")
    assert gains["all"].questions == 4
    assert gains["all"].before == pytest.approx(summary["sft_eval"]["eval/accuracy"])
    assert gains["all"].after == pytest.approx(summary["final_eval"]["eval/accuracy"])
    for key in (k for k in summary["final_eval"] if k.startswith("eval/accuracy_hop")):
        assert gains[f"hops={key[-1]}"].after == pytest.approx(summary["final_eval"][key])
    every, curve = cfg["train"]["eval_every"], cfg["eval"]["curve_questions"]
    assert [(step, questions) for step, questions, _ in _curve(workdir)] == [
        (step, curve) for step in [0, *range(every, rl_steps, every), rl_steps]]
    assert [r["step"] for r in records if "eval/questions" in r] == [0, rl_steps]  # full ones
    assert _logged_twice(workdir) == []
    for figure in ("overview", "rollouts", "optimisation", "sft"):
        assert os.path.exists(os.path.join(workdir, "plots", f"{figure}.png")), figure
    with ckpt_lib.Checkpointer(os.path.join(workdir, "checkpoints", "rl")) as c:
        assert c.latest_step() == rl_steps


def test_whole_job_then_sigkill_mid_rl_and_rerun_gives_bitwise_identical_params(tmp_path,
                                                                                 data_dir):
    steps, kill_after = 5, 2
    # The validation curve on 2 of the 4 evaluation questions, at steps 2 and 4 (0 and 5 from
    # the full evaluations): the killed run evaluated step 2 before it died.
    overrides = shrink(data_dir, rl_steps=steps) + ",train.eval_every=2,eval.curve_questions=2"
    # The session's compilation cache (inherited): the killed and the resumed run load what the
    # straight run compiled (the same executables, so the comparison stays bitwise).
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags())
    straight, resumed = str(tmp_path / "straight"), str(tmp_path / "resumed")
    subprocess.run(_train_command(straight, overrides), check=True, env=env, cwd=REPO,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
    _check_whole_job(straight, steps)

    hogs = _busy_processes(1, seconds=600)  # the rest of the test runs on a saturated CPU
    try:
        _kill_mid_rl_and_rerun(resumed, overrides, env, kill_after)
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    for name in ("metrics.jsonl", os.path.join("sft", "metrics.jsonl")):
        assert not _differences(os.path.join(straight, name), os.path.join(resumed, name)), name
    for tag in ("sft", "final"):  # evaluations, and the transcripts they decoded
        for name in (f"{tag}.json", f"{tag}_samples.txt", f"{tag}_questions.jsonl"):
            with open(os.path.join(straight, "eval", name)) as a, \
                    open(os.path.join(resumed, "eval", name)) as b:
                assert a.read() == b.read(), name
    step_a, params_a = _final_params(straight)
    step_b, params_b = _final_params(resumed)
    assert step_a == step_b == steps
    leaves_a, leaves_b = jax.tree.leaves(params_a), jax.tree.leaves(params_b)
    assert len(leaves_a) == len(leaves_b) > 0
    for a, b in zip(leaves_a, leaves_b):
        np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    assert _consumed(straight) == _consumed(resumed)
    assert _curve(resumed) == _curve(straight) and _logged_twice(resumed) == []
    assert sorted(_consumed(straight)) == list(range(1, steps + 1))


def _kill_mid_rl_and_rerun(resumed: str, overrides: str, env: dict, kill_after: int) -> None:
    proc = subprocess.Popen(_train_command(resumed, overrides), env=env, cwd=REPO,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    marker = os.path.join(resumed, "checkpoints", "rl", str(kill_after))
    deadline = time.time() + 600
    while not os.path.isdir(marker) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run finished before it could be killed"
    assert not os.path.exists(os.path.join(resumed, "summary.json"))

    subprocess.run(_train_command(resumed, overrides), check=True, env=env, cwd=REPO,
                   stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, timeout=600)
