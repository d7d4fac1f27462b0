import json

import pytest

from matpo_jax.agents import prompts
from matpo_jax.tools.schemas import OPEN_SCHEMA, SEARCH_SCHEMA, SUBAGENT_SCHEMA
from matpo_jax.data import oracle as oracle_lib
from matpo_jax.data.oracle import Imperfection, LocalCorpusTools, Oracle
from matpo_jax.chat import extract_boxed, parse_tool_call

SEARCH, OPEN, SUBAGENT = SEARCH_SCHEMA, OPEN_SCHEMA, SUBAGENT_SCHEMA
PROMPTS = oracle_lib.RolePrompts(planner_system="PLANNER", worker_system="WORKER",
                                 single_system="SINGLE")


class RecordingTools:
    """Wraps the local tools and records every call, to check that demonstrations hold real output."""

    def __init__(self, tools):
        self.tools, self.calls = tools, []

    def search(self, query, num):
        out = self.tools.search(query, num)
        self.calls.append(("search", {"query": query, "num": num}, out))
        return out

    def open(self, id):  # noqa: A002
        out = self.tools.open(id)
        self.calls.append(("open", {"id": id}, out))
        return out


def _sample(world, per_hop=6):
    picked = []
    for k in (1, 2, 3, 4):
        picked += [q for q in world.questions["test"] if q.num_hops == k][:per_hop]
        picked += [q for q in world.questions["train"] if q.num_hops == k][:per_hop]
    return picked


def _tool_calls(messages, tools):
    return [parse_tool_call(m["content"], tools) for m in messages
            if m["role"] == "assistant" and "<tool_call>" in m["content"]]


def test_each_hop_fact_is_in_the_bm25_top_k_of_the_oracle_queries(world, noisy_world, noisy_tools):
    clean_tools = LocalCorpusTools(world.documents)
    for q in _sample(world):  # clean pages: the first query always lists the fact's page
        for hop in q.hops:
            query, num = oracle_lib.hop_queries(hop)[0]
            assert hop.doc_id in clean_tools.search_ids(query, num), (query, hop)
    for q in _sample(noisy_world):  # noisy pages: the retry may be needed
        for hop in q.hops:
            listed = [d for query, num in oracle_lib.hop_queries(hop)
                      for d in noisy_tools.search_ids(query, num)]
            assert hop.doc_id in listed, hop


def test_planner_reaches_gold_through_the_tools(noisy_world, noisy_tools):
    recorder = RecordingTools(noisy_tools)
    oracle = Oracle(recorder.search, recorder.open, role_prompts=PROMPTS)
    for q in _sample(noisy_world):
        recorder.calls.clear()
        demo = oracle.planner(q)
        assert demo.solved and demo.answer == q.answer
        final = demo.messages[-1]
        assert final["role"] == "assistant" and extract_boxed(final["content"]) == q.answer
        calls = _tool_calls(demo.messages, [SUBAGENT])
        assert [c.arguments["subtask"] for c in calls] == [h.subtask for h in q.hops]
        for call, prev in zip(calls[1:], q.hops):  # each subtask names the entity just found
            assert prev.answer in call.arguments["subtask"]
        reports = [m["content"] for m in demo.messages if m["role"] == "tool"]
        assert reports == [w.report for w in demo.workers]
        for worker, hop in zip(demo.workers, q.hops):
            assert hop.answer in worker.report and len(worker.report) < 200
            assert worker.messages[1]["content"] == prompts.worker_recap(q.question, hop.subtask)
        # Tool messages are exactly what the tools returned, call for call.
        worker_calls = [(c.name, c.arguments) for w in demo.workers
                        for c in _tool_calls(w.messages, [SEARCH, OPEN])]
        worker_results = [m["content"] for w in demo.workers for m in w.messages if m["role"] == "tool"]
        assert worker_calls == [(name, args) for name, args, _ in recorder.calls]
        assert worker_results == [out for _, _, out in recorder.calls]


def test_worker_opens_only_pages_it_was_shown_and_the_page_holds_the_fact(noisy_world, noisy_tools):
    oracle = Oracle(noisy_tools.search, noisy_tools.open, role_prompts=PROMPTS,
                    imperfection=Imperfection(wasted_search=0.5, wrong_open=0.5), seed=3)
    for q in _sample(noisy_world, per_hop=3):
        for hop in q.hops:
            demo = oracle.worker(q.question, hop)
            assert demo.solved and demo.answer == hop.answer
            seen = ""
            for message in demo.messages:
                if message["role"] == "tool":
                    seen += message["content"]
                elif message["role"] == "assistant" and '"open"' in message["content"]:
                    opened = parse_tool_call(message["content"], [SEARCH, OPEN]).arguments["id"]
                    assert opened in seen
            last_page = [m["content"] for m in demo.messages if m["role"] == "tool"][-1]
            assert hop.answer in last_page and last_page.startswith(hop.doc_id)
            assert demo.messages[-2] == {"role": "user", "content": prompts.FINAL_SUMMARY_INSTRUCTION}


