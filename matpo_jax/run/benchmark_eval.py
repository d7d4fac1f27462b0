"""Benchmark evaluation: K sampled answers per question, graded, written as they come, resumable.

    questions = benchmark_questions("frames", records)          # decoded loader records
    grader = Grader("judge", judge=LLMJudge(JudgeConfig(base_url=URL, model=..., api_key_env=...)))
    sample = rollout_sampler(model_state, graphdef, chat, toolbox, rollout_cfg, seed, "frames")
    results = evaluate_dataset(questions, sample, grader, samples=4, out_dir=D, decode=chat.decode)

`rollout_cfg.group_size` must equal `samples`: each question is rolled out K times in one batch
(MATPO planners with their workers, or single agents; whatever `rollout_cfg.mode` says).

Grades: correct / incorrect / not_attempted, or None when the LLM judge failed after its retries
(reported as a judge failure, never counted as wrong). Offline graders (exact match, token F1 over
the accepted answers) never fail. A rollout without a boxed answer is not_attempted without asking
the judge.

On disk, in `out_dir`:
    results.jsonl      one line per question: id, question, answers, categories, grader, and per
                       sample the prediction, grade, tool calls and worker calls
    transcripts.jsonl  one line per sample: the decoded contexts of the planner (or single agent)
                       and of every worker it called
A batch's lines are appended once the batch is graded, so an interrupted evaluation resumes at the
first question without a result line; results whose judge failed are graded again on resume.
"""
from __future__ import annotations

import dataclasses
import io
import json
import logging
import os
import zlib
from typing import Callable, Sequence

import jax

from matpo_jax.agents.rollout import run_rollouts
from matpo_jax.config import RolloutSection
from matpo_jax.config.sections import DEFAULT_TOOL_CALLS_PER_TURN
from matpo_jax.agents.trajectory import WORKER, Rollout
from matpo_jax.report import files
from matpo_jax.rl import judge as judge_lib
from matpo_jax.rl import rewards as rewards_lib
from matpo_jax.tools.schemas import SUBAGENT_SCHEMA

log = logging.getLogger(__name__)

CORRECT, INCORRECT, NOT_ATTEMPTED = "correct", "incorrect", "not_attempted"
GRADES = (CORRECT, INCORRECT, NOT_ATTEMPTED)
_JUDGE_GRADES = {judge_lib.CORRECT: CORRECT, judge_lib.INCORRECT: INCORRECT,
                 judge_lib.NOT_ATTEMPTED: NOT_ATTEMPTED}
GRADER_METHODS = ("exact", "f1", "judge")
RESULTS_FILE, TRANSCRIPTS_FILE = "results.jsonl", "transcripts.jsonl"
_SUBAGENT = SUBAGENT_SCHEMA["function"]["name"]

RolloutFn = Callable[[list[str], int], Sequence[Rollout]]  # (questions, batch index) -> rollouts


# ----------------------------------------------------------------------------- questions

@dataclasses.dataclass(frozen=True)
class BenchmarkQuestion:
    id: str
    question: str
    answers: list[str]  # accepted answers, the canonical one first
    categories: dict[str, list[str]]  # e.g. {"level": ["2"]}; a question may be in several


def _label(value) -> str:
    """Category values that differ only by case or separator are one group."""
    return str(value).strip().lower().replace("-", "_")


def categories_of(dataset: str, record: dict) -> dict[str, list[str]]:
    """The groups a question is reported in: level (GAIA), reasoning type (FRAMES, several per
    question), difficulty and source type (WebWalkerQA), hop count (MuSiQue, synthetic)."""
    if dataset == "gaia":
        return {"level": [str(record["level"])]}
    if dataset == "frames":
        return {"reasoning_type": [_label(t) for t in record["reasoning_types"]]}
    if dataset == "webwalkerqa":
        return {"difficulty": [_label(record["difficulty_level"])],
                "type": [_label(record["type"])]}
    if "hops" in record:
        return {"hops": [str(record["hops"])]}
    return {}


def benchmark_questions(dataset: str, records: Sequence[dict]) -> list[BenchmarkQuestion]:
    """Decoded loader records (data.loader.decode_record) as questions; ids must be unique."""
    out, seen = [], set()
    for record in records:
        answers = list(record["answers"]) if "answers" in record else [record["answer"]]
        if record["id"] in seen:
            raise ValueError(f"{dataset}: question id {record['id']!r} appears twice")
        seen.add(record["id"])
        out.append(BenchmarkQuestion(id=record["id"], question=record["question"],
                                     answers=answers, categories=categories_of(dataset, record)))
    return out


# ----------------------------------------------------------------------------- grading

