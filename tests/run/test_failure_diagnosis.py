"""The failure diagnosis (run/eval/failures.py) on transcripts rendered from the oracle's episodes
through the real tools and chat format, then broken at one known step each."""
import copy
import json

import pytest

from matpo_jax.chat import format_tool_call
from matpo_jax.data import synthetic_world
from matpo_jax.data.oracle import LocalCorpusTools, Oracle
from matpo_jax.run.eval import failures, open_choices
from matpo_jax.run.eval.transcript_steps import tool_steps


@pytest.fixture(scope="module")
def world():
    return synthetic_world.build_world(seed=7, noise=0.0, num_entities=120, num_questions=400,
                                       max_hops=2)


@pytest.fixture(scope="module")
def oracle(world):
    tools = LocalCorpusTools(world.documents)
    return Oracle(tools.search, tools.open)


def _record(question, demo, chat, grade="incorrect", prediction="unknown"):
    agents = [{"role": demo.role, "text": chat.render_text(demo.messages)}]
    agents += [{"role": "worker", "text": chat.render_text(w.messages)} for w in demo.workers]
    return {"id": question.id, "sample": 0, "prediction": prediction, "grade": grade,
            "agents": agents}


def _questions(world, hops, where=lambda q: True):
    return [q for q in world.questions["test"] + world.questions["train"]
            if q.num_hops == hops and where(q)]


def _twin_of(world, entity_id):
    """An entity whose name is a near-duplicate of entity_id's (either way round), or None."""
    subject = world.entity(entity_id)
    for e in world.entities:
        if e.id != subject.id and (e.twin_of == subject.id or e.id == subject.twin_of):
            return e
    return None


def _solved_planner(oracle, question):
    demo = oracle.planner(question)
    assert demo.solved, question
    return demo


def _replace_open(messages, old_id, new_id):
    """The same episode with the open call of old_id pointed at new_id."""
    messages = copy.deepcopy(messages)
    old = format_tool_call("open", {"id": old_id})
    hits = [m for m in messages if m["role"] == "assistant" and m["content"] == old]
    assert hits, old_id
    hits[0]["content"] = format_tool_call("open", {"id": new_id})
    return messages


def test_oracle_episodes_are_traced_to_the_final_answer(world, oracle, chat_format):
    for hops in (1, 2):
        for q in _questions(world, hops)[:6]:
            for demo in (_solved_planner(oracle, q), oracle.single(q)):
                right = failures.diagnose(_record(q, demo, chat_format, "correct", q.answer), q, world)
                assert (right.stage, right.hop, right.hops) == (failures.CORRECT, None, hops)
                # Every step of the chain right, yet graded wrong: the final answer is to blame.
                wrong = failures.diagnose(_record(q, demo, chat_format), q, world)
                assert wrong.stage == failures.WRONG_FINAL_ANSWER


def test_opening_a_near_duplicates_page_is_named_at_its_hop(world, oracle, chat_format):
    twinned = _questions(world, 2, lambda q: _twin_of(world, q.hops[1].subject_id) is not None)
    assert twinned, "the world must hold a two-hop question whose second subject has a twin"
    q = twinned[0]
    hop = q.hops[1]
    twin_page = f"page {_twin_of(world, hop.subject_id).name}"
    demo = _solved_planner(oracle, q)
    demo.workers[1].messages = _replace_open(demo.workers[1].messages, hop.doc_id, twin_page)
    diagnosis = failures.diagnose(_record(q, demo, chat_format), q, world)
    assert (diagnosis.stage, diagnosis.hop) == (failures.OPENED_TWIN, 2)
    # The single agent: the same step over its one context.
    single = oracle.single(q)
    single.messages = _replace_open(single.messages, hop.doc_id, twin_page)
    assert failures.diagnose(_record(q, single, chat_format), q, world).stage == failures.OPENED_TWIN


