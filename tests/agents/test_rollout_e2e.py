"""End to end: planner -> subagent -> worker -> search -> open -> final summary -> planner answer.

A tiny model replays scripted dialogues (greedy), the engine runs the real local search server over
HTTP, and every field of the trajectories is checked: contexts equal the scripted conversations
token for token (so the incremental assembly equals ChatFormat.render), masks, log-probs (against a
teacher-forced forward pass), links between planners and workers, and the metrics.
"""
from __future__ import annotations

import dataclasses

import jax
import numpy as np
import pytest

from matpo_jax.agents import prompts
from matpo_jax.agents import rollout as rollout_lib
from matpo_jax.agents.rollout_metrics import rollout_stats
from matpo_jax.agents.trajectory import PLANNER, SINGLE, WORKER

from rollout_scenarios import (ADA, BASE, PAIR, REPORT_MAX_CHARS, TURING,
                               assert_masks_and_logprobs)


def contains(haystack, needle) -> bool:
    n = len(needle)
    return any(haystack[i:i + n] == needle for i in range(len(haystack) - n + 1))


@pytest.fixture(scope="module")
def batch(rollout):
    # 2 questions x G=2 = 4 planners and 6 workers through 3 slots: planners wait off-slot and
    # are re-admitted; workers of different planners decode side by side.
    return rollout([ADA.question, PAIR.question], group_size=2)


def test_roles_links_and_indices(batch):
    planners, workers = batch.by_role(PLANNER), batch.by_role(WORKER)
    assert [r.rollout_id for r in batch.rollouts] == list(range(10))
    assert [(p.query_index, p.sample_index) for p in planners] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert [r.rollout_id for r in planners] == [0, 1, 2, 3]
    assert all(p.parent_id is None and p.report is None for p in planners)
    assert [len(p.child_ids) for p in planners] == [1, 1, 2, 2]
    for planner in planners:
        for worker in batch.children(planner):
            assert worker.role == WORKER and worker.parent_id == planner.rollout_id
            assert (worker.query_index, worker.sample_index) == (planner.query_index,
                                                                  planner.sample_index)
            assert worker.child_ids == []
    assert sorted(w.rollout_id for w in workers) == sorted(
        c for p in planners for c in p.child_ids)


def test_contexts_replay_the_scripts_token_for_token(policy, batch):
    for rollout in batch.rollouts:
        key = (f"planner:{[ADA, PAIR][rollout.query_index].question}" if rollout.role == PLANNER
               else f"worker:{_subtask(rollout)}")
        ids, trainable = policy.render(key)
        assert rollout.tokens == ids, key
        assert rollout.trainable == trainable, key


def _subtask(worker):
    for script in (ADA, PAIR):
        for w in script.workers:
            if w.summary in worker.assistant_texts[-1]:
                return w.subtask
    raise AssertionError(worker.assistant_texts)


def test_masks_and_logprobs(policy, batch):
    assert_masks_and_logprobs(policy, batch.rollouts)


def test_worker_loop_search_open_summary(policy, batch):
    ada_workers = batch.children(batch.rollouts[0])
    assert len(ada_workers) == 1
    worker = ada_workers[0]
    script = ADA.workers[0]
    assert [(c.name, c.arguments) for c in worker.tool_calls] == list(script.calls)
    assert all(c.valid and not c.tool_failed and c.error is None for c in worker.tool_calls)
    assert [c.turn for c in worker.tool_calls] == [0, 1]
    assert worker.num_turns == 4  # search, open, answer, final summary
    assert worker.finish_reason == "answer"
    assert worker.assistant_texts[2].startswith(script.answer)
    # The worker's context: recap as its user message, real search/open results, the summary
    # instruction, all non-trainable.
    chat = policy.chat
    recap = prompts.worker_recap(ADA.question, script.subtask)
    assert chat.decode(worker.tokens).count(recap) == 1
    text = chat.decode(worker.tokens)
    assert "Ada Lovelace was born in London." in text  # from the server's page d1
    summary_ids = chat.user_turn_ids(prompts.FINAL_SUMMARY_INSTRUCTION)
    assert contains(worker.tokens, summary_ids)
    start = next(i for i in range(len(worker.tokens)) if worker.tokens[i:i + len(summary_ids)]
                 == summary_ids)
    assert not any(worker.trainable[start:start + len(summary_ids)])
    # The report: think text removed, capped.
    assert worker.report == prompts.clean_report(script.summary, REPORT_MAX_CHARS)
    assert worker.report == "Ada Lovelace was born in London. Source: d1."


def test_planner_receives_the_cleaned_report(policy, batch):
    chat = policy.chat
    for planner in batch.by_role(PLANNER):
        workers = batch.children(planner)
        block = chat.tool_response_ids([w.report for w in workers])
        assert contains(planner.tokens, block)
        start = next(i for i in range(len(planner.tokens))
                     if planner.tokens[i:i + len(block)] == block)
        assert not any(planner.trainable[start:start + len(block)])
        assert "<think>" not in chat.decode(planner.tokens)
        assert planner.finish_reason == "answer"
        assert all(c.name == "subagent" and c.valid for c in planner.tool_calls)
    answers = [p.assistant_texts[-1] for p in batch.by_role(PLANNER)]
    assert [a.startswith(s.answer) for a, s in zip(answers, [ADA, ADA, PAIR, PAIR])] == [True] * 4


