"""Scripted demonstrations of the three roles (planner, worker, single agent) for warm-start SFT.

The oracle knows a question's gold hop chain, but it ACTS THROUGH REAL TOOLS: it calls
`search(query=..., num=...)` and `open(id=...)` (the tool clients of matpo_jax.tools.clients, or
`LocalCorpusTools` below) and writes their output verbatim into the conversation, so a
demonstration shows exactly the text a model sees at rollout time. It opens a page only after
that page's id appeared in a search result it received; when search never surfaces the gold page
the demonstration is marked `solved=False` (filter those out of SFT data).

Conversations are OpenAI-style message lists in Qwen3 tool conventions: an assistant turn that
calls a tool holds `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`; tool results
are {"role": "tool"} messages. Imperfection knobs insert the detours a real agent takes (an
off-target search, opening a wrong result first) so SFT does not teach a model that every first
try succeeds.
"""
from __future__ import annotations

import dataclasses
import random
import re
from typing import Callable, Sequence

from matpo_jax.agents import prompts
from matpo_jax.agents.trajectory import PLANNER, SINGLE, WORKER
from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA, SUBAGENT_SCHEMA
from matpo_jax.data.synthetic_world import RELATION_BY_PHRASE, Document, Hop, Question, plain_template
from matpo_jax.chat import ChatFormat, format_tool_call

SearchFn = Callable[..., str]  # search(query: str, num: int) -> result text
OpenFn = Callable[..., str]  # open(id: str) -> page text
# Page ids in a search listing: the tools' '1. Title (id: "X")' lines or LocalSearch's "[1] X | Title".
LISTED_ID = re.compile(r'\(id: "(.+?)"\)$|^\[\d+\] (.+?) \|', re.MULTILINE)


def listed_ids(listing: str) -> list[str]:
    return [a or b for a, b in LISTED_ID.findall(listing)]


@dataclasses.dataclass(frozen=True)
class Imperfection:
    """Per-hop probabilities of a detour (0 everywhere = the shortest correct path)."""

    wasted_search: float = 0.0  # an off-target search before the right query
    wrong_open: float = 0.0  # open another listed result (another entity or page) first

    def __post_init__(self):
        for field in dataclasses.fields(self):
            if not 0.0 <= getattr(self, field.name) <= 1.0:
                raise ValueError(f"Imperfection.{field.name} must be a probability in [0, 1]")


@dataclasses.dataclass(frozen=True)
class RolePrompts:
    """The texts a demonstration is written with; the defaults come from agents/prompts.py."""

    planner_system: str
    worker_system: str
    single_system: str
    question: Callable[[str], str] = prompts.question_prompt
    recap: Callable[[str, str], str] = prompts.worker_recap
    # The instruction of the worker's no-tools summary turn; None: no such turn, the worker's
    # last turn is its report (as `rollout.final_summary=False` does at rollout time).
    final_summary: str | None = prompts.FINAL_SUMMARY_INSTRUCTION
    report_max_chars: int = 2000  # the cap the planner's tool response gets (clean_report)


def subtask_only(main_task: str, subtask: str) -> str:
    """A worker's user message without the planner's question (`rollout.user_query_recap=False`)."""
    del main_task
    return subtask


def default_prompts(report_max_chars: int = 2000, *, user_query_recap: bool = True,
                    final_summary: bool = True) -> RolePrompts:
    """Role texts from agents/prompts.py with each role's tool schemas in its system prompt; the
    two switches are the rollout's, so an ablation's demonstrations read like its rollouts."""
    worker_tools, planner_tools = [SEARCH_SCHEMA, OPEN_SCHEMA], [SUBAGENT_SCHEMA]
    return RolePrompts(
        planner_system=ChatFormat.system_prompt(prompts.ROLE_TEXT[PLANNER], planner_tools),
        worker_system=ChatFormat.system_prompt(prompts.ROLE_TEXT[WORKER], worker_tools),
        single_system=ChatFormat.system_prompt(prompts.ROLE_TEXT[SINGLE], worker_tools),
        recap=prompts.worker_recap if user_query_recap else subtask_only,
        final_summary=prompts.FINAL_SUMMARY_INSTRUCTION if final_summary else None,
        report_max_chars=report_max_chars)


@dataclasses.dataclass
class Demonstration:
    role: str  # PLANNER | WORKER | SINGLE
    messages: list[dict]
    answer: str | None  # planner/single: the boxed answer; worker: the fact it found
    solved: bool  # every hop's gold page was reached through the tools
    workers: list["Demonstration"] = dataclasses.field(default_factory=list)  # planner only
    report: str | None = None  # worker: the cleaned report the planner receives


