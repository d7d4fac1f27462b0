"""`python -m matpo_jax.evaluate` end to end on the fixture benchmarks: a tiny random model saved as
an Orbax checkpoint, a locally trained tokenizer, the local search service over MuSiQue's
paragraphs, the local judge server -> results, transcripts and the table; a rerun finds
everything done."""
from __future__ import annotations

import dataclasses

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from matpo_jax.config import ConfigError, load_config_file, to_typed
from matpo_jax.run.eval import job as eval_job
from matpo_jax.run.runtime import build_model, make_mesh
from matpo_jax.trainer import checkpoint as ckpt_lib
from fixtures.xla import xla_flags

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "data" / "fixtures"
BASE = REPO / "configs" / "base.py"
DATASETS = ["gaia", "frames", "webwalkerqa", "musique"]


def overrides(tokenizer_dir, data_dir, judge_url) -> list[str]:
    """A tiny model and short rollouts (one compilation of the slot loop, a few seconds)."""
    return [
        f"model.tokenizer={tokenizer_dir}", "model.arch.vocab_size=512",
        "model.arch.hidden_size=32", "model.arch.intermediate_size=64",
        "model.arch.num_hidden_layers=1", "model.arch.num_attention_heads=2",
        "model.arch.num_key_value_heads=1", "model.arch.head_dim=16",
        "rollout.max_context=1024", "rl.pack_len=1024", "rollout.max_new_tokens_per_turn=16",
        "rollout.final_summary_max_tokens=16", "rollout.max_turns_planner=2",
        "rollout.max_turns_worker=2", "rollout.decode_slots=4", "rollout.reuse_prefixes=false",
        f"data.manual_dir={FIXTURES}", f"data.data_dir={data_dir}", "train.seed=0",
        "reward.method=judge", f"reward.judge_url={judge_url}",
    ]


def config(tokenizer_dir, data_dir, judge_url):
    return to_typed(load_config_file(BASE, ",".join(
        overrides(tokenizer_dir, data_dir, judge_url))), jax.device_count())


@pytest.fixture
def checkpoint(tmp_path, tokenizer_dir, judge_server):
    """A run directory whose RL checkpoint holds parameters of another seed than the config's."""
    cfg = config(tokenizer_dir, tmp_path / "tfds", judge_server.url)
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, seed=7))
    _, params, _ = nnx.split(build_model(cfg, make_mesh(cfg)), nnx.Param, ...)
    run = tmp_path / "run"
    with ckpt_lib.Checkpointer(run / "checkpoints" / "rl", async_save=False) as c:
        c.save(3, params=params, opt_state={"count": jax.numpy.zeros(())}, force=True)
    return run, params


def test_restore_model_reads_the_checkpoint_parameters(checkpoint, tokenizer_dir, tmp_path,
                                                       judge_server):
    run, saved = checkpoint
    cfg = config(tokenizer_dir, tmp_path / "tfds", judge_server.url)
    mesh = make_mesh(cfg)
    fresh = nnx.split(build_model(cfg, mesh), nnx.Param, ...)[1]
    # a run's workdir, its Orbax checkpoint directory, one step of it
    for path in (run, run / "checkpoints" / "rl", run / "checkpoints" / "rl" / "3"):
        restored = nnx.split(nnx.merge(*eval_job.restore_model(cfg, mesh, str(path))),
                             nnx.Param, ...)[1]
        for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(saved), strict=True):
            np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
        assert any(not np.array_equal(np.asarray(a), np.asarray(b))  # not the config's init
                   for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(fresh)))
    with pytest.raises(ConfigError, match="no checkpoint in"):  # one line at the command
        eval_job.restore_model(cfg, mesh, str(tmp_path))


def test_evaluate_cli_end_to_end_then_resume(checkpoint, tokenizer_dir, tmp_path, judge_server):
    run, _ = checkpoint
    out = tmp_path / "bench"
    flags = [f"--config={BASE}"] + [f"--config.{o}" for o in overrides(
        tokenizer_dir, tmp_path / "tfds", judge_server.url)] + [
        f"--checkpoint={run}", f"--datasets={','.join(DATASETS)}", "--samples=2",
        "--temperature=1.0", "--num_questions=2", f"--workdir={out}"]
    env = dict(os.environ, JAX_PLATFORMS="cpu", XLA_FLAGS=xla_flags(), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "matpo_jax.evaluate", *flags], env=env,
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    table = (out / "report.md").read_text()
    assert table.split("\n\n", 2)[2] in done.stdout  # the table is the command's output
    assert "grader: judge" in table and "samples: 2" in table
    for row in ("| gaia | all | 2 |", "| gaia | level 1 | 1 |", "| gaia | level 2 | 1 |",
                "| frames | reasoning_type temporal reasoning | 1 |",
                "| webwalkerqa | difficulty hard | 1 |", "| webwalkerqa | type single_source | 1 |",
                "| musique | hops 2 | 1 |"):
        assert row in table
    questions = {}
    for name in DATASETS:
        results = [json.loads(line) for line in (out / name / "results.jsonl").open()]
        transcripts = [json.loads(line) for line in (out / name / "transcripts.jsonl").open()]
        assert len(results) == 2 and [len(r["samples"]) for r in results] == [2, 2]
        assert len(transcripts) == 4
        for t in transcripts:
            planner = t["agents"][0]
            assert planner["role"] == "planner"
            # the real rollout's context, decoded: the planner's prompt holds the question
            question = next(r["question"] for r in results if r["id"] == t["id"])
            assert question[:20] in planner["text"]
        questions[name] = [r["id"] for r in results]
    assert questions["frames"] == ["frames-0", "frames-1"]
    assert questions["musique"] == ["2hop__111_222", "3hop2__5_6_7"]  # its validation split
    # no --corpus: the local search service served MuSiQue's paragraph corpus
    corpus = tmp_path / "tfds" / "musique" / "ans" / "1.0.0" / "corpus.jsonl"
    assert f"local search service over {corpus}" in done.stderr
    assert questions["gaia"][0] == "c61d22de-5f6c-4958-a7f6-5e9707bd3466"
    # Rerun (here through the library): every question has a result, nothing is rolled out,
    # the files stay as they were and the table is the same.
    before = {p: p.read_bytes() for p in out.rglob("*.jsonl")}
    cfg = config(tokenizer_dir, tmp_path / "tfds", judge_server.url)
    numbers = eval_job.run_benchmarks(cfg, eval_job.BenchmarkOptions(
        datasets=DATASETS, workdir=str(out), checkpoint=str(run), samples=2, temperature=1.0,
        num_questions=2))
    assert {p: p.read_bytes() for p in out.rglob("*.jsonl")} == before
    assert (out / "report.md").read_text() == table
    assert numbers["gaia"]["all"]["questions"] == 2
