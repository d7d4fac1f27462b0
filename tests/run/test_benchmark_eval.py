"""Grading (offline and through a local OpenAI-compatible judge server), judge-failure accounting
and resuming an interrupted evaluation, with rollout records written by a scripted policy."""
from __future__ import annotations

import json
import math

import pytest

from matpo_jax.agents.trajectory import PLANNER, WORKER, Rollout, ToolCallRecord
from matpo_jax.rl.judge import JudgeConfig, LLMJudge
from matpo_jax.run.eval.benchmark import evaluate_dataset
from matpo_jax.run.eval.collect import sample_outcomes
from matpo_jax.run.eval.grading import CORRECT, INCORRECT, NOT_ATTEMPTED, Grader
from matpo_jax.run.eval.questions import benchmark_questions
from matpo_jax.run.eval.results import RESULTS_FILE, TRANSCRIPTS_FILE
from matpo_jax.run.eval.summary import summarize

K = 2
QUESTIONS = benchmark_questions("gaia", [
    {"id": f"t{i}", "question": f"What is answer {i}?", "answers": [f"answer {i}", f"alias {i}"],
     "level": 1 + i % 3} for i in range(7)])


def scripted_rollouts(questions, samples=K):
    """A planner per (question, sample) calling one worker with two searches. Planners answer
    the question's number; sample 1 of questions ending in 3 or 6 gives no boxed answer, sample 1
    of every question answers wrong."""
    rollouts = []
    for q, question in enumerate(questions):
        number = question.split()[-1].rstrip("?")
        for s in range(samples):
            planner_id, worker_id = len(rollouts), len(rollouts) + 1
            if s == 1 and number in "36":
                text = "I could not find it."
            else:
                text = f"\\boxed{{answer {number if s == 0 else 'x'}}}"
            rollouts.append(Rollout(
                rollout_id=planner_id, role=PLANNER, query_index=q, sample_index=s,
                parent_id=None, assistant_texts=["<tool_call>...</tool_call>", text],
                tool_calls=[ToolCallRecord(0, "subagent", {"subtask": "x"}, True)],
                finish_reason="answer", child_ids=[worker_id]))
            rollouts.append(Rollout(
                rollout_id=worker_id, role=WORKER, query_index=q, sample_index=s,
                parent_id=planner_id, assistant_texts=["searching", "report"],
                tool_calls=[ToolCallRecord(0, "search", {"query": "a"}, True),
                            ToolCallRecord(1, "open", {"id": "d"}, False, error="bad")],
                finish_reason="answer"))
    return rollouts


class ScriptedPolicy:
    """rollout_fn that records what it was asked and can stop after some batches."""

    def __init__(self, stop_after=None):
        self.calls, self.stop_after = [], stop_after

    def __call__(self, questions, batch_index):
        if self.stop_after is not None and len(self.calls) == self.stop_after:
            raise KeyboardInterrupt("preempted")
        self.calls.append((batch_index, list(questions)))
        return scripted_rollouts(questions)


def judge(server, retries=1):
    return LLMJudge(JudgeConfig(base_url=server.url, model="judge", api_key_env="MATPO_TEST_JUDGE_KEY",
                                max_retries=retries, backoff_s=0.01,
                                max_concurrency=4))


def test_offline_graders_accept_aliases():
    items = [("q", ["Paris", "City of Light"], "the city of light"), ("q", ["Paris"], "Lyon"),
             ("q", ["Paris"], None), ("q", ["New York City"], "New York")]
    assert Grader("exact").grade_many(items) == [CORRECT, INCORRECT, NOT_ATTEMPTED,
                                                    INCORRECT]
    assert Grader("f1", f1_threshold=0.8).grade_many(items)[3] == CORRECT  # F1 0.8
    with pytest.raises(ValueError, match="grader 'judge' needs an LLMJudge"):
        Grader("judge")


def test_judge_grades_and_no_answer_is_not_attempted_without_asking(judge_server):
    grader = Grader("judge", judge=judge(judge_server))
    grades = grader.grade_many([("q", ["Paris", "City of Light"], "city of light"),
                                ("q", ["Paris"], "Lyon"), ("q", ["Paris"], "I don't know"),
                                ("q", ["Paris"], None)])
    assert grades == [CORRECT, INCORRECT, NOT_ATTEMPTED, NOT_ATTEMPTED]
    assert judge_server.requests == 3  # the missing answer was not sent


def test_judge_errors_are_retried_then_reported_never_wrong(judge_server):
    client = judge(judge_server, retries=2)
    grader = Grader("judge", judge=client)
    judge_server.fail_next(2)  # two 500s, then the third attempt answers
    assert grader.grade_many([("q", ["Paris"], "Paris")]) == [CORRECT]
    assert judge_server.requests == 3 and client.stats.retries == 2
    judge_server.fail_next(None)
    assert grader.grade_many([("q", ["Paris"], "Paris"), ("q", ["Paris"], None)]) == [
        None, NOT_ATTEMPTED]
    assert judge_server.requests == 3 + 3 and client.stats.failures == 1