def test_single_agent_does_every_hop_itself(noisy_world, noisy_tools):
    oracle = Oracle(noisy_tools.search, noisy_tools.open, role_prompts=PROMPTS)
    for q in _sample(noisy_world, per_hop=3):
        demo = oracle.single(q)
        assert demo.solved and extract_boxed(demo.messages[-1]["content"]) == q.answer
        calls = _tool_calls(demo.messages, [SEARCH, OPEN])
        assert [c.arguments["id"] for c in calls if c.name == "open"] == [h.doc_id for h in q.hops]
        assert demo.messages[0]["content"] == "SINGLE"
        assert demo.messages[1]["content"] == prompts.question_prompt(q.question)


def test_imperfection_adds_detours_deterministically(world):
    q = [q for q in world.questions["test"] if q.num_hops == 4][0]
    tools = LocalCorpusTools(world.documents)

    def run(imperfection, seed):
        return Oracle(tools.search, tools.open, role_prompts=PROMPTS,
                      imperfection=imperfection, seed=seed).single(q)

    perfect = run(Imperfection(), 0)
    clumsy = run(Imperfection(wasted_search=1.0, wrong_open=1.0), 0)
    n_perfect = len(_tool_calls(perfect.messages, [SEARCH, OPEN]))
    calls = _tool_calls(clumsy.messages, [SEARCH, OPEN])
    assert n_perfect == 2 * q.num_hops
    assert len(calls) == 4 * q.num_hops  # + one wasted search and one wrong open per hop
    assert clumsy.solved and clumsy.answer == q.answer
    assert run(Imperfection(0.5, 0.5), 11).messages == run(Imperfection(0.5, 0.5), 11).messages
    seeds = {json.dumps(run(Imperfection(0.5, 0.5), seed).messages) for seed in range(6)}
    assert len(seeds) > 1  # the seed drives the detours


def test_demonstrations_do_not_depend_on_call_order(world):
    tools = LocalCorpusTools(world.documents)
    oracle = Oracle(tools.search, tools.open, role_prompts=PROMPTS,
                    imperfection=Imperfection(0.5, 0.5), seed=2)
    a, b = world.questions["test"][:2]
    first = oracle.planner(a).messages
    oracle.planner(b)
    assert oracle.planner(a).messages == first


def test_unreachable_fact_is_marked_unsolved(world):
    oracle = Oracle(lambda query, num: "No results.", lambda id: "Error", role_prompts=PROMPTS)
    q = [q for q in world.questions["train"] if q.num_hops == 2][0]
    demo = oracle.planner(q)
    assert not demo.solved and len(demo.workers) == 1 and demo.workers[0].answer is None
    assert extract_boxed(demo.messages[-1]["content"]) == "unknown"


def test_conversations_flatten_planner_and_workers(world):
    tools = LocalCorpusTools(world.documents)
    q = [q for q in world.questions["validation"] if q.num_hops == 3][0]
    demo = Oracle(tools.search, tools.open, role_prompts=PROMPTS).planner(q)
    roles = [role for role, _ in oracle_lib.conversations(demo)]
    assert roles == ["planner", "worker", "worker", "worker"]
    for _, messages in oracle_lib.conversations(demo):
        assert {m["role"] for m in messages} <= {"system", "user", "assistant", "tool"}
        json.dumps(messages)  # plain data


def test_default_prompts_describe_each_roles_tools():
    role_prompts = oracle_lib.default_prompts()
    assert '"subagent"' in role_prompts.planner_system and '"search"' not in role_prompts.planner_system
    for text in (role_prompts.worker_system, role_prompts.single_system):
        assert '"search"' in text and '"open"' in text and '"subagent"' not in text
    assert role_prompts.worker_system.startswith(prompts.WORKER_ROLE)


def test_imperfection_must_be_probabilities():
    with pytest.raises(ValueError, match="wrong_open"):
        Imperfection(wrong_open=1.5)


def test_listed_ids_reads_both_listing_formats_including_second_pages():
    from matpo_jax.data.oracle import listed_ids

    tools_listing = ('1. Kager Labs (id: "Kager Labs")\nKager Labs is a bank.\n'
                     '2. Kager Labs (id: "Kager Labs (2)")\nMore about Kager Labs (a bank).')
    assert listed_ids(tools_listing) == ["Kager Labs", "Kager Labs (2)"]
    local_listing = "[1] Kager Labs (2) | Kager Labs\nMore about it.\n[2] Vop Ren | Vop Ren\nA pilot."
    assert listed_ids(local_listing) == ["Kager Labs (2)", "Vop Ren"]


