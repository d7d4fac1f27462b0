"""A benchmark's per-question results on disk, written as they come, read back on resume.

In a dataset's directory:
    results.jsonl      one line per question: id, question, answers, categories, grader, and per
                       sample the prediction, grade, tool calls and worker calls
    transcripts.jsonl  one line per sample: the decoded contexts of the planner (or single agent)
                       and of every worker it called
A batch's lines are appended once the batch is graded, transcripts first: a result line is the
mark that its question is finished. A last line cut by an interruption is dropped on resume, and
so are the transcripts of questions without a result line; any other unreadable line stops the
resume naming it. Every result line records what produced it (`source`: the checkpoint, step and
hashes, benchmark.evaluate_dataset): a resume with another source is refused.
"""
from __future__ import annotations

import io
import json
import logging
import os
from typing import Sequence

from matpo_jax.config import ConfigError
from matpo_jax.report import files
from matpo_jax.run.eval.grading import Grader

log = logging.getLogger(__name__)

RESULTS_FILE, TRANSCRIPTS_FILE = "results.jsonl", "transcripts.jsonl"


class ResultsError(ConfigError):
    """A results file this evaluation cannot resume from (one line naming the file and line)."""


def read_results(path: str) -> list[dict]:
    """The JSON lines (results, transcripts) of an earlier run. The last line, cut by an interruption (no newline, or not
    JSON), is dropped and cut off; any other unreadable line is an error naming it: the lines
    after it were written later, so it was not cut, and nothing is dropped."""
    if not files.run_path(path).exists():
        return []
    results, keep_bytes = [], 0
    data = files.run_path(path).read_bytes()
    lines = list(io.BytesIO(data))  # the lines, each with its newline, as a file gives them
    for number, raw in enumerate(lines, start=1):
        try:
            if not raw.endswith(b"\n"):  # written lines end in one: this one was cut
                raise ValueError("no newline at its end")
            result = json.loads(raw)
            if not isinstance(result, dict):
                raise ValueError("not a JSON object")
        except ValueError as error:  # JSONDecodeError included
            reason = " ".join(str(error).split())[:120]
            if number < len(lines):
                raise ResultsError(
                    f"{path}:{number}: unreadable result line ({reason}); {len(lines) - number} "
                    "line(s) follow it, so no interruption cut it: repair or delete that line "
                    "(results are never dropped)") from None
            log.warning("%s:%d: dropping the last line, cut by an interruption (%s)", path,
                        number, reason)
            break
        results.append(result)
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


def check_source(results_path: str, earlier: list[dict], grader: Grader, samples: int,
                 source: dict) -> None:
    """One directory, one evaluation: every earlier result was sampled from the same parameters
    with the same settings (`source`, benchmark.evaluate_dataset) and graded the same way;
    ResultsError names the first line that was not."""
    for number, result in enumerate(earlier, start=1):
        where = f"{results_path}:{number}: question {result['id']!r}"
        if len(result["samples"]) != samples or result.get("grader") != grader.method:
            raise ResultsError(f"{where} has {len(result['samples'])} samples graded by "
                               f"{result.get('grader')}, this run asks for {samples} graded by "
                               f"{grader.method}; evaluate into another directory")
        theirs = result.get("source")
        if theirs == source:
            continue
        if not isinstance(theirs, dict):
            raise ResultsError(f"{where} records no source (written before results recorded "
                               "the checkpoint they were sampled from): its answers cannot be "
                               "told apart from another checkpoint's; evaluate into another "
                               "directory")
        key = next(k for k in sorted(set(theirs) | set(source))
                   if theirs.get(k) != source.get(k))
        raise ResultsError(f"{where} was evaluated with {key} = {theirs.get(key)!r}, this "
                           f"evaluation has {source.get(key)!r}: results of other parameters "
                           "or settings are never mixed; evaluate into another directory")


def set_aside(out_dir: str, reason: str) -> None:
    """Moves an evaluation's files to `<name>.stale[-N]` beside them (nothing is deleted)."""
    for name in (RESULTS_FILE, TRANSCRIPTS_FILE):
        path = files.run_path(out_dir, name)
        if not path.exists():
            continue
        target, n = files.run_path(out_dir, f"{name}.stale"), 1
        while target.exists():
            n += 1
            target = files.run_path(out_dir, f"{name}.stale-{n}")
        files.write_bytes_atomic(str(target), path.read_bytes())
        path.unlink()
    log.warning("%s: %s; its earlier results set aside as *.stale, evaluating anew", out_dir,
                reason)


def resume(out_dir: str, grader: Grader, samples: int, source: dict | None = None, *,
           regrade: bool = True, restart_stale: bool = False) -> list[dict]:
    """The results already in `out_dir` (judge failures graded again when `regrade`), after
    checking they were produced as this evaluation asks (`check_source`); transcripts without a
    result line are dropped. Results of another source are refused, or, with `restart_stale`
    (a directory the caller owns: a run's own eval/<tag>/), set aside and evaluated anew."""
    results_path = os.path.join(out_dir, RESULTS_FILE)
    earlier = read_results(results_path)
    try:
        check_source(results_path, earlier, grader, samples, dict(source or {}))
    except ResultsError as error:
        if not restart_stale:
            raise
        set_aside(out_dir, str(error))
        return []
    keep_transcripts_of(os.path.join(out_dir, TRANSCRIPTS_FILE), {r["id"] for r in earlier})
    if regrade and any(s["grade"] is None for r in earlier for s in r["samples"]):
        still = regrade_failures(earlier, grader)
        rewrite_jsonl(results_path, earlier)
        log.info("%s: re-graded earlier judge failures, %d still failed", out_dir, still)
    return earlier