class Grader:
    """Grades predictions against the accepted answers: exact match, token F1 >= threshold, or an
    LLM judge (CORRECT / INCORRECT / NOT_ATTEMPTED; None where it failed after its retries)."""

    def __init__(self, method: str = "exact", *, judge: judge_lib.LLMJudge | None = None,
                 f1_threshold: float = 0.8):
        if method not in GRADER_METHODS:
            raise ValueError(f"grader {method!r}, expected one of {GRADER_METHODS}")
        if method == "judge" and judge is None:
            raise ValueError("grader 'judge' needs an LLMJudge (an OpenAI-compatible endpoint)")
        self.method, self.judge, self.f1_threshold = method, judge, f1_threshold

    def grade_many(self, items: Sequence[tuple[str, Sequence[str], str | None]]
                   ) -> list[str | None]:
        """(question, answers, prediction or None) -> grade, or None for a judge failure."""
        grades: list[str | None] = [NOT_ATTEMPTED if p is None else None for _, _, p in items]
        answered = [i for i, (_, _, p) in enumerate(items) if p is not None]
        if self.method == "judge":
            replies = self.judge.grade_many([(items[i][0], " | ".join(items[i][1]), items[i][2])
                                             for i in answered])
            for i, reply in zip(answered, replies):
                grades[i] = None if reply is None else _JUDGE_GRADES[reply]
        else:
            for i in answered:
                _, answers, prediction = items[i]
                hit = rewards_lib.accuracy(prediction, list(answers), self.method,
                                           f1_threshold=self.f1_threshold)
                grades[i] = CORRECT if hit else INCORRECT
        return grades


# ----------------------------------------------------------------------------- rollouts

@dataclasses.dataclass
class SampleOutcome:
    prediction: str | None  # the last \boxed{} answer of the planner / single agent
    tool_calls: int  # search / open calls of the agent and its workers
    worker_calls: int  # workers the planner called
    finish_reason: str
    transcript: list[dict]  # [{role, rollout_id, finish_reason, text}], the owner first


def sample_outcomes(rollouts: Sequence[Rollout], num_questions: int, samples: int,
                    decode: Callable[[Sequence[int]], str] | None = None
                    ) -> list[list[SampleOutcome]]:
    """[question][sample] outcomes of one batch of rollouts (G = samples per question)."""
    by_id = {r.rollout_id: r for r in rollouts}
    table: list[list[SampleOutcome | None]] = [[None] * samples for _ in range(num_questions)]

    def text(r: Rollout) -> str:
        return decode(r.tokens) if decode is not None else "\n".join(r.assistant_texts)

    for owner in rollouts:
        if owner.role == WORKER:
            continue
        workers = [by_id[c] for c in owner.child_ids]
        agents = [owner, *workers]
        table[owner.query_index][owner.sample_index] = SampleOutcome(
            prediction=rewards_lib.final_answer(owner),
            tool_calls=sum(c.name != _SUBAGENT for a in agents for c in a.tool_calls),
            worker_calls=len(workers),
            finish_reason=owner.finish_reason,
            transcript=[{"role": a.role, "rollout_id": a.rollout_id,
                         "finish_reason": a.finish_reason, "text": text(a)} for a in agents])
    missing = [(q, s) for q in range(num_questions) for s in range(samples) if table[q][s] is None]
    if missing:
        raise RuntimeError(f"rollouts lack (question, sample) {missing[:3]}: the rollout config's "
                           f"group_size must equal the number of samples ({samples})")
    return table


def rollout_sampler(model_state, graphdef, chat, toolbox, config: RolloutSection, seed: int,
                    dataset: str, max_tool_calls_per_turn: int = DEFAULT_TOOL_CALLS_PER_TURN
                    ) -> RolloutFn:
    """Rollouts of the model; batch b of a dataset always samples with the same key.
    max_tool_calls_per_turn: tools.max_calls_per_turn."""
    salt = zlib.crc32(dataset.encode())

    def sample(questions: list[str], batch_index: int) -> Sequence[Rollout]:
        rng = jax.random.fold_in(jax.random.fold_in(jax.random.key(seed), salt), batch_index)
        return run_rollouts(model_state, graphdef, chat, toolbox, questions, config, rng,
                            max_tool_calls_per_turn=max_tool_calls_per_turn).rollouts

    return sample


# ----------------------------------------------------------------------------- the loop

def _read_results(path: str) -> list[dict]:
    """Result lines of an earlier run; a line cut by an interruption is dropped (and cut off)."""
    if not files.run_path(path).exists():
        return []
    results, keep_bytes = [], 0
    data = files.run_path(path).read_bytes()
    for raw in io.BytesIO(data):  # the lines, each with its newline, as a file gives them
        try:
            if not raw.endswith(b"\n"):  # written lines end in one: this one was cut
                raise ValueError("no newline")
            results.append(json.loads(raw))
        except ValueError:  # JSONDecodeError included
            log.warning("%s: dropping an incomplete last line", path)
            break
        keep_bytes += len(raw)
    if keep_bytes < len(data):
        files.write_bytes_atomic(path, data[:keep_bytes])
    return results