def hop_queries(hop: Hop, num_results: int = 5, max_results: int = 10) -> list[tuple[str, int]]:
    """The (query, num) searches the oracle issues for one hop until the fact's page is listed:
    name + relation, then the name alone with more results (a relation word can pull in other
    entities' pages that use it, while the subject's page may phrase the fact without it)."""
    # "the employer of Tarvo Lind": relation and name follow a space, as in the subtask, so they
    # are the same tokens there and here (a tiny model learns to copy token for token).
    return [(f"the {hop.relation} of {hop.subject_name}", num_results),
            (hop.subject_name, min(2 * num_results, max_results))]


def conversations(demo: Demonstration) -> list[tuple[str, list[dict]]]:
    """(role, messages) of a demonstration and of the workers it spawned: SFT examples."""
    return [(demo.role, demo.messages)] + [pair for w in demo.workers for pair in conversations(w)]


def final_answer(answer: str) -> str:
    """The closing turn. The space after the brace makes the answer the same tokens as in the
    report it is copied from (" Tarvo Lind", not "Tarvo Lind"); extract_boxed strips it."""
    return f"The answer is \\boxed{{ {answer}}}."


def _assistant(text: str) -> dict:
    return {"role": "assistant", "content": text}


def _tool(text: str) -> dict:
    return {"role": "tool", "content": text}


class Oracle:
    """Writes demonstrations by running a scripted policy against real tools."""

    def __init__(self, search: SearchFn, open_page: OpenFn, *, role_prompts: RolePrompts | None = None,
                 imperfection: Imperfection = Imperfection(), num_results: int = 5,
                 max_results: int = 10, seed: int = 0, fact_style: str = "varied",
                 single_states_facts: bool = True, report_fact_first: bool = False):
        self.search = search
        # The final summary's order: "Fact: ... Conclusion: <value>." puts the value right
        # after the fact line it is copied from (docs/repro/README.md, the summary ablation).
        self.report_fact_first = report_fact_first
        self.fact_style = fact_style  # the world's (synthetic_world.FACT_STYLES): how facts read
        # The single agent writes each hop's fact line as a worker does (see single()).
        self.single_states_facts = single_states_facts
        self.open_page = open_page
        self.prompts = role_prompts or default_prompts()
        self.imperfection = imperfection
        self.num_results = num_results
        self.max_results = max_results  # the search schema's maximum for `num`
        self.seed = seed  # only the imperfection draws are random

    # ------------------------------------------------------------------------ one hop, in place
    def _rng(self, *key: str) -> random.Random:
        # One stream per demonstration, seeded by a string (deterministic, unlike hash()), so a
        # demonstration does not depend on which others were written before it.
        return random.Random(":".join((str(self.seed),) + key))

    def _research_hop(self, hop: Hop, messages: list[dict], rng: random.Random) -> bool:
        """Appends the searches/opens that find `hop`'s fact; True when its page was opened."""
        if rng.random() < self.imperfection.wasted_search:
            vague = rng.choice([hop.relation, hop.subject_name.split(" ")[0]])
            self._call(messages, "search", {"query": vague, "num": self.num_results})
        for query, num in hop_queries(hop, self.num_results, self.max_results):
            listed = listed_ids(self._call(messages, "search", {"query": query, "num": num}))
            if hop.doc_id not in listed:
                continue
            wrong = [d for d in listed if d != hop.doc_id]
            if wrong and rng.random() < self.imperfection.wrong_open:
                self._call(messages, "open", {"id": rng.choice(wrong)})
            page = self._call(messages, "open", {"id": hop.doc_id})
            return hop.answer in page
        return False

    def _call(self, messages: list[dict], name: str, arguments: dict) -> str:
        messages.append(_assistant(format_tool_call(name, arguments)))
        tool = self.search if name == "search" else self.open_page
        result = tool(**arguments)
        text = result if isinstance(result, str) else result.text  # plain text or a ToolResult
        messages.append(_tool(text))
        return text

    # ---------------------------------------------------------------------------------- roles
    def worker(self, main_task: str, hop: Hop, rng: random.Random | None = None) -> Demonstration:
        """Worker: research one hop, state the fact, then write the final report when asked."""
        rng = rng or self._rng(main_task, hop.subtask)
        messages = [{"role": "system", "content": self.prompts.worker_system},
                    {"role": "user", "content": self.prompts.recap(main_task, hop.subtask)}]
        solved = self._research_hop(hop, messages, rng)
        fact, statement = self._fact(hop)
        if not solved:
            statement = f"I could not find the {hop.relation} of {hop.subject_name}."
        messages.append(_assistant(statement))
        if self.prompts.final_summary is None:  # the statement is the report
            report = statement
        else:
            if not solved:
                report = (f"Conclusion: not found. The {hop.relation} of {hop.subject_name} "
                          "is unknown.")
            elif self.report_fact_first:
                report = f"Fact: {fact} Conclusion: {hop.answer}. Source: {hop.doc_id}."
            else:
                report = f"Conclusion: {hop.answer}. Fact: {fact} Source: {hop.doc_id}."
            messages += [{"role": "user", "content": self.prompts.final_summary},
                         _assistant(report)]
        return Demonstration(role=WORKER, messages=messages, answer=hop.answer if solved else None,
                             solved=solved,
                             report=prompts.clean_report(report, self.prompts.report_max_chars))

    def planner(self, question: Question) -> Demonstration:
        """Planner: one subagent call per hop, each subtask naming the entity found so far."""
        messages = [{"role": "system", "content": self.prompts.planner_system},
                    {"role": "user", "content": self.prompts.question(question.question)}]
        workers, rng = [], self._rng(PLANNER, question.id)
        for hop in question.hops:
            messages.append(_assistant(format_tool_call("subagent", {"subtask": hop.subtask})))
            worker = self.worker(question.question, hop, rng)
            workers.append(worker)
            messages.append(_tool(worker.report))
            if not worker.solved:
                break
        solved = all(w.solved for w in workers) and len(workers) == question.num_hops
        answer = workers[-1].answer if solved else "unknown"
        messages.append(_assistant(final_answer(answer)))
        return Demonstration(role=PLANNER, messages=messages, answer=answer, solved=solved,
                             workers=workers)

    def _fact(self, hop: Hop) -> tuple[str, str]:
        """(the fact, the statement of it) for a hop whose page was read."""
        if self.fact_style == "plain":  # the page's own line, so the reader copies it
            fact = plain_template(RELATION_BY_PHRASE[hop.relation]).format(
                s=hop.subject_name, o=hop.answer)
            return fact, f"Fact: {fact}"
        fact = f"The {hop.relation} of {hop.subject_name} is {hop.answer}."
        return fact, fact

    def single(self, question: Question) -> Demonstration:
        """Single agent: every search and open of every hop in one context. With
        single_states_facts it states each fact line it read as a worker does, at the start of
        its next turn (before the next hop's first call, or before the answer): a turn without a
        tool call would end its episode. So it reads a page the way the warm start learnt to, and
        copies the answer from its own statement, as a planner copies it from a report."""
        messages = [{"role": "system", "content": self.prompts.single_system},
                    {"role": "user", "content": self.prompts.question(question.question)}]
        rng = self._rng(SINGLE, question.id)
        solved, statement = True, None
        for hop in question.hops:
            first = len(messages)
            if not self._research_hop(hop, messages, rng):
                solved = False
                break
            if statement is not None:
                messages[first]["content"] = f"{statement}\n{messages[first]['content']}"
            statement = self._fact(hop)[1] if self.single_states_facts else None
        answer = question.answer if solved else "unknown"
        closing = final_answer(answer)
        if solved and statement is not None:
            closing = f"{statement}\n{closing}"
        messages.append(_assistant(closing))
        return Demonstration(role=SINGLE, messages=messages, answer=answer, solved=solved)


