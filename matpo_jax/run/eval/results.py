"""A benchmark's per-question results on disk, written as they come, read back on resume.

In a dataset's directory:
    results.jsonl      one line per question: id, question, answers, categories, grader, and per
                       sample the prediction, grade, tool calls and worker calls
    transcripts.jsonl  one line per sample: the decoded contexts of the planner (or single agent)
                       and of every worker it called
A batch's lines are appended once the batch is graded, transcripts first: a result line is the
mark that its question is finished. A line cut by an interruption is dropped on resume, and so
are the transcripts of questions without a result line.
"""
from __future__ import annotations

import io
import json
import logging
import os
from typing import Sequence

from matpo_jax.report import files
from matpo_jax.run.eval.grading import Grader

log = logging.getLogger(__name__)

RESULTS_FILE, TRANSCRIPTS_FILE = "results.jsonl", "transcripts.jsonl"


def read_results(path: str) -> list[dict]:
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


def rewrite_jsonl(path: str, records: Sequence[dict]) -> None:
    files.write_text_atomic(path, "".join(json.dumps(r, ensure_ascii=False) + "\n"
                                          for r in records))


def append_jsonl(path: str, records: Sequence[dict]) -> None:
    files.append_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def keep_transcripts_of(path: str, ids: set[str]) -> None:
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
        rewrite_jsonl(path, kept)


def regrade_failures(results: list[dict], grader: Grader) -> int:
    """Grades again the samples whose judge failed before; returns how many are still failed."""
    todo = [(r, s) for r in results for s in r["samples"] if s["grade"] is None]
    if not todo:
        return 0
    grades = grader.grade_many([(r["question"], r["answers"], s["prediction"]) for r, s in todo])
    for (_, sample), grade in zip(todo, grades):
        sample["grade"] = grade
    return sum(g is None for g in grades)


def resume(out_dir: str, grader: Grader, samples: int, *, regrade: bool = True) -> list[dict]:
    """The results already in `out_dir` (judge failures graded again when `regrade`), after
    checking they were sampled and graded as this evaluation asks; transcripts without a result
    line are dropped."""
    results_path = os.path.join(out_dir, RESULTS_FILE)
    earlier = read_results(results_path)
    for result in earlier:  # one directory, one way of sampling and grading
        if len(result["samples"]) != samples or result.get("grader") != grader.method:
            raise ValueError(f"{results_path}: question {result['id']!r} has "
                             f"{len(result['samples'])} samples graded by "
                             f"{result.get('grader')}, this run asks for {samples} graded by "
                             f"{grader.method}; evaluate into another directory")
    keep_transcripts_of(os.path.join(out_dir, TRANSCRIPTS_FILE), {r["id"] for r in earlier})
    if regrade and any(s["grade"] is None for r in earlier for s in r["samples"]):
        still = regrade_failures(earlier, grader)
        rewrite_jsonl(results_path, earlier)
        log.info("%s: re-graded earlier judge failures, %d still failed", out_dir, still)
    return earlier
