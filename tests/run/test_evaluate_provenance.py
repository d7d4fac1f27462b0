"""Issue 48 items 1, 2, 6, 7: an evaluation's results carry what produced them and a resume checks
it; a checkpoint is never read with another tokenizer than its run's; a corrupt middle line of
results.jsonl is named, never cut; evaluate holds the workdir lock. Real Orbax checkpoints, real
trained tokenizers, the real evaluator over the fixture benchmark (FRAMES, exact match)."""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import jax
import pytest
from flax import nnx

from matpo_jax.chat import ChatFormat
from matpo_jax.chat.tokenizer_training import train_tokenizer
from matpo_jax.config import ConfigError, load_config_file, to_typed
from matpo_jax.run import provenance
from matpo_jax.run.eval import job as eval_job
from matpo_jax.run.eval.benchmark import evaluate_dataset
from matpo_jax.run.eval.grading import Grader
from matpo_jax.run.eval.results import RESULTS_FILE, ResultsError
from matpo_jax.run.runtime import build_model, make_mesh
from matpo_jax.run.workdir_lock import WorkdirInUse
from matpo_jax.trainer import checkpoint as ckpt_lib

from test_evaluate_cli import BASE, overrides  # the tiny model and short rollouts
from test_benchmark_eval import QUESTIONS, ScriptedPolicy

REPO = Path(__file__).resolve().parents[2]
HOLD = ("import sys, time\nfrom matpo_jax.run.workdir_lock import workdir_lock\n"
        "with workdir_lock(sys.argv[1]):\n    print('locked', flush=True)\n    time.sleep(600)\n")


def config(tokenizer_dir, tmp_path, **extra):
    # exact match: no judge; the judge URL is never called
    items = overrides(tokenizer_dir, tmp_path / "tfds", "http://127.0.0.1:9") + [
        "reward.method=exact"] + [f"{k}={v}" for k, v in extra.items()]
    return to_typed(load_config_file(BASE, ",".join(items)), jax.device_count())


def save_run_checkpoints(run: Path, cfg, steps=(3, 5)) -> None:
    """A run's RL checkpoints as the training loop writes them: parameters and, in the meta
    item, the run's identity (its config and tokenizer; runtime.loop_config)."""
    chat = ChatFormat.from_pretrained(cfg.model.tokenizer)
    identity = {provenance.IDENTITY_KEY: provenance.checkpoint_identity(cfg, chat)}
    _, start, _ = nnx.split(build_model(cfg, make_mesh(cfg)), nnx.Param, ...)
    with ckpt_lib.Checkpointer(run / "checkpoints" / "rl", async_save=False) as c:
        for step in steps:
            params = jax.tree.map(lambda p, s=step: p + 0.01 * s, start)  # each step its own
            c.save(step, params=params, opt_state={"count": jax.numpy.zeros(())},
                   metadata=identity, force=True)


@pytest.fixture
def options(corpus_path):
    """FRAMES' first 2 questions, one sample, exact match; the search service over the small
    fixture corpus."""
    def make(out, checkpoint, **extra) -> eval_job.BenchmarkOptions:
        return eval_job.BenchmarkOptions(
            datasets=["frames"], workdir=str(out), checkpoint=checkpoint, samples=1,
            grader="exact", num_questions=2, corpus=str(corpus_path), **extra)
    return make


def test_results_of_another_checkpoint_are_never_reused(tokenizer_dir, tmp_path, options):
    """Item 1: evaluate step 3, then step 5, into one --workdir: the second used to report "2 of
    2 questions already evaluated" with the first checkpoint's answers under its own header."""
    cfg = config(tokenizer_dir, tmp_path)
    run = tmp_path / "run"
    save_run_checkpoints(run, cfg)
    out = tmp_path / "bench"
    manager = run / "checkpoints" / "rl"
    eval_job.run_benchmarks(cfg, options(out, str(manager / "3")))
    lines = (out / "frames" / RESULTS_FILE).read_text().splitlines()
    source = json.loads(lines[0])["source"]
    assert source["checkpoint"] == str(manager) and source["step"] == 3
    assert source["tokenizer_sha256"] == provenance.read_identity(manager, 3)["tokenizer_sha256"]
    before = (out / "frames" / RESULTS_FILE).read_bytes()
    with pytest.raises(ResultsError, match=r"results.jsonl:1: question 'frames-0' was evaluated "
                                           r"with step = 3, this evaluation has 5") as refused:
        eval_job.run_benchmarks(cfg, options(out, str(run)))  # the run: its newest step, 5
    assert "\n" not in str(refused.value)
    assert (out / "frames" / RESULTS_FILE).read_bytes() == before
    assert "(step 3)" in (out / "report.md").read_text()  # the report still names its source
    # Another temperature is another evaluation too; the same command resumes as before.
    with pytest.raises(ResultsError, match="temperature"):
        eval_job.run_benchmarks(cfg, options(out, str(manager / "3"), temperature=0.7))
    eval_job.run_benchmarks(cfg, options(out, str(manager / "3")))
    assert (out / "frames" / RESULTS_FILE).read_bytes() == before


