"""How an agent chose among the pages a search listed: the synthetic world's one real choice.

The failure table (failures.py) counts each wrong answer once, at its first failed step; a wrong
page opened on the way to a right answer (the search snippet often shows the fact too) is not in
it. This table counts every hop whose page a search listed, by what else that listing offered,
and what the agent opened next:

    listing      only this subject's page          no other page of the subject, no twin name
                 the subject's other page too, fact on the first / on the second page
                                                   ("page X" and "page X (2)" both listed)
                 a near-duplicate's page too       "Fonra Foodst" listed beside "Fonra Foods"
    opened       right page first / right page after a wrong one / never the right page

A hop's listing is the first search of the hop's agent (its worker; a single agent: the first
search after the previous hop's page) that listed the page, and its opens are those up to that
agent's next search. Written into failures.md and failures.json beside the failure table.
"""
from __future__ import annotations

import collections
from typing import Mapping, Sequence

from matpo_jax.agents.trajectory import SINGLE, WORKER
from matpo_jax.data.oracle import listed_ids
from matpo_jax.data.synthetic_world import Hop, Question, World
from matpo_jax.run.eval.transcript_steps import ToolStep, tool_steps

ONLY_SUBJECT = "only this subject's page"
OTHER_PAGE_FACT_FIRST = "the subject's other page too, fact on the first page"
OTHER_PAGE_FACT_SECOND = "the subject's other page too, fact on the second page"
TWIN_LISTED = "a near-duplicate's page too"
LISTINGS = (ONLY_SUBJECT, OTHER_PAGE_FACT_FIRST, OTHER_PAGE_FACT_SECOND, TWIN_LISTED)

RIGHT_FIRST = "right page first"
RIGHT_AFTER_WRONG = "right page after a wrong one"
NEVER_RIGHT = "never the right page"
OUTCOMES = (RIGHT_FIRST, RIGHT_AFTER_WRONG, NEVER_RIGHT)


def listing_kind(hop: Hop, listed: Sequence[str], world: World) -> str:
    """What the listing offered besides the hop's page (a twin outranks a second page)."""
    subject = world.entity(hop.subject_id)
    kinds = set()
    for doc_id in listed:
        if doc_id == hop.doc_id:
            continue
        try:
            entity = world.entity(world.document(doc_id).entity_id)
        except KeyError:
            continue
        if entity.id == subject.id:
            kinds.add("other page")
        elif subject.id == entity.twin_of or entity.id == subject.twin_of:
            kinds.add("twin")
    if "twin" in kinds:
        return TWIN_LISTED
    if "other page" in kinds:
        # second pages are "page X (2)": the first page's id is the bare name
        return OTHER_PAGE_FACT_SECOND if hop.doc_id.endswith(")") else OTHER_PAGE_FACT_FIRST
    return ONLY_SUBJECT


def _choice(steps: Sequence[ToolStep], start: int, hop: Hop, world: World):
    """(listing kind, outcome, index after the opens) of the first search from `start` listing
    the hop's page, or None if no such search."""
    for i in range(start, len(steps)):
        step = steps[i]
        if step.name != "search" or not step.response:
            continue
        listed = listed_ids(step.response)
        if hop.doc_id not in listed:
            continue
        opens = []
        end = i + 1
        while end < len(steps) and steps[end].name != "search":
            if steps[end].name == "open":
                opens.append(str(steps[end].arguments.get("id", "")))
            end += 1
        if opens[:1] == [hop.doc_id]:
            outcome = RIGHT_FIRST
        elif hop.doc_id in opens:
            outcome = RIGHT_AFTER_WRONG
        else:
            outcome = NEVER_RIGHT
        return listing_kind(hop, listed, world), outcome, end
    return None


def choices(sample: Mapping, question: Question, world: World) -> list[tuple[str, str]]:
    """(listing kind, outcome) of each hop of one transcripts.jsonl line whose page was listed."""
    owner, *others = sample["agents"]
    found = []
    if owner["role"] == SINGLE:
        steps, start = tool_steps(owner["text"]), 0
        for hop in question.hops:
            choice = _choice(steps, start, hop, world)
            if choice is None:
                break
            found.append(choice[:2])
            start = choice[2]
        return found
    workers = [a for a in others if a["role"] == WORKER]
    for hop, worker in zip(question.hops, workers):
        choice = _choice(tool_steps(worker["text"]), 0, hop, world)
        if choice is not None:
            found.append(choice[:2])
    return found


def summary(samples: Sequence[Mapping], questions: Mapping[str, Question], world: World) -> dict:
    """{listing kind: {outcome: hops}} over all samples, in LISTINGS x OUTCOMES order."""
    counts = collections.Counter(
        c for sample in samples for c in choices(sample, questions[sample["id"]], world))
    return {kind: {outcome: counts[(kind, outcome)] for outcome in OUTCOMES}
            for kind in LISTINGS if any(counts[(kind, o)] for o in OUTCOMES)}


def markdown(table: Mapping[str, Mapping[str, int]]) -> str:
    lines = ["| the listing showed the hop's page and | hops | " + " | ".join(OUTCOMES) + " |",
             "|---|---:|" + "---:|" * len(OUTCOMES)]
    for kind, row in table.items():
        total = sum(row.values())
        cells = " | ".join(f"{row[o]} ({100 * row[o] / total:.0f}%)" for o in OUTCOMES)
        lines.append(f"| {kind} | {total} | {cells} |")
    return "\n".join(lines) + "\n"