def test_metrics(batch):
    m, stats = batch.metrics, rollout_stats(batch.rollouts)
    assert stats["rollouts/planner"] == 4 and stats["rollouts/worker"] == 6
    assert stats["worker_calls_mean/planner"] == 1.5
    assert stats["tool_calls_mean/planner"] == 1.5  # PAIR makes two calls in one turn
    assert stats["tool_calls_mean/worker"] == pytest.approx((2 + 1 + 1) * 2 / 6)
    assert stats["finish_answer_frac/planner"] == 1 and stats["finish_answer_frac/worker"] == 1
    assert stats["invalid_tool_calls"] == 0 and stats["tool_failures"] == 0 and m["errors"] == 0
    sampled = sum(r.num_trainable for r in batch.rollouts)
    assert m["sampled_tokens"] == sampled
    assert 0.0 < m["slot_utilisation"] <= 1.0
    assert m["slot_utilisation"] == pytest.approx(sampled / (3 * m["decode_steps"]))
    assert m["wall_time_s"] > 0 and m["rollouts_per_s"] > 0
    # 4 planner resumptions: each either found its cache in its slot, or (its slot lent to a
    # worker meanwhile) was re-prefilled, on top of the 10 first admissions.
    assert m["resumed_in_place"] + (m["prefills"] - 10) == 4
    assert m["evictions"] == m["prefills"] - 10 > 0  # 3 slots for 4 planners and their workers
    # Every admission into a fresh slot starts from a shared prefix: the role's system turn, or
    # (planners, G=2) the question's whole prompt, computed once for the batch.
    assert m["prefix_hits"] == m["prefills"]
    prompts_total = sum(r.trainable.index(True) for r in batch.rollouts)
    assert m["prefill_tokens"] + m["prefix_tokens"] > prompts_total
    assert m["prefill_tokens"] < prompts_total / 4


def test_prefix_reuse_changes_no_token(batch, rollout):
    """The same batch with every prompt prefilled in full: the same tokens, the same log-probs
    (up to float rounding: the cached prefix was computed by a different extend)."""
    plain = rollout([ADA.question, PAIR.question], group_size=2, reuse_prefixes=False)
    assert plain.metrics["prefix_hits"] == 0
    assert plain.metrics["prefill_tokens"] == (batch.metrics["prefill_tokens"]
                                               + batch.metrics["prefix_tokens"])
    for reused, full in zip(batch.rollouts, plain.rollouts):
        assert reused.tokens == full.tokens and reused.trainable == full.trainable
        np.testing.assert_allclose(reused.logprobs, full.logprobs, atol=1e-5)


def test_injection_lanes_change_the_work_not_the_tokens(policy, toolbox, batch, monkeypatch):
    """rollout.injection_lanes reaches the sampler, and an EngineOptions value wins over it: all
    3 slots extended together instead of one at a time (the default for 3 slots) compute more
    padded positions and sample the same tokens."""
    lanes_seen, run_slots = [], rollout_lib.sampler.run_slots

    def recording(*args, **kwargs):
        lanes_seen.append(kwargs["lanes"])
        return run_slots(*args, **kwargs)

    monkeypatch.setattr(rollout_lib.sampler, "run_slots", recording)
    cfg = dataclasses.replace(BASE, group_size=2, injection_lanes=3)

    def run(options=rollout_lib.EngineOptions()):
        return rollout_lib.run_rollouts(policy.state, policy.graphdef, policy.chat, toolbox,
                                        [ADA.question, PAIR.question], cfg, jax.random.key(0),
                                        options)

    wide = run()
    assert wide.metrics["extend_positions"] > batch.metrics["extend_positions"]
    for a, b in zip(wide.rollouts, batch.rollouts):
        assert (a.tokens, a.trainable) == (b.tokens, b.trainable)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    narrow = run(rollout_lib.EngineOptions(injection_lanes=1))
    assert lanes_seen == [3, 1]
    assert narrow.metrics["extend_positions"] == batch.metrics["extend_positions"]


def test_a_paged_kv_cache_changes_no_token(batch, rollout, monkeypatch):
    """rollout.kv_cache=paged: the batch decodes over pages (prefixes shared by page) with the
    same tokens and log-probs (greedy); kv_page_size and kv_pages reach the sampler."""
    paged = rollout([ADA.question, PAIR.question], group_size=2, kv_cache="paged",
                    kv_page_size=16)
    for a, b in zip(paged.rollouts, batch.rollouts):
        assert (a.tokens, a.trainable, a.finish_reason) == (b.tokens, b.trainable, b.finish_reason)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)

    class Seen(Exception):
        pass

    def record(*args, **kwargs):
        raise Seen(kwargs["paged"])

    monkeypatch.setattr(rollout_lib.sampler, "run_slots", record)
    with pytest.raises(Seen) as seen:
        rollout([ADA.question], kv_cache="paged", kv_page_size=32, kv_pages=100)
    assert seen.value.args[0] == rollout_lib.sampler.PagedCache(page_size=32, num_pages=100)
    with pytest.raises(Seen) as seen:
        rollout([ADA.question])
    assert seen.value.args[0] is None  # the default: the dense cache