def test_other_pages_and_no_page(world, oracle, chat_format):
    two_pages = _questions(world, 1, lambda q: q.hops[0].doc_id.endswith(" (2)"))
    assert two_pages, "the world must hold a fact on an entity's second page"
    q = two_pages[0]
    hop = q.hops[0]
    first_page = hop.doc_id[:-len(" (2)")]
    demo = _solved_planner(oracle, q)
    twin = _twin_of(world, hop.subject_id)
    unrelated = next(d.id for d in world.documents
                     if d.entity_id not in (hop.subject_id, twin and twin.id))
    cases = [(first_page, failures.OPENED_OTHER_PAGE_OF_SUBJECT),
             (f"{hop.doc_id} (3)", failures.OPENED_MISSING),  # an invented page
             (unrelated, failures.OPENED_OTHER)]
    for page, stage in cases:
        broken = copy.deepcopy(demo)
        broken.workers[0].messages = _replace_open(broken.workers[0].messages, hop.doc_id, page)
        assert failures.diagnose(_record(q, broken, chat_format), q, world).stage == stage
    # No open at all: the worker stated the fact from the listing.
    broken = copy.deepcopy(demo)
    opener = format_tool_call("open", {"id": hop.doc_id})
    index = next(i for i, m in enumerate(broken.workers[0].messages) if m["content"] == opener)
    del broken.workers[0].messages[index:index + 2]  # the call and its page
    assert failures.diagnose(_record(q, broken, chat_format), q, world).stage == failures.OPENED_NONE


def test_a_search_that_never_lists_the_page(world, oracle, chat_format):
    q = _questions(world, 1)[0]
    demo = _solved_planner(oracle, q)
    worker = demo.workers[0]
    for message in worker.messages:  # every listing the worker read comes back empty...
        if message["role"] == "tool" and not message["content"].startswith(q.hops[0].doc_id):
            message["content"] = "No results."
    # ...and it opens another page it knew from elsewhere
    other = next(d.id for d in world.documents if d.entity_id != q.hops[0].subject_id)
    worker.messages = _replace_open(worker.messages, q.hops[0].doc_id, other)
    assert failures.diagnose(_record(q, demo, chat_format), q, world).stage == \
        failures.PAGE_NOT_LISTED


def test_planner_steps_and_the_report(world, oracle, chat_format):
    q = _questions(world, 2, lambda q: _twin_of(world, q.hops[0].subject_id) is not None)[0]
    demo = _solved_planner(oracle, q)
    calls = [i for i, m in enumerate(demo.messages) if m["role"] == "assistant"
             and "subagent" in m["content"]]
    reports = [i for i, m in enumerate(demo.messages) if m["role"] == "tool"]

    # A subtask naming the twin: "Nanpir Bankk" does not mention "Nanpir Bank".
    twin = _twin_of(world, q.hops[0].subject_id).name
    broken = copy.deepcopy(demo)
    broken.messages[calls[0]]["content"] = format_tool_call(
        "subagent", {"subtask": synthetic_world.one_hop_question(q.hops[0].relation, twin)})
    diagnosis = failures.diagnose(_record(q, broken, chat_format), q, world)
    assert (diagnosis.stage, diagnosis.hop) == (failures.WRONG_SUBTASK, 1)

    # The report of hop 2 lacks the value the worker's page stated.
    broken = copy.deepcopy(demo)
    broken.messages[reports[1]]["content"] = demo.messages[reports[1]]["content"].replace(
        q.hops[1].answer, "Nobody")
    diagnosis = failures.diagnose(_record(q, broken, chat_format), q, world)
    assert (diagnosis.stage, diagnosis.hop) == (failures.WRONG_VALUE, 2)

    # The planner answered after one worker.
    broken = copy.deepcopy(demo)
    broken.messages = broken.messages[:calls[1]] + broken.messages[-1:]
    broken.workers = broken.workers[:1]
    diagnosis = failures.diagnose(_record(q, broken, chat_format), q, world)
    assert (diagnosis.stage, diagnosis.hop) == (failures.ANSWERED_EARLY, 2)


def test_tool_steps_pair_each_call_with_its_response():
    text = ("<|im_start|>assistant\n<tool_call>\n{not json}\n</tool_call>\n"
            "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"q\"}}\n</tool_call>"
            "<|im_end|>\n<|im_start|>user\n<tool_response>\nError: bad call\n</tool_response>\n"
            "<tool_response>\n[1] page A | A\ntext\n</tool_response><|im_end|>\n"
            "<|im_start|>assistant\n<tool_call>\n{\"name\": \"open\", \"arguments\": "
            "{\"id\": \"page A\"}}\n</tool_call>")  # cut before the page came back
    steps = tool_steps(text)
    assert [(s.name, s.response) for s in steps] == [
        ("", "Error: bad call"), ("search", "[1] page A | A\ntext"), ("open", None)]


def test_unknown_question_ids_name_the_line(world):
    with pytest.raises(ValueError, match=r"line 2: question id 'nope'"):
        failures.diagnose_all([{"id": world.questions["test"][0].id, "grade": "correct",
                                "agents": []}, {"id": "nope", "agents": []}], world)