def test_plain_worker_states_the_page_line_whose_value_follows_the_relation(small_world_kwargs):
    from matpo_jax.data.synthetic_world import build_world
    plain = build_world(seed=7, noise=0.3, fact_style="plain", **small_world_kwargs)
    tools = LocalCorpusTools(plain.documents)
    oracle = Oracle(tools.search, tools.open, role_prompts=PROMPTS, fact_style="plain")
    for q in _sample(plain, per_hop=3):
        for hop in q.hops:
            demo = oracle.worker(q.question, hop)
            statement = [m["content"] for m in demo.messages if m["role"] == "assistant"][-2]
            line = f"{hop.subject_name} {hop.relation} {hop.answer}."
            assert statement == f"Fact: {line}"
            page = [m["content"] for m in demo.messages if m["role"] == "tool"][-1]
            # The value is copied from the one place on the page where the relation word precedes
            # it: no "is" in between, which every line of the page would share.
            assert line in page and f"{hop.relation} is " not in page


@pytest.mark.parametrize("recap,summary", [(False, True), (True, False), (False, False)])
def test_ablation_prompts_write_demonstrations_as_the_ablated_rollout_reads(
        noisy_world, noisy_tools, recap, summary):
    """An ablation's SFT must demonstrate its own prompt format: without the recap the worker's
    user message is the subtask alone; without the summary turn the worker's last statement is
    the report the planner reads (what rollout.py does with those switches off)."""
    role_prompts = oracle_lib.default_prompts(200, user_query_recap=recap, final_summary=summary)
    oracle = Oracle(noisy_tools.search, noisy_tools.open, role_prompts=role_prompts,
                    fact_style="plain")
    for q in _sample(noisy_world, per_hop=2):
        demo = oracle.planner(q)
        assert demo.solved and demo.answer == q.answer
        assert [m["content"] for m in demo.messages if m["role"] == "tool"] == \
            [w.report for w in demo.workers]
        for worker, hop in zip(demo.workers, q.hops):
            task = worker.messages[1]["content"]
            assert task == (prompts.worker_recap(q.question, hop.subtask) if recap else hop.subtask)
            texts = [m["content"] for m in worker.messages]
            assert (prompts.FINAL_SUMMARY_INSTRUCTION in texts) == summary
            assert hop.answer in worker.report
            if not summary:
                assert worker.report == worker.messages[-1]["content"]
                assert worker.report.startswith("Fact: ")


def test_the_report_can_state_the_fact_before_the_conclusion(noisy_world, noisy_tools):
    """report_fact_first moves the value after the fact line it is copied from; the rest of the
    episode is the same."""
    role_prompts = oracle_lib.default_prompts(200)
    usual = Oracle(noisy_tools.search, noisy_tools.open, role_prompts=role_prompts,
                   fact_style="plain")
    fact_first = Oracle(noisy_tools.search, noisy_tools.open, role_prompts=role_prompts,
                        fact_style="plain", report_fact_first=True)
    for q in _sample(noisy_world, per_hop=2):
        a, b = usual.planner(q), fact_first.planner(q)
        assert b.solved and b.answer == q.answer
        for hop, before, after in zip(q.hops, a.workers, b.workers):
            fact = f"{hop.subject_name} {hop.relation} {hop.answer}."
            assert before.report == f"Conclusion: {hop.answer}. Fact: {fact} Source: {hop.doc_id}."
            assert after.report == f"Fact: {fact} Conclusion: {hop.answer}. Source: {hop.doc_id}."
            assert before.messages[:-1] == after.messages[:-1]


def test_single_agent_states_each_fact_it_read_before_moving_on(small_world_kwargs):
    from matpo_jax.data.synthetic_world import build_world
    world = build_world(seed=7, noise=1.0, fact_style="plain", **small_world_kwargs)
    tools = LocalCorpusTools(world.documents)
    stating = Oracle(tools.search, tools.open, role_prompts=PROMPTS, fact_style="plain")
    silent = Oracle(tools.search, tools.open, role_prompts=PROMPTS, fact_style="plain",
                    single_states_facts=False)
    for q in _sample(world, per_hop=2):
        demo, before = stating.single(q), silent.single(q)
        assert demo.solved and before.solved
        messages = demo.messages
        for hop in q.hops:  # the turn right after the hop's page begins with its fact line
            page = next(i for i, m in enumerate(messages)
                        if m["role"] == "tool" and m["content"].startswith(hop.doc_id))
            assert messages[page + 1]["role"] == "assistant"
            assert messages[page + 1]["content"].startswith(
                f"Fact: {hop.subject_name} {hop.relation} {hop.answer}.\n")
        assert extract_boxed(messages[-1]["content"]) == q.answer
        # The same calls as the agent that answers straight from the pages, which states nothing.
        assert _tool_calls(messages, [SEARCH, OPEN]) == _tool_calls(before.messages, [SEARCH, OPEN])
        assert not any("Fact:" in m["content"] for m in before.messages if m["role"] == "assistant")