def test_sample_outcomes_count_tools_workers_and_answers():
    table = sample_outcomes(scripted_rollouts(["What is answer 3?"]), 1, K)
    first, second = table[0]
    assert (first.prediction, second.prediction) == ("answer 3", None)
    assert first.tool_calls == 2  # the worker's search and (invalid) open; not the subagent
    assert first.worker_calls == 1
    assert [a["role"] for a in first.transcript] == [PLANNER, WORKER]
    with pytest.raises(RuntimeError, match="group_size must equal the number of samples"):
        sample_outcomes(scripted_rollouts(["q 1?"], samples=1), 1, K)


def test_judge_failures_are_reported_then_regraded_on_resume(judge_server, tmp_path):
    grader = Grader("judge", judge=judge(judge_server, retries=1))
    judge_server.fail_next(None)
    policy = ScriptedPolicy()
    results = evaluate_dataset(QUESTIONS, policy, grader, samples=K, out_dir=str(tmp_path),
                                  batch_size=3)
    answered = sum(1 for q in results for s in q["samples"] if s["prediction"] is not None)
    s = summarize(results)["all"]
    assert s.judge_failures == answered == 12  # 7 x 2 samples, 2 without an answer
    assert s.ungraded == 5  # questions whose two samples both went to the judge
    assert s.not_attempted == pytest.approx(1.0)  # the only graded samples had no answer
    assert s.avg_at_k == pytest.approx(0.0)
    assert math.isnan(s.pass_at_k)  # every question has a failed sample and no correct one
    # The judge is back: a rerun grades the failures again and rolls nothing out.
    judge_server.fail_next(0)
    rerun = ScriptedPolicy()
    results = evaluate_dataset(QUESTIONS, rerun, grader, samples=K, out_dir=str(tmp_path),
                                  batch_size=3)
    assert rerun.calls == []
    s = summarize(results)["all"]
    assert (s.judge_failures, s.ungraded) == (0, 0)
    assert s.avg_at_k == pytest.approx(0.5) and s.pass_at_k == pytest.approx(1.0)
    on_disk = [json.loads(line) for line in (tmp_path / RESULTS_FILE).read_text().splitlines()]
    assert on_disk == results


def test_interrupted_evaluation_resumes_where_it_stopped(tmp_path):
    grader = Grader("exact")
    straight = evaluate_dataset(QUESTIONS, ScriptedPolicy(), grader, samples=K,
                                   out_dir=str(tmp_path / "straight"), batch_size=3)
    out = tmp_path / "resumed"
    with pytest.raises(KeyboardInterrupt):
        evaluate_dataset(QUESTIONS, ScriptedPolicy(stop_after=1), grader, samples=K,
                            out_dir=str(out), batch_size=3)
    assert len((out / RESULTS_FILE).read_text().splitlines()) == 3
    # A crash in the middle of the next batch's writes: transcripts of t3 without its result,
    # and half a result line.
    with open(out / TRANSCRIPTS_FILE, "a") as f:
        f.write(json.dumps({"id": "t3", "sample": 0, "agents": []}) + "\n")
    with open(out / RESULTS_FILE, "a") as f:
        f.write('{"id": "t3", "question": "What is ans')
    policy = ScriptedPolicy()
    resumed = evaluate_dataset(QUESTIONS, policy, grader, samples=K, out_dir=str(out),
                                  batch_size=3)
    # only the unfinished batches ran, each under its own batch index
    assert [(b, [q.split()[-1] for q in qs]) for b, qs in policy.calls] == [
        (1, ["3?", "4?", "5?"]), (2, ["6?"])]
    assert resumed == straight
    for name in (RESULTS_FILE, TRANSCRIPTS_FILE):
        assert (out / name).read_text() == (tmp_path / "straight" / name).read_text()
    transcripts = [json.loads(line)
                   for line in (out / TRANSCRIPTS_FILE).read_text().splitlines()]
    assert len(transcripts) == len(QUESTIONS) * K
    summary = summarize(resumed)
    assert summary["all"].avg_at_k == pytest.approx(0.5)
    assert summary["all"].not_attempted == pytest.approx(2 / 7 / 2)
    assert summary["all"].tool_calls == pytest.approx(2.0)
    assert list(summary) == ["all", "level 1", "level 2", "level 3"]
    # A rerun with another K or another grader would mix incomparable results.
    with pytest.raises(ValueError, match="has 2 samples graded by exact, this run asks for 3 "
                                         "graded by exact"):
        evaluate_dataset(QUESTIONS, policy, grader, samples=3, out_dir=str(out))
    with pytest.raises(ValueError, match="this run asks for 2 graded by f1"):
        evaluate_dataset(QUESTIONS, policy, Grader("f1"), samples=K, out_dir=str(out))