def test_summary_counts_every_sample_once(world, oracle, chat_format):
    qs = _questions(world, 1)[:3] + _questions(world, 2)[:2]
    samples = [_record(q, _solved_planner(oracle, q), chat_format, "correct", q.answer)
               for q in qs[:3]]
    samples += [_record(q, _solved_planner(oracle, q), chat_format) for q in qs[3:]]
    table = failures.summary(failures.diagnose_all(samples, world))
    assert table["samples"] == 5 and table["accuracy"] == pytest.approx(0.6)
    assert table["question_hops"] == {1: 3, 2: 2}
    assert {r["stage"]: r["samples"] for r in table["rows"]} == {
        failures.WRONG_FINAL_ANSWER: 2, failures.CORRECT: 3}
    text = failures.markdown(table)
    assert text.index(failures.WRONG_FINAL_ANSWER) < text.index("| correct |")
    assert "| 2 (100.0%) |" in text  # both two-hop samples failed at the final answer


def test_the_diagnosis_is_written_beside_the_transcripts(tmp_path, world, oracle, chat_format):
    q = _questions(world, 2)[0]
    demo = _solved_planner(oracle, q)
    samples = [_record(q, demo, chat_format, "correct", q.answer), _record(q, demo, chat_format)]
    (tmp_path / "transcripts.jsonl").write_text(
        "".join(json.dumps(s) + "\n" for s in samples), encoding="utf-8")
    table = failures.write_diagnosis(str(tmp_path), world)
    assert (tmp_path / failures.FAILURES_MD).read_text() == table
    saved = json.loads((tmp_path / failures.FAILURES_JSON).read_text())
    assert saved["samples"] == 2 and saved["accuracy"] == 0.5
    assert {r["stage"]: r["samples"] for r in saved["rows"]} == {
        failures.WRONG_FINAL_ANSWER: 1, failures.CORRECT: 1}
    # and how the workers chose their pages: both samples, both hops, the right page first
    assert sum(saved["open_choices"][kind][open_choices.RIGHT_FIRST]
               for kind in saved["open_choices"]) == 4
    assert "| the listing showed the hop's page and |" in table


def test_a_step_failed_for_want_of_context_is_named_so(world, oracle, chat_format):
    q = _questions(world, 2)[0]
    single = oracle.single(q)
    # The single agent stopped at the context limit after its first hop: no second page.
    first_hop_end = next(i for i, m in enumerate(single.messages)
                         if m["role"] == "tool" and m["content"].startswith(q.hops[0].doc_id))
    single.messages = single.messages[:first_hop_end + 1]
    record = _record(q, single, chat_format)
    assert failures.diagnose(record, q, world).stage == failures.ANSWERED_EARLY
    record["agents"][0]["finish_reason"] = "max_context"
    diagnosis = failures.diagnose(record, q, world)
    assert (diagnosis.stage, diagnosis.hop) == (failures.CONTEXT_FULL, 2)
    # A worker out of room before its page: the step is the worker's.
    demo = _solved_planner(oracle, q)
    worker = demo.workers[1]
    worker.messages = worker.messages[:3]  # its search call and the listing only
    record = _record(q, demo, chat_format)
    record["agents"][2]["finish_reason"] = "max_context"
    assert failures.diagnose(record, q, world).stage == failures.CONTEXT_FULL


def test_a_single_agent_that_answers_after_one_hop(world, oracle, chat_format):
    q = _questions(world, 2)[0]
    single = oracle.single(q)
    first_hop_end = next(i for i, m in enumerate(single.messages)
                         if m["role"] == "tool" and m["content"].startswith(q.hops[0].doc_id))
    single.messages = single.messages[:first_hop_end + 1] + single.messages[-1:]
    diagnosis = failures.diagnose(_record(q, single, chat_format), q, world)
    assert (diagnosis.stage, diagnosis.hop) == (failures.ANSWERED_EARLY, 2)
    # One more search that does not list the second page: now the search is to blame.
    single.messages.insert(first_hop_end + 1, {"role": "assistant", "content": format_tool_call(
        "search", {"query": "nothing", "num": 2})})
    single.messages.insert(first_hop_end + 2, {"role": "tool", "content": "No results."})
    diagnosis = failures.diagnose(_record(q, single, chat_format), q, world)
    assert (diagnosis.stage, diagnosis.hop) == (failures.PAGE_NOT_LISTED, 2)


