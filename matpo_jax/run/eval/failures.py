"""Where a synthetic-world answer went wrong: the first step of its gold chain an episode missed.

An evaluation (`python -m matpo_jax.evaluate`) saves every sample's decoded contexts in
transcripts.jsonl. In the synthetic world each question's chain of hops is known (subject,
relation, the page stating the fact, the value), so a wrong answer can be traced to the first step
that failed instead of being one number; evaluate writes the table beside the transcripts
(failures.md, failures.json: `write_diagnosis`, followed by open_choices.py's table of how the
agents chose among listed pages) and into report.md. MATPO, hop by hop:

    planner   answered before this hop: it answered (or ran out of turns) before delegating it
    planner   wrong subtask: the subtask does not name this hop's subject and relation
    worker    page never listed: no search of the worker listed the page stating the fact
    worker    opened a near-duplicate's page: the page of a twin name ("Fonra Foodst" for
              "Fonra Foods"), the world's deliberate confuser, and not the right one
    worker    opened the subject's other page: a second page of the same name, without the fact
    worker    opened a page that does not exist: an id no page of the corpus has (an invented
              " (2)" second page, a misspelt name)
    worker    opened another page / opened no page
    worker    wrong value reported: the right page was opened, the report lacks the value
    planner   wrong final answer: every hop right, the boxed answer is not the gold one
    either    context full: the agent that failed the step had run out of context
              (`max_context`) - the single agent's failure mode the paper names

A single agent runs the page steps over its one context (answered before this hop: no tool call
after the previous hop's page), then the final answer. Only the
transcript is read; the decoded chat markup is Qwen3's (what matpo_jax.chat writes).
"""
from __future__ import annotations

import collections
import dataclasses
import json
import os
import re
from typing import Iterable, Mapping, Sequence

from matpo_jax.agents.rollout import MAX_CONTEXT
from matpo_jax.agents.trajectory import SINGLE, WORKER
from matpo_jax.data.oracle import listed_ids
from matpo_jax.data.synthetic_world import Hop, Question, World
from matpo_jax.report import files
from matpo_jax.run.eval import open_choices
from matpo_jax.run.eval import results as results_lib
from matpo_jax.run.eval.transcript_steps import ToolStep, tool_steps

FAILURES_MD, FAILURES_JSON = "failures.md", "failures.json"

CORRECT = "correct"
ANSWERED_EARLY = "stopped: answered before this hop"
WRONG_SUBTASK = "planner: wrong subtask"
PAGE_NOT_LISTED = "search: page never listed"
OPENED_TWIN = "open: a near-duplicate's page"
OPENED_OTHER_PAGE_OF_SUBJECT = "open: the subject's other page"
OPENED_MISSING = "open: a page that does not exist"
OPENED_OTHER = "open: another page"
OPENED_NONE = "open: no page opened"
WRONG_VALUE = "read: wrong value reported"
WRONG_FINAL_ANSWER = "planner: wrong final answer"
CONTEXT_FULL = "stopped: context full"
# Table order: the order of the steps in an episode.
STAGES = (ANSWERED_EARLY, WRONG_SUBTASK, PAGE_NOT_LISTED, OPENED_TWIN,
          OPENED_OTHER_PAGE_OF_SUBJECT, OPENED_MISSING, OPENED_OTHER, OPENED_NONE, WRONG_VALUE,
          WRONG_FINAL_ANSWER, CONTEXT_FULL, CORRECT)

@dataclasses.dataclass(frozen=True)
class Diagnosis:
    id: str
    sample: int
    hops: int
    stage: str  # one of STAGES
    hop: int | None  # 1-based hop of the failing step; None for correct or the final answer


def _mentions(text: str, phrase: str) -> bool:
    """phrase as whole words: "Nanpir Bank" is not in "Nanpir Bankk"."""
    return re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text, re.IGNORECASE) is not None


def _page_failure(steps: Sequence[ToolStep], hop: Hop, world: World) -> str | None:
    """The first page step of one hop that failed in a context's tool steps, or None."""
    opened = [str(s.arguments.get("id", "")) for s in steps if s.name == "open"]
    if hop.doc_id in opened:
        return None
    listed = {d for s in steps if s.name == "search" and s.response
              for d in listed_ids(s.response)}
    if hop.doc_id not in listed:
        return PAGE_NOT_LISTED
    if not opened:
        return OPENED_NONE
    subject = world.entity(hop.subject_id)
    missing = False
    for doc_id in opened:
        try:
            entity = world.entity(world.document(doc_id).entity_id)
        except KeyError:  # not a page of the corpus
            missing = True
            continue
        if subject.id in (entity.twin_of, entity.id) or entity.id == subject.twin_of:
            return OPENED_OTHER_PAGE_OF_SUBJECT if entity.id == subject.id else OPENED_TWIN
    return OPENED_MISSING if missing else OPENED_OTHER