class LocalCorpusTools:
    """In-process BM25 `search` / `open` over a corpus, behind the same call signatures as the
    HTTP tool clients: for tests, and for writing demonstrations without starting a server.
    Prefer the real clients for SFT data that must match rollout-time tool text exactly."""

    def __init__(self, documents: Sequence[Document], snippet_chars: int = 240):
        import bm25s  # heavy import, only when the local index is used

        self.documents = list(documents)
        self._by_id = {d.id: d for d in self.documents}
        self.snippet_chars = snippet_chars
        tokens = bm25s.tokenize([f"{d.title} {d.contents}" for d in self.documents],
                                stopwords="en", show_progress=False)
        self._bm25 = bm25s.BM25()
        self._bm25.index(tokens, show_progress=False)
        self._tokenize = bm25s.tokenize

    def search_ids(self, query: str, num: int) -> list[str]:
        tokens = self._tokenize([query], stopwords="en", show_progress=False)
        if not tokens.vocab:  # a query of stopwords only
            return []
        k = min(int(num), len(self.documents))
        indices, scores = self._bm25.retrieve(tokens, k=k, show_progress=False)
        return [self.documents[int(i)].id for i, s in zip(indices[0], scores[0]) if s > 0]

    def search(self, query: str, num: int = 5) -> str:
        lines = []
        for rank, doc_id in enumerate(self.search_ids(query, num), start=1):
            doc = self._by_id[doc_id]
            snippet = doc.contents[: self.snippet_chars]
            lines.append(f"[{rank}] {doc.id} | {doc.title}\n{snippet}")
        return "\n".join(lines) if lines else "No results."

    def open(self, id: str) -> str:  # noqa: A002 - the tool's argument name
        doc = self._by_id.get(id)
        return f"{doc.id} | {doc.title}\n{doc.contents}" if doc else f"Error: no page with id {id}."