def test_a_checkpoint_is_never_read_with_another_runs_tokenizer(tokenizer_dir, tmp_path,
                                                              options):
    """Item 2: a checkpoint evaluated with a config whose tokenizer is not its run's (other ids
    for the same text) used to exit 0; now one line names both hashes and the field."""
    cfg = config(tokenizer_dir, tmp_path)
    run = tmp_path / "run"
    save_run_checkpoints(run, cfg, steps=(3,))
    other = tmp_path / "other_tokenizer"
    train_tokenizer(["Zebra quartz vexes jumpy foxes near the old mill."] * 40 +
                    ["<think>x</think> \\boxed{y}"] * 5, vocab_size=512, out_dir=other)
    elsewhere = config(tokenizer_dir, tmp_path, **{"model.tokenizer": other})
    out = tmp_path / "bench"
    with pytest.raises(provenance.ArtifactMismatch) as refused:
        eval_job.run_benchmarks(elsewhere, options(out, str(run)))
    message = str(refused.value)
    assert "\n" not in message and "was trained with another tokenizer" in message
    assert f"model.tokenizer = '{tokenizer_dir}' vs '{other}'" in message
    assert not (out / "frames" / RESULTS_FILE).exists()  # nothing evaluated, nothing written
    eval_job.run_benchmarks(cfg, options(out, str(run)))  # its own tokenizer: evaluated


def test_a_corrupt_middle_line_is_named_and_nothing_is_dropped(tmp_path):
    """Item 6: the 2nd of 4 result lines corrupt used to cut the file to 1 line ("dropping an
    incomplete last line"), so paid judge grades would be bought again."""
    grader = Grader("exact")
    evaluate_dataset(QUESTIONS[:4], ScriptedPolicy(), grader, samples=2, out_dir=str(tmp_path),
                     batch_size=2)
    path = tmp_path / RESULTS_FILE
    lines = path.read_text().splitlines(keepends=True)
    assert len(lines) == 4
    lines[1] = lines[1][:40] + "\n"  # a torn write in the middle, the later lines intact
    path.write_text("".join(lines))
    damaged = path.read_bytes()
    policy = ScriptedPolicy()
    with pytest.raises(ResultsError, match=rf"{RESULTS_FILE}:2: unreadable result line .*2 "
                                           r"line\(s\) follow it") as refused:
        evaluate_dataset(QUESTIONS[:4], policy, grader, samples=2, out_dir=str(tmp_path),
                         batch_size=2)
    assert "\n" not in str(refused.value)
    assert path.read_bytes() == damaged and policy.calls == []