def diagnose(sample: Mapping, question: Question, world: World) -> Diagnosis:
    """The first failed step of one transcripts.jsonl line (MATPO or a single agent)."""
    def result(stage, hop=None, agent=None):
        if agent is not None and agent.get("finish_reason") == MAX_CONTEXT:
            stage = CONTEXT_FULL  # it failed the step because it had no room left
        return Diagnosis(sample["id"], int(sample.get("sample", 0)), question.num_hops, stage, hop)

    if sample.get("grade") == "correct":
        return result(CORRECT)
    owner, *others = sample["agents"]
    owner_steps = tool_steps(owner["text"])
    if owner["role"] == SINGLE:
        researched = 0  # the steps up to the last hop's page
        for number, hop in enumerate(question.hops, start=1):
            if researched == len(owner_steps):
                return result(ANSWERED_EARLY, number, owner)
            failure = _page_failure(owner_steps, hop, world)
            if failure:
                return result(failure, number, owner)
            researched = 1 + max(i for i, s in enumerate(owner_steps)
                                 if s.name == "open" and s.arguments.get("id") == hop.doc_id)
        return result(WRONG_FINAL_ANSWER, None, owner)
    calls = [s for s in owner_steps if s.name == "subagent"]
    workers = [a for a in others if a["role"] == WORKER]  # in the order the planner called them
    for number, hop in enumerate(question.hops, start=1):
        if number > len(calls) or number > len(workers):
            return result(ANSWERED_EARLY, number, owner)
        subtask = str(calls[number - 1].arguments.get("subtask", ""))
        if not (_mentions(subtask, hop.subject_name) and _mentions(subtask, hop.relation)):
            return result(WRONG_SUBTASK, number)
        failure = _page_failure(tool_steps(workers[number - 1]["text"]), hop, world)
        if failure:
            return result(failure, number, workers[number - 1])
        if not _mentions(calls[number - 1].response or "", hop.answer):
            return result(WRONG_VALUE, number)
    return result(WRONG_FINAL_ANSWER)


def diagnose_all(samples: Iterable[Mapping], world: World) -> list[Diagnosis]:
    """Every sample of an evaluation's transcripts; ids must be questions of `world`."""
    questions = {q.id: q for q in world.all_questions()}
    diagnoses = []
    for line, sample in enumerate(samples, start=1):
        question = questions.get(sample.get("id"))
        if question is None:
            raise ValueError(f"transcript line {line}: question id {sample.get('id')!r} is not in "
                             "this world (was the evaluation run with another data config?)")
        diagnoses.append(diagnose(sample, question, world))
    return diagnoses


def summary(diagnoses: Sequence[Diagnosis]) -> dict:
    """Counts per stage, overall, per hop count of the question and per failing hop."""
    total = len(diagnoses)
    by_stage = collections.Counter(d.stage for d in diagnoses)
    hop_counts = sorted({d.hops for d in diagnoses})
    rows = []
    for stage in STAGES:
        if not by_stage[stage]:
            continue
        rows.append({
            "stage": stage, "samples": by_stage[stage], "share": by_stage[stage] / total,
            "by_question_hops": {h: sum(d.stage == stage and d.hops == h for d in diagnoses)
                                 for h in hop_counts},
            "at_hop": dict(sorted(collections.Counter(
                d.hop for d in diagnoses if d.stage == stage and d.hop).items()))})
    return {"samples": total, "accuracy": by_stage[CORRECT] / total if total else 0.0,
            "question_hops": {h: sum(d.hops == h for d in diagnoses) for h in hop_counts},
            "rows": rows}


def markdown(table: Mapping) -> str:
    """The summary as a table: share of all samples per stage, then per question hop count."""
    hops = list(table["question_hops"])
    head = ("| first failed step | samples | share | "
            + " | ".join(f"{h}-hop questions" for h in hops) + " | failing hop |")
    lines = [head, "|---|---:|---:|" + "---:|" * len(hops) + "---|"]
    for row in table["rows"]:
        per_hops = " | ".join(
            f"{row['by_question_hops'][h]} ({100 * row['by_question_hops'][h] / n:.1f}%)"
            if (n := table["question_hops"][h]) else "0" for h in hops)
        at = ", ".join(f"hop {k}: {v}" for k, v in row["at_hop"].items()) or "-"
        lines.append(f"| {row['stage']} | {row['samples']} | {100 * row['share']:.1f}% | "
                     f"{per_hops} | {at} |")
    return "\n".join(lines) + "\n"


def write_diagnosis(out_dir: str, world: World) -> str:
    """Diagnoses <out_dir>/transcripts.jsonl (an evaluation of `world`'s questions); writes
    failures.md and failures.json beside it (the failure table, then how the agents chose among
    listed pages: open_choices.py) and returns the markdown."""
    samples = results_lib.read_results(os.path.join(out_dir, results_lib.TRANSCRIPTS_FILE))
    table = summary(diagnose_all(samples, world))
    questions = {q.id: q for q in world.all_questions()}
    table["open_choices"] = open_choices.summary(samples, questions, world)
    text = markdown(table)
    if table["open_choices"]:
        text += ("\nPages opened when a search listed the hop's page (every hop, right answers "
                 "too):\n\n" + open_choices.markdown(table["open_choices"]))
    files.write_text_atomic(os.path.join(out_dir, FAILURES_MD), text)
    files.write_text_atomic(os.path.join(out_dir, FAILURES_JSON), json.dumps(table, indent=1))
    return text
