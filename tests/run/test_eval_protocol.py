"""The evaluation protocol (run/eval/): the one rollout-and-grade path (fixed batches, skipped
questions, outcome counts) and the registry (every dataset has an evaluator; one evaluation's
metrics and files written once, the synthetic world first)."""
from __future__ import annotations

import json
import types

from matpo_jax.data import loader as loader_lib
from matpo_jax.run.eval import protocol, registry
from matpo_jax.run.eval.collect import rollout_and_grade
from matpo_jax.run.eval.summary import summarize

from test_benchmark_eval import K, ScriptedPolicy

QUESTIONS = [f"What is answer {i}?" for i in range(5)]


def _grade_numbers(positions, rollouts, outcomes):
    return [[(p, s) for s in range(len(row))] for p, row in zip(positions, outcomes)]


def test_batches_are_fixed_slices_and_skipped_questions_are_not_rolled_out():
    policy = ScriptedPolicy()
    graded = list(rollout_and_grade(QUESTIONS, policy, _grade_numbers, samples=K, batch_size=2,
                                    skip=lambda p: p in (0, 1, 3)))
    # batch 0 (questions 0, 1) is all skipped; batch 1 keeps its key (index 1) without question 3
    assert policy.calls == [(1, [QUESTIONS[2]]), (2, [QUESTIONS[4]])]
    assert [(g.index, g.positions) for g in graded] == [(1, [2]), (2, [4])]
    assert graded[0].grades == [[(2, 0), (2, 1)]]  # [question][sample], from the grade_fn


def test_outcomes_count_tools_subagent_calls_and_workers():
    (graded,) = rollout_and_grade(QUESTIONS[:1], ScriptedPolicy(), _grade_numbers, samples=K,
                                  batch_size=8)
    outcome = graded.outcomes[0][0]
    # the planner's one subagent call and its worker's search and open
    assert (outcome.tool_calls, outcome.subagent_calls, outcome.worker_calls) == (2, 1, 1)
    assert sum(len(r.tool_calls) for r in graded.rollouts if r.sample_index == 0) == 3
    assert [a.rollout_id for a in outcome.agents] == [0, 1]
    assert outcome.prediction == "answer 0"


def test_every_dataset_name_has_an_evaluator():
    assert set(registry.EVALUATORS) == set(loader_lib.DATASET_NAMES)


def test_one_evaluation_writes_its_metrics_samples_and_table_once(tmp_path, monkeypatch):
    ran = []
    results = [{"id": "q", "categories": {}, "samples": [{"grade": "correct", "tool_calls": 1,
                                                            "worker_calls": 0}]}]

    def fake(rt, name, tag, curve_questions):
        def run(policy):
            ran.append((name, tag, curve_questions))
            if name == loader_lib.SYNTHETIC:
                return protocol.Evaluation({"eval/accuracy": 0.5}, samples_text="=== Q\n")
            return protocol.Evaluation({f"eval/{name}/accuracy": 1.0},
                                       summaries={name: summarize(results)})
        return types.SimpleNamespace(run=run)

    monkeypatch.setattr(registry, "EVALUATORS", {n: fake for n in registry.EVALUATORS})
    cfg = types.SimpleNamespace(
        eval=types.SimpleNamespace(datasets=("frames", loader_lib.SYNTHETIC), temperature=0.0),
        rollout=types.SimpleNamespace(group_size=4, temperature=1.0, mode="matpo",
                                      reuse_prefixes=True),
        data=types.SimpleNamespace(batch_size=2),
        reward=types.SimpleNamespace(method="exact"), train=types.SimpleNamespace(seed=0),
        tools=types.SimpleNamespace(max_calls_per_turn=4))
    monkeypatch.setattr(registry, "rollout_config", lambda cfg, evaluation: types.SimpleNamespace(
        group_size=1, temperature=0.0, mode="matpo"))
    rt = types.SimpleNamespace(cfg=cfg, chat=None, toolbox=None,
                               path=lambda *parts: str(tmp_path.joinpath(*parts)))
    metrics = registry.evaluate_run(rt, None, None, tag="final", curve_questions=3)
    assert ran == [(loader_lib.SYNTHETIC, "final", 3), ("frames", "final", 3)]
    assert metrics == {"eval/accuracy": 0.5, "eval/frames/accuracy": 1.0}
    assert json.loads((tmp_path / "eval" / "final.json").read_text()) == metrics
    assert (tmp_path / "eval" / "final_samples.txt").read_text() == "=== Q\n"
    table = (tmp_path / "eval" / "final" / "report.md").read_text()
    assert table.startswith("# Evaluation final\n\nmode: matpo; temperature: 0; grader: exact")
    assert "| frames | all | 1 | 100.0 |" in table