@pytest.fixture
def held_workdir(tmp_path):
    workdir = tmp_path / "bench"
    workdir.mkdir()
    process = subprocess.Popen([sys.executable, "-c", HOLD, str(workdir)], cwd=REPO,
                               env=dict(os.environ, PYTHONPATH=str(REPO)),
                               stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "locked"
    yield workdir, process
    process.kill()
    process.wait()


def test_evaluate_on_a_workdir_in_use_is_refused_before_writing(tokenizer_dir, tmp_path,
                                                                 held_workdir, options):
    """Item 7: two evaluations on one --workdir both ran in full (results.jsonl: 12 lines for 6
    questions); the second now stops at once naming the holder."""
    workdir, process = held_workdir
    cfg = config(tokenizer_dir, tmp_path)
    with pytest.raises(WorkdirInUse, match=f"pid {process.pid} "):
        eval_job.run_benchmarks(cfg, options(workdir, None))
    assert sorted(os.listdir(workdir)) == ["run.lock"]


def test_a_damaged_newest_checkpoint_is_skipped_with_one_warning(tokenizer_dir, tmp_path, caplog):
    """Item 10: a truncated newest step stopped evaluate with a 151-line tensorstore traceback
    although the step before was intact; now the newest that restores is evaluated, and the
    run's directory is left as it is (the reader never sets a step aside)."""
    cfg = config(tokenizer_dir, tmp_path)
    run = tmp_path / "run"
    save_run_checkpoints(run, cfg)
    manager = run / "checkpoints" / "rl"
    for f in (manager / "5" / "params").rglob("*"):
        if f.is_file() and f.parent.name == "d":  # the array data files, cut in half
            f.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    mesh = make_mesh(cfg)
    with caplog.at_level(logging.WARNING):
        _, _, step = eval_job.restore_source(cfg, mesh, eval_job.locate_checkpoint(str(run)))
    assert step == 3
    warnings = [r.getMessage() for r in caplog.records
                if r.levelno >= logging.WARNING and r.name.startswith("matpo_jax")]
    assert len(warnings) == 1 and f"{manager}/5 is unreadable" in warnings[0]
    assert sorted(os.listdir(manager)) == ["3", "5"]
    with pytest.raises(ConfigError, match=f"step 5 of {manager} does not restore") as refused:
        eval_job.restore_model(cfg, mesh, str(manager / "5"))  # asked for by name: one line
    assert "\n" not in str(refused.value)


def test_a_checkpoint_of_one_world_is_never_evaluated_in_another(tmp_path):
    """Item 2 as probed: a checkpoint of the shrunk synthetic_tiny world evaluated with
    data.world_seed=1 (the other world's trained tokenizer: other ids for the same sentence)
    used to exit 0; the run's own world is evaluated."""
    from matpo_jax.data.loader import SYNTHETIC
    from matpo_jax.data.world_assets import prepare_world

    from test_end_to_end import TINY, shrink

    data_dir = str(tmp_path / "tfds")
    cfg = to_typed(load_config_file(TINY, shrink(data_dir, rl_steps=1)))
    other = to_typed(load_config_file(TINY, shrink(data_dir, rl_steps=1) + ",data.world_seed=1"))
    chat = prepare_world(cfg, data_dir).chat
    _, params, _ = nnx.split(build_model(cfg, make_mesh(cfg)), nnx.Param, ...)
    run = tmp_path / "run"
    with ckpt_lib.Checkpointer(run / "checkpoints" / "sft", async_save=False) as c:
        c.save(4, params=params, opt_state={"count": jax.numpy.zeros(())}, force=True,
               metadata={provenance.IDENTITY_KEY: provenance.checkpoint_identity(cfg, chat)})
    bench = eval_job.BenchmarkOptions(datasets=[SYNTHETIC], workdir=str(tmp_path / "bench"),
                                      checkpoint=str(run), num_questions=1, grader="exact")
    with pytest.raises(provenance.ArtifactMismatch,
                       match=r"was trained with another tokenizer .*data\.world_seed = 0 vs 1"):
        eval_job.run_benchmarks(other, bench)
    assert not (tmp_path / "bench" / SYNTHETIC / RESULTS_FILE).exists()


def test_a_runs_own_evaluation_of_other_parameters_is_set_aside_not_mixed(tmp_path):
    """Item 1 inside a run: an extended run's "final" benchmark evaluation (eval/final/<name>/, a
    directory the run owns) used to resume from the previous final's answers; now they are set
    aside as *.stale and every question is evaluated anew."""
    grader = Grader("exact")
    before = {"run_config_sha256": "c", "tag": "final", "train_steps": 2}
    after = {**before, "train_steps": 3}
    evaluate_dataset(QUESTIONS[:4], ScriptedPolicy(), grader, samples=2, out_dir=str(tmp_path),
                     batch_size=2, source=before, restart_stale=True)
    old = (tmp_path / RESULTS_FILE).read_bytes()
    policy = ScriptedPolicy()
    results = evaluate_dataset(QUESTIONS[:4], policy, grader, samples=2, out_dir=str(tmp_path),
                               batch_size=2, source=after, restart_stale=True)
    assert len(policy.calls) == 2  # both batches rolled out again
    assert (tmp_path / f"{RESULTS_FILE}.stale").read_bytes() == old
    assert all(r["source"] == after for r in results)
    on_disk = [json.loads(line) for line in (tmp_path / RESULTS_FILE).read_text().splitlines()]
    assert [r["source"] for r in on_disk] == [after] * 4