def _rewrite_jsonl(path: str, records: Sequence[dict]) -> None:
    files.write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                          for r in records))


def _keep_transcripts_of(path: str, ids: set[str]) -> None:
    """Drop transcripts of questions whose results were never written (an interrupted batch)."""
    if not files.run_path(path).exists():
        return
    kept, dropped = [], 0
    for raw in io.BytesIO(files.run_path(path).read_bytes()):
        try:
            record = json.loads(raw)
        except json.JSONDecodeError:
            dropped += 1
            continue
        if record.get("id") in ids:
            kept.append(record)
        else:
            dropped += 1
    if dropped:
        _rewrite_jsonl(path, kept)


def _regrade_failures(results: list[dict], grader: Grader) -> int:
    """Grades again the samples whose judge failed before; returns how many are still failed."""
    todo = [(r, s) for r in results for s in r["samples"] if s["grade"] is None]
    if not todo:
        return 0
    grades = grader.grade_many([(r["question"], r["answers"], s["prediction"]) for r, s in todo])
    for (_, sample), grade in zip(todo, grades):
        sample["grade"] = grade
    return sum(g is None for g in grades)


def evaluate_dataset(questions: Sequence[BenchmarkQuestion], rollout_fn: RolloutFn,
                     grader: Grader, *, samples: int, out_dir: str, batch_size: int = 8,
                     decode: Callable[[Sequence[int]], str] | None = None,
                     regrade_failures: bool = True) -> list[dict]:
    """Every question's result (earlier runs' included), in `questions` order.

    Batches are fixed slices of `questions` (batch b: questions b*batch_size ...), so a rerun
    samples a batch with the same `rollout_fn(..., b)` key; only questions without a result line
    are rolled out.
    """
    if samples < 1 or batch_size < 1:
        raise ValueError(f"samples={samples} and batch_size={batch_size} must be >= 1")
    files.makedirs(out_dir)
    results_path = os.path.join(out_dir, RESULTS_FILE)
    transcripts_path = os.path.join(out_dir, TRANSCRIPTS_FILE)
    earlier = _read_results(results_path)
    wanted = {q.id for q in questions}
    for result in earlier:  # one directory, one way of sampling and grading
        if len(result["samples"]) != samples or result.get("grader") != grader.method:
            raise ValueError(f"{results_path}: question {result['id']!r} has "
                             f"{len(result['samples'])} samples graded by "
                             f"{result.get('grader')}, this run asks for {samples} graded by "
                             f"{grader.method}; evaluate into another directory")
    done = {r["id"]: r for r in earlier if r["id"] in wanted}
    _keep_transcripts_of(transcripts_path, {r["id"] for r in earlier})
    if regrade_failures and any(s["grade"] is None for r in earlier for s in r["samples"]):
        still = _regrade_failures(earlier, grader)
        _rewrite_jsonl(results_path, earlier)
        log.info("%s: re-graded earlier judge failures, %d still failed", out_dir, still)
    if done:
        log.info("%s: %d of %d questions already evaluated", out_dir, len(done), len(questions))

    for batch_index, start in enumerate(range(0, len(questions), batch_size)):
        batch = [q for q in questions[start:start + batch_size] if q.id not in done]
        if not batch:
            continue
        outcomes = sample_outcomes(rollout_fn([q.question for q in batch], batch_index),
                                   len(batch), samples, decode)
        grades = grader.grade_many([(q.question, q.answers, o.prediction)
                                    for q, row in zip(batch, outcomes) for o in row])
        new_results, transcripts = [], []
        for i, (q, row) in enumerate(zip(batch, outcomes)):
            result = {"id": q.id, "question": q.question, "answers": q.answers,
                      "categories": q.categories, "grader": grader.method, "samples": []}
            for s, outcome in enumerate(row):
                grade = grades[i * samples + s]
                result["samples"].append({"prediction": outcome.prediction, "grade": grade,
                                          "tool_calls": outcome.tool_calls,
                                          "worker_calls": outcome.worker_calls,
                                          "finish_reason": outcome.finish_reason})
                transcripts.append({"id": q.id, "sample": s, "prediction": outcome.prediction,
                                    "grade": grade, "agents": outcome.transcript})
            new_results.append(result)
            done[q.id] = result
        # Transcripts first: a result line is the mark that its question is finished.
        _append_jsonl(transcripts_path, transcripts)
        _append_jsonl(results_path, new_results)
    return [done[q.id] for q in questions]


def _append_jsonl(path: str, records: Sequence[dict]) -> None:
    files.append_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))