def _choices(world, q, demo, chat_format):
    return open_choices.choices(_record(q, demo, chat_format), q, world)


def test_open_choices_of_a_second_page(world, oracle, chat_format):
    two_pages = _questions(world, 1, lambda q: q.hops[0].doc_id.endswith(" (2)"))
    q = two_pages[0]
    hop = q.hops[0]
    first_page = hop.doc_id[:-len(" (2)")]
    demo = _solved_planner(oracle, q)
    assert _choices(world, q, demo, chat_format) == [
        (open_choices.OTHER_PAGE_FACT_SECOND, open_choices.RIGHT_FIRST)]
    # the first page instead: never the right one
    broken = copy.deepcopy(demo)
    broken.workers[0].messages = _replace_open(broken.workers[0].messages, hop.doc_id, first_page)
    assert _choices(world, q, broken, chat_format) == [
        (open_choices.OTHER_PAGE_FACT_SECOND, open_choices.NEVER_RIGHT)]
    # the first page, then the right one: a recovery
    recovered = copy.deepcopy(demo)
    opener = format_tool_call("open", {"id": hop.doc_id})
    index = next(i for i, m in enumerate(recovered.workers[0].messages) if m["content"] == opener)
    recovered.workers[0].messages[index:index] = [
        {"role": "assistant", "content": format_tool_call("open", {"id": first_page})},
        {"role": "tool", "content": "the first page"}]
    assert _choices(world, q, recovered, chat_format) == [
        (open_choices.OTHER_PAGE_FACT_SECOND, open_choices.RIGHT_AFTER_WRONG)]
    # the single agent, over its one context
    single = oracle.single(q)
    assert _choices(world, q, single, chat_format) == [
        (open_choices.OTHER_PAGE_FACT_SECOND, open_choices.RIGHT_FIRST)]
    single.messages = _replace_open(single.messages, hop.doc_id, first_page)
    assert _choices(world, q, single, chat_format) == [
        (open_choices.OTHER_PAGE_FACT_SECOND, open_choices.NEVER_RIGHT)]


def test_open_choices_name_the_listing(world, oracle, chat_format):
    q = _questions(world, 2, lambda q: _twin_of(world, q.hops[1].subject_id) is not None)[0]
    hop = q.hops[1]
    twin = _twin_of(world, hop.subject_id)
    twin_doc = next(d for d in world.documents if d.entity_id == twin.id)
    other_doc = next(d for d in world.documents
                     if d.entity_id not in (hop.subject_id, twin.id))
    kind = lambda listed: open_choices.listing_kind(hop, listed, world)  # noqa: E731
    assert kind([hop.doc_id]) == open_choices.ONLY_SUBJECT
    assert kind([hop.doc_id, other_doc.id]) == open_choices.ONLY_SUBJECT
    assert kind([other_doc.id, hop.doc_id, twin_doc.id]) == open_choices.TWIN_LISTED
    assert kind([hop.doc_id, f"{hop.doc_id} (7)"]) == open_choices.ONLY_SUBJECT  # no such page
    # the subject's two pages, the fact on the first: a one-hop question about such a page
    seconds = {d.id[:-len(" (2)")] for d in world.documents if d.id.endswith(" (2)")}
    first = _questions(world, 1, lambda q: q.hops[0].doc_id in seconds)[0].hops[0]
    assert open_choices.listing_kind(first, [first.doc_id, first.doc_id + " (2)"], world) == \
        open_choices.OTHER_PAGE_FACT_FIRST
    # a hop whose worker opened the twin's page: never the right one; the other hop unchanged
    demo = _solved_planner(oracle, q)
    demo.workers[1].messages = _replace_open(demo.workers[1].messages, hop.doc_id, twin_doc.id)
    found = _choices(world, q, demo, chat_format)
    assert found[0][1] == open_choices.RIGHT_FIRST and found[1][1] == open_choices.NEVER_RIGHT


def test_open_choices_table(world, oracle, chat_format):
    qs = _questions(world, 1)[:4]
    samples = [_record(q, _solved_planner(oracle, q), chat_format) for q in qs]
    questions = {q.id: q for q in qs}
    table = open_choices.summary(samples, questions, world)
    assert sum(sum(row.values()) for row in table.values()) == 4
    assert all(row[open_choices.RIGHT_FIRST] == sum(row.values()) for row in table.values())
    assert list(table) == [k for k in open_choices.LISTINGS if k in table]
    text = open_choices.markdown(table)
    assert text.count("\n") == 2 + len(table) and "(100%)" in text
