"""The paper's real path, offline: a Qwen3 checkpoint in Hugging Face format (its own tokenizer and
chat template) -> 2 MATPO RL steps on MuSiQue-format files with the local search service over
MuSiQue's paragraphs (`python -m matpo_jax.train` with the 0.6B config's offline variant, shrunk)
-> an Orbax checkpoint -> `python -m matpo_jax.evaluate` of it on the FRAMES-, WebWalkerQA- and
GAIA-format files, `open` reading an HTML page from a local web server, graded by the local
OpenAI-compatible judge -> the table.

The checkpoint is a tiny Qwen3 whose weights are set by hand (fixtures/hf_models.py
build_scripted_qwen3), so its turns are known: the planner delegates, the worker searches then
opens the page, the planner answers \\boxed{Zurich} (an alias of a MuSiQue train answer). A
random model would never call a tool or answer, and the tools, the judge and the alias would go
untested.
"""
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

from fixtures.compile_cache import cache_env
from fixtures.fault_server import FaultServer, send
from fixtures.xla import xla_flags
from fixtures.hf_models import ScriptedTurns, build_scripted_qwen3
from matpo_jax.chat import format_tool_call
from matpo_jax.config import load_config_file, to_typed
from matpo_jax.model import load_pretrained
from matpo_jax.report import metrics as metrics_lib
from matpo_jax.run.eval import job as eval_job
from matpo_jax.run.runtime import make_mesh

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "data" / "fixtures"
CONFIG = REPO / "configs" / "qwen3_0_6b_musique.py"
PAGE = b"""<html><head><title>Lyon - Atlas</title></head><body><nav>Home | Login</nav>
<article><h1>Lyon</h1><p>Lyon lies at the confluence of the Rhone and the Saone, in France.</p>
<p>The old town of Lyon is a World Heritage Site, known for its traboules and silk weavers.</p>
</article><footer>Copyright Atlas Media</footer></body></html>"""
PAGE_TEXT = "known for its traboules and silk weavers"  # the page's main text, as extracted
PARAGRAPH = "Lyon is the third-largest city of France."  # a MuSiQue paragraph (train and dev)


def shrink(judge_url: str) -> list[str]:
    """The 0.6B offline config at test size: the checkpoint's dimensions, short turns, 2 steps."""
    return [
        "model.dtype=float32", "data.batch_size=3", "rollout.group_size=4",
        "rollout.max_context=2048", "rollout.max_new_tokens_per_turn=4",
        "rollout.final_summary_max_tokens=4", "rollout.max_turns_planner=2",
        "rollout.max_turns_worker=3", "rollout.decode_slots=8", "rollout.reuse_prefixes=false",
        "rl.pack_len=2048", "rl.pack_rows=8", "rl.micro_batches=1", "tools.max_response_chars=300",
        "train.steps=2", "train.eval_every=0", "train.checkpoint_every=1",
        "train.async_checkpointing=false", "train.remat=none", "eval.num_questions=2",
        "reward.method=judge", f"reward.judge_url={judge_url}", f"data.manual_dir={FIXTURES}",
        "rl.rollout_correction=tis",  # the step recomputes the sampled tokens' log-probs
    ]


# The config's FSDP over 2 simulated devices (a real mesh: every parameter split in two), not the
# session's 8: on 2 cores, partitioning and collectives for 8 made this test 351 s instead of
# 196 s (Dec 2, the same load; 143 s on one device).
DEVICES = 2


def run(module: str, flags: list[str], cache_dir: str) -> subprocess.CompletedProcess:
    # one persistent compilation cache: evaluate loads the sampler training compiled
    env = dict(os.environ, PYTHONPATH=str(REPO), XLA_FLAGS=xla_flags(DEVICES),
               **cache_env(cache_dir))
    done = subprocess.run([sys.executable, "-m", module, *flags], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done


@pytest.fixture(scope="module")
def site():
    with FaultServer({"/lyon.html": send(200, PAGE, "text/html; charset=utf-8")}) as server:
        yield server


@pytest.fixture(scope="module")
def checkpoint(site, tmp_path_factory):
    turns = ScriptedTurns(
        planner_first=format_tool_call("subagent", {"subtask": "Find where Lyon is"}),
        planner_after_tool="\\boxed{Zurich}",
        worker_first=format_tool_call("search", {"query": "Lyon third-largest city"}),
        worker_after_tool=format_tool_call("open", {"id": f"{site.url}/lyon.html"}))
    # answer_logit ln(511): sampled planners answer every other time (GRPO groups differ)
    return build_scripted_qwen3(tmp_path_factory.mktemp("qwen3_hf"), turns,
                                answer_logit=float(np.log(511)))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.open(encoding="utf-8")]


def _ids(name: str) -> list[str]:
    return [row["id"] for row in _jsonl(FIXTURES / "musique" / name)]