def test_a_pool_per_batch_shard_changes_no_token(policy, toolbox, batch):
    """The policy sharded over fsdp=3 (the 3 decode slots split over 3 devices) with the paged
    cache: every shard decodes its slot from its own pool with its own copy of the role and
    question prefixes, and the batch is token for token the unsharded dense one's."""
    from matpo_jax import parallel
    mesh = parallel.make_mesh(data=1, fsdp=3, tensor=1, devices=jax.devices()[:3])
    state = jax.device_put(policy.state, parallel.param_shardings(policy.state, mesh))
    cfg = dataclasses.replace(BASE, group_size=2, kv_cache="paged", kv_page_size=16)
    sharded = rollout_lib.run_rollouts(state, policy.graphdef, policy.chat, toolbox,
                                       [ADA.question, PAIR.question], cfg, jax.random.key(0))
    assert sharded.metrics["prefix_hits"] == batch.metrics["prefix_hits"] > 0
    for a, b in zip(sharded.rollouts, batch.rollouts):
        assert (a.tokens, a.trainable, a.finish_reason) == (b.tokens, b.trainable, b.finish_reason)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)


def test_async_tools_change_no_token(batch, rollout):
    """Tool calls in the background: each waiting worker gives up its slot and comes back when
    its result is in; the trajectories are the same (greedy), only the slot traffic differs."""
    background = rollout([ADA.question, PAIR.question], group_size=2, async_tools=True)
    for a, b in zip(background.rollouts, batch.rollouts):
        assert (a.tokens, a.trainable, a.finish_reason) == (b.tokens, b.trainable, b.finish_reason)
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    tool_calls = sum(len(w.tool_calls) for w in batch.by_role(WORKER))
    # Every worker tool call parked its worker: it resumed in place or was re-admitted.
    parked_returns = (background.metrics["resumed_in_place"] + background.metrics["prefills"]
                      - batch.metrics["resumed_in_place"] - batch.metrics["prefills"])
    assert parked_returns == tool_calls


def test_single_agent_mode(policy, rollout):
    batch = rollout([TURING.question], mode="single")
    (agent,) = batch.rollouts
    assert agent.role == SINGLE and agent.parent_id is None and agent.child_ids == []
    ids, trainable = policy.render(f"single:{TURING.question}")
    assert agent.tokens == ids and agent.trainable == trainable
    assert [(c.name, c.arguments) for c in agent.tool_calls] == list(TURING.calls)
    assert agent.finish_reason == "answer" and agent.report is None
    assert_masks_and_logprobs(policy, [agent])
    stats = rollout_stats(batch.rollouts)
    assert "worker_calls_mean/planner" not in stats
    assert stats["tool_calls_mean/single"] == 2.0


def test_recap_off_gives_the_worker_the_subtask_alone(policy, rollout):
    batch = rollout([ADA.question], user_query_recap=False)
    worker = batch.by_role(WORKER)[0]
    chat = policy.chat
    conversation = policy.conversations[f"worker:{ADA.workers[0].subtask}"]
    prompt = chat.prompt_ids([conversation[0],
                              {"role": "user", "content": ADA.workers[0].subtask}])
    assert worker.tokens[:len(prompt)] == prompt
    assert "The main task is" not in chat.decode(worker.tokens)


def test_final_summary_off_reports_the_last_answer(policy, rollout):
    batch = rollout([ADA.question], final_summary=False)
    worker = batch.by_role(WORKER)[0]
    assert worker.num_turns == 3  # search, open, answer: no summary turn
    assert prompts.FINAL_SUMMARY_INSTRUCTION not in policy.chat.decode(worker.tokens)
    assert worker.report == prompts.clean_report(ADA.workers[0].answer, REPORT_MAX_CHARS)
    planner = batch.by_role(PLANNER)[0]
    assert contains(planner.tokens, policy.chat.tool_response_ids([worker.report]))


def test_report_reasoning_keep_hands_the_planner_the_reasoning_text(policy, rollout):
    # The default strips the worker's reasoning (test_worker_loop_search_open_summary); "keep"
    # leaves its text, without the tags, in front of the answer the planner reads.
    batch = rollout([ADA.question], report_reasoning="keep")
    worker = batch.by_role(WORKER)[0]
    assert worker.report == "d1 says it.Ada Lovelace was born in London. Source: d1."
    assert worker.report == prompts.clean_report(ADA.workers[0].summary, REPORT_MAX_CHARS,
                                                 keep_reasoning=True)
    planner = batch.by_role(PLANNER)[0]
    assert contains(planner.tokens, policy.chat.tool_response_ids([worker.report]))