def test_qwen3_checkpoint_trains_on_musique_then_evaluates_on_the_benchmarks(
        checkpoint, site, judge_server, compilation_cache_dir, tmp_path):
    workdir, bench = tmp_path / "run", tmp_path / "bench"
    config = f"--config={CONFIG}:checkpoint={checkpoint.path},offline"
    overrides = [f"--config.{o}" for o in shrink(judge_server.url)]

    # ---- 2 MATPO RL steps on MuSiQue, offline
    trained = run("matpo_jax.train", [config, *overrides, f"--workdir={workdir}"],
                  compilation_cache_dir)
    records = metrics_lib.load_metrics(str(workdir / "metrics.jsonl"))
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == [1, 2]
    for r in steps:  # MATPO: every planner delegated once, its worker searched and opened
        assert r["rollouts/planner"] == 12 and r["worker_calls_mean/planner"] == 1.0
        assert r["tool_calls_mean/worker"] >= 2.0
    assert any(r["grad_norm"] > 0 for r in steps)  # groups differed in reward: a real update
    for r in steps:  # the sampler (KV cache) against the step (packed): float32 both, close
        assert r["mismatch/tokens"] > 0 and 0 <= r["mismatch/abs_mean"] < 1e-3
        assert 0 < r["planner/tis_weight"] <= 2.0 and r["planner/approx_kl"] < 1e-6
    # "Zurich" is an alias of a train answer (Zürich): correct whenever its question was drawn
    consumed = _jsonl(workdir / "consumed.jsonl")
    train_ids, dev_ids = _ids("musique_ans_v1.0_train.jsonl"), _ids("musique_ans_v1.0_dev.jsonl")
    assert [sorted(c["ids"]) for c in consumed] == [sorted(train_ids)] * 2  # all 3, each step
    assert {i for c in consumed for i in c["ids"]} <= set(train_ids)  # the train split only
    zurich_steps = [c["step"] for c in consumed if "4hop2__1_2_3_4" in c["ids"]]
    assert zurich_steps and all(steps[s - 1]["reward/accuracy"] > 0 for s in zurich_steps)
    corpus = workdir / "tfds" / "musique" / "ans" / "1.0.0" / "corpus.jsonl"
    assert f"local search service over {corpus}" in trained.stderr
    # evaluation during the run (eval.datasets of the offline variant: MuSiQue validation)
    final = json.loads((workdir / "eval" / "final.json").read_text())
    assert final["eval/musique/questions"] == 2.0
    transcripts = _jsonl(workdir / "eval" / "final" / "musique" / "transcripts.jsonl")
    assert [t["id"] for t in transcripts] == dev_ids
    workers = [a["text"] for t in transcripts for a in t["agents"] if a["role"] == "worker"]
    assert workers and all(PARAGRAPH in text for text in workers)  # served MuSiQue paragraphs
    judged_in_training = judge_server.requests
    assert judged_in_training > 0

    # ---- the Orbax checkpoint: step 2, restorable, not the starting weights
    cfg = to_typed(load_config_file(CONFIG, f"checkpoint={checkpoint.path},offline"),
                   check_files=False)
    cfg = cfg.replace(model=dataclasses.replace(cfg.model, dtype="float32"))
    mesh = make_mesh(cfg)
    restored = nnx.split(nnx.merge(*eval_job.restore_model(cfg, mesh, str(workdir))),
                         nnx.Param, ...)[1]
    start = nnx.split(load_pretrained(checkpoint.path, mesh=mesh), nnx.Param, ...)[1]
    assert sorted(os.listdir(workdir / "checkpoints" / "rl")) == ["1", "2"]
    moved = [float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
             for a, b in zip(jax.tree.leaves(restored), jax.tree.leaves(start), strict=True)]
    assert 0 < max(moved) < 1e-3  # trained (lr 1e-5), and still the scripted model

    # ---- evaluate the checkpoint on the benchmarks: web pages over a local server, the judge
    hits_before = site.hits("/lyon.html")
    evaluated = run("matpo_jax.evaluate", [
        config, *overrides, "--config.tools.page_backend=fetch",
        f"--config.tools.page_url={site.url}",  # a configured local service: allow-listed
        f"--corpus={corpus}", f"--checkpoint={workdir}", "--datasets=frames,webwalkerqa,gaia",
        "--num_questions=2", f"--workdir={bench}"], compilation_cache_dir)
    table = (bench / "report.md").read_text()
    assert table.split("\n\n", 2)[2] in evaluated.stdout
    assert "grader: judge" in table and f"checkpoint: {workdir}" in table
    for row in ("| frames | all | 2 |", "| webwalkerqa | all | 2 |", "| gaia | all | 2 |"):
        assert row in table
    assert site.hits("/lyon.html") - hits_before == 6  # one open per question
    assert judge_server.requests - judged_in_training == 6  # every answer graded by the judge
    for name in ("frames", "webwalkerqa", "gaia"):
        results = _jsonl(bench / name / "results.jsonl")
        assert [s["prediction"] for r in results for s in r["samples"]] == ["Zurich", "Zurich"]
        assert all(s["grade"] == "incorrect" for r in results for s in r["samples"])
        transcripts = _jsonl(bench / name / "transcripts.jsonl")
        worker = [a for t in transcripts for a in t["agents"] if a["role"] == "worker"]
        assert len(worker) == 2 and all(PAGE_TEXT in a["text"] for a in worker)
        assert all("Copyright" not in a["text"] for a in worker)  # main text only
