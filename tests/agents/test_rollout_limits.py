"""Every limit ends or shapes a rollout in a recorded way: turns, context, worker calls per turn,
malformed tool calls (both policies), failing tools, and the slot host's own bookkeeping."""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from matpo_jax import sampler
from matpo_jax.agents import prompts
from matpo_jax.agents.rollout import FINISH_REASONS, EngineOptions
from matpo_jax.agents.rollout_metrics import rollout_stats
from matpo_jax.config import ConfigError, RolloutSection
from matpo_jax.agents.scheduler import PARK, RELEASE, Continue, SlotScheduler
from matpo_jax.agents.trajectory import PLANNER, WORKER

from rollout_scenarios import ADA, BASE, MALFORMED, PAIR, REPORT_MAX_CHARS, assert_masks_and_logprobs


def block_at(tokens, block) -> int:
    """Index where `block` occurs in `tokens` (asserts it does)."""
    for i in range(len(tokens) - len(block) + 1):
        if tokens[i:i + len(block)] == block:
            return i
    raise AssertionError("block not found")


def first_turn_end(rollout) -> int:
    start = rollout.trainable.index(True)
    return start + rollout.trainable[start:].index(False)


def assert_well_formed(batch):
    for r in batch.rollouts:
        assert r.finish_reason in FINISH_REASONS, (r.rollout_id, r.finish_reason)
        assert len(r.tokens) == len(r.trainable) == len(r.logprobs) <= BASE.max_context
    assert batch.metrics["errors"] == 0


def test_worker_max_turns_then_final_summary(policy, rollout):
    batch = rollout([ADA.question], max_turns_worker=1)
    assert_well_formed(batch)
    worker = batch.by_role(WORKER)[0]
    assert worker.finish_reason == "max_turns"
    assert worker.num_turns == 2  # the search-call turn, then the final summary
    (call,) = worker.tool_calls
    assert call.name == "search" and call.valid and not call.tool_failed
    # The call was not run: the summary instruction follows the turn directly.
    end = first_turn_end(worker)
    summary_ids = policy.chat.user_turn_ids(prompts.FINAL_SUMMARY_INSTRUCTION)
    assert worker.tokens[end:end + len(summary_ids)] == summary_ids
    assert "<tool_response>" not in policy.chat.decode(worker.tokens)
    assert worker.report == prompts.clean_report(worker.assistant_texts[-1], REPORT_MAX_CHARS)
    planner = batch.by_role(PLANNER)[0]
    block_at(planner.tokens, policy.chat.tool_response_ids([worker.report]))


def test_final_summary_turn_has_its_own_cap(policy, rollout):
    batch = rollout([ADA.question], final_summary_max_tokens=2)
    assert_well_formed(batch)
    worker = batch.by_role(WORKER)[0]
    tool_loop = rollout([ADA.question]).by_role(WORKER)[0]
    # The tool loop is unchanged; its summary turn is cut after 2 tokens.
    assert worker.assistant_texts[:-1] == tool_loop.assistant_texts[:-1]
    instruction = policy.chat.user_turn_ids(prompts.FINAL_SUMMARY_INSTRUCTION)
    after = max(i for i in range(len(worker.tokens))
                if worker.tokens[i:i + len(instruction)] == instruction) + len(instruction)
    assert worker.trainable[after:] == [True, True] and len(worker.tokens) == after + 2
    assert policy.chat.decode(worker.tokens[after:]) == worker.assistant_texts[-1]
    assert worker.finish_reason == tool_loop.finish_reason == "answer"
    assert worker.report == prompts.clean_report(worker.assistant_texts[-1], REPORT_MAX_CHARS)


def test_planner_max_turns(rollout):
    batch = rollout([ADA.question], max_turns_planner=1)
    assert_well_formed(batch)
    (planner,) = batch.rollouts  # the subagent call was recorded, not run
    assert planner.finish_reason == "max_turns" and planner.num_turns == 1
    assert planner.child_ids == [] and len(planner.tool_calls) == 1
    assert planner.trainable[-1]  # the rollout ends on its sampled turn
    assert rollout_stats(batch.rollouts)["finish_max_turns_frac/planner"] == 1.0


def test_max_context_ends_the_tool_loop_and_keeps_room_for_the_summary(policy, rollout):
    ids, trainable = policy.render(f"worker:{ADA.workers[0].subtask}")
    prompt_len = trainable.index(True)
    first_turn = trainable[prompt_len:].index(False)
    summary_reserve = len(policy.chat.user_turn_ids(prompts.FINAL_SUMMARY_INSTRUCTION,
                                                    closed=False)) + BASE.max_new_tokens_per_turn
    # Room for the prompt and one turn, not for the first search result on top of it.
    max_context = prompt_len + first_turn + BASE.max_new_tokens_per_turn + summary_reserve
    batch = rollout([ADA.question], max_context=max_context)
    assert all(len(r.tokens) <= max_context for r in batch.rollouts)
    worker = batch.by_role(WORKER)[0]
    assert worker.finish_reason == "max_context"
    assert worker.tokens[:prompt_len + first_turn] == ids[:prompt_len + first_turn]
    assert len(worker.tool_calls) == 1 and worker.num_turns == 2  # search call + summary
    assert "<tool_response>" not in policy.chat.decode(worker.tokens)
    assert prompts.FINAL_SUMMARY_INSTRUCTION in policy.chat.decode(worker.tokens)
    assert batch.by_role(PLANNER)[0].finish_reason in FINISH_REASONS


def test_max_worker_calls_per_turn(policy, rollout):
    batch = rollout([PAIR.question], max_worker_calls_per_turn=1)
    assert_well_formed(batch)
    planner = batch.by_role(PLANNER)[0]
    first, second = planner.tool_calls[:2]
    assert first.valid and second.valid and first.turn == second.turn == 0
    assert first.error is None and second.error.startswith("not run")
    (worker,) = batch.children(planner)
    assert worker.finish_reason == "answer"
    refused = "Error: at most 1 subagent call(s) per turn; this one was not run."
    block = policy.chat.tool_response_ids([worker.report, refused])
    start = block_at(planner.tokens, block)
    assert not any(planner.trainable[start:start + len(block)])
    assert batch.metrics["worker_calls_over_limit"] == 1
    assert rollout_stats(batch.rollouts)["rollouts/worker"] == 1


def test_malformed_call_gets_an_error_message_and_the_rollout_goes_on(policy, rollout):
    batch = rollout([MALFORMED.question])
    assert_well_formed(batch)
    planner = batch.by_role(PLANNER)[0]
    ids, trainable = policy.render(f"planner:{MALFORMED.question}")
    assert planner.tokens == ids and planner.trainable == trainable  # the scripted recovery
    bad, good = planner.tool_calls
    assert not bad.valid and bad.name is None and "task" in bad.error
    assert good.valid and good.name == "subagent"
    error_block = policy.chat.tool_response_ids([prompts.malformed_call_text(bad.error)])
    start = block_at(planner.tokens, error_block)
    assert not any(planner.trainable[start:start + len(error_block)])
    assert planner.finish_reason == "answer" and planner.format_score() == 0.5
    assert len(planner.child_ids) == 1
    stats = rollout_stats(batch.rollouts)
    assert stats["invalid_tool_call_frac/planner"] == 0.5  # 1 of its 2 calls
    assert stats["invalid_tool_calls"] == 1


def test_malformed_call_can_end_the_rollout(rollout):
    batch = rollout([MALFORMED.question], malformed_tool_call="end_rollout")
    assert_well_formed(batch)
    (planner,) = batch.rollouts
    assert planner.finish_reason == "malformed_tool_call"
    assert planner.num_turns == 1 and planner.child_ids == [] and planner.trainable[-1]
    stats = rollout_stats(batch.rollouts)
    assert stats["finish_malformed_tool_call_frac/planner"] == 1.0
    assert stats["invalid_tool_calls"] == 1


@pytest.mark.parametrize("async_tools", [False, True], ids=["tools waited for", "async tools"])
def test_search_server_down_is_an_error_text_in_context(policy, rollout, dead_toolbox,
                                                        async_tools):
    batch = rollout([ADA.question], toolbox=dead_toolbox, async_tools=async_tools)
    assert_well_formed(batch)
    worker = batch.by_role(WORKER)[0]
    failed = worker.tool_calls[0]
    assert failed.valid and failed.tool_failed and failed.error.startswith("Error: search failed")
    block = policy.chat.tool_response_ids([failed.error])
    start = block_at(worker.tokens, block)
    assert not any(worker.trainable[start:start + len(block)])
    failures = sum(c.tool_failed for r in batch.rollouts for c in r.tool_calls)
    stats = rollout_stats(batch.rollouts)
    assert failures >= 1 and stats["tool_failures"] == failures
    worker_calls = sum(len(w.tool_calls) for w in batch.by_role(WORKER))
    assert stats["tool_failure_frac/worker"] == failures / worker_calls
    assert all(r.report for r in batch.by_role(WORKER))  # every worker still reported


@pytest.mark.parametrize("async_tools", [False, True], ids=["tools waited for", "async tools"])
def test_sampled_rollouts_keep_every_invariant(policy, rollout, async_tools):
    # Temperature 1: the policy strays from its scripts (odd calls, cut-off turns, unknown
    # contexts), and every trajectory must still be exact and every rollout end with a reason.
    batch = rollout([ADA.question, PAIR.question, MALFORMED.question], group_size=3,
                    temperature=1.0, async_tools=async_tools)
    assert_well_formed(batch)
    assert_masks_and_logprobs(policy, batch.rollouts)
    planners = batch.by_role(PLANNER)
    assert [(p.query_index, p.sample_index) for p in planners] == [
        (q, g) for q in range(3) for g in range(3)]
    for worker in batch.by_role(WORKER):
        assert worker.rollout_id in batch.rollouts[worker.parent_id].child_ids
        assert worker.report is not None and len(worker.report) <= REPORT_MAX_CHARS


def test_config_errors_name_the_field():
    with pytest.raises(ConfigError, match="malformed_tool_call"):
        RolloutSection(malformed_tool_call="ignore")
    with pytest.raises(ConfigError, match="group_size"):
        RolloutSection(group_size=0)
    with pytest.raises(ConfigError, match="max_new_tokens"):
        RolloutSection(max_context=64, max_new_tokens_per_turn=64)


# ----------------------------------------------------------------------------- the slot host


def events(slots, stopped_turns, cache_len=10):
    """SlotEvents where slot -> turn length for the stopped slots (token ids 7)."""
    width = max([1] + list(stopped_turns.values()))
    stopped = np.zeros(slots, bool)
    turn_len = np.zeros(slots, np.int32)
    for slot, n in stopped_turns.items():
        stopped[slot], turn_len[slot] = True, n
    return sampler.SlotEvents(
        stopped=stopped, stop_reason=np.where(stopped, sampler.STOP_IM_END, 0).astype(np.int32),
        turn_tokens=np.full((slots, width), 7, np.int32),
        turn_logprobs=np.zeros((slots, width), np.float32), turn_len=turn_len,
        cache_len=np.full(slots, cache_len, np.int32))


def test_scheduler_parks_evicts_and_resumes():
    decisions = {}
    host = SlotScheduler(2, 64, lambda turns: {t.seq_id: decisions[t.seq_id] for t in turns})
    for seq in (0, 1):
        host.admit(seq, [1, 2, 3], group=PLANNER, priority=2)
    first = host(events(2, {}))
    assert first.reset.tolist() == [True, True] and first.num.tolist() == [3, 3]
    assert first.active.tolist() == [True, True] and host.slot_seq == [0, 1]
    # 0 waits on a worker (parks), 1 continues in place; the worker gets no free slot, so it
    # takes the parked sequence's slot.
    decisions.update({0: PARK, 1: Continue([4, 5])})
    host.admit(10, [1, 9], group=WORKER, priority=1)
    second = host(events(2, {0: 5, 1: 5}))
    assert host.slot_seq == [10, 1] and host.stats.evictions == 1
    assert second.reset.tolist() == [True, False] and second.num.tolist() == [2, 2]
    assert second.tokens[1, :2].tolist() == [4, 5] and not second.done
    # The worker finishes; 0 comes back and is re-prefilled with its whole context.
    decisions.update({10: RELEASE})
    host.admit(0, [1, 2, 3, 7, 8], group=PLANNER, priority=0)
    third = host(events(2, {0: 4}))
    assert host.slot_seq == [0, 1] and third.reset.tolist() == [True, False]
    assert third.tokens[0, :5].tolist() == [1, 2, 3, 7, 8]
    # Now 1 parks while no one waits for a slot: when it comes back it resumes in place, and
    # only the new suffix is written.
    decisions.update({1: PARK, 0: Continue([6])})
    host(events(2, {0: 2, 1: 2}, cache_len=12))
    assert host.slot_seq == [0, 1] and host.num_active == 1
    host.admit(1, list(range(21)), group=PLANNER, priority=0)
    fourth = host(events(2, {0: 1}))
    assert fourth.reset.tolist() == [False, False] and fourth.num.tolist() == [1, 21 - 12]
    assert fourth.tokens[1, :9].tolist() == list(range(12, 21))
    assert fourth.active.tolist() == [True, True]
    assert host.stats.resumed_in_place == 1 and host.stats.prefills == 4
    decisions.update({0: RELEASE, 1: RELEASE})
    last = host(events(2, {0: 3, 1: 3}))
    assert last.done and not last.active.any()


def test_scheduler_without_role_mixing_runs_one_role_at_a_time():
    decisions = {}
    host = SlotScheduler(3, 64, lambda turns: {t.seq_id: decisions[t.seq_id] for t in turns},
                         mix_roles=False, group_order=(PLANNER, WORKER))
    host.admit(0, [1], group=PLANNER)
    host.admit(1, [1], group=PLANNER)
    host(events(3, {}))
    assert host.slot_seq == [0, 1, None]
    # Planner 0 spawns a worker: it waits, though a slot is free, until the planners drain.
    host.admit(10, [1], group=WORKER)
    decisions.update({0: PARK, 1: Continue([2])})
    host(events(3, {0: 3}))
    assert host.slot_seq == [0, 1, None] and host.num_active == 1
    decisions.update({1: RELEASE})
    host(events(3, {1: 2}))
    assert host.slot_seq == [0, 10, None] and host.num_active == 1


def test_scheduler_starts_new_sequences_from_their_longest_prefix():
    decisions = {}
    host = SlotScheduler(3, 64, lambda turns: {t.seq_id: decisions[t.seq_id] for t in turns})
    host.register_prefix([1, 2])
    host.register_prefix([1, 2, 3, 4])
    host.register_prefix([1, 2])  # registered once
    assert host.prefixes == [[1, 2], [1, 2, 3, 4]]
    host.admit(0, [1, 2, 3, 4, 5, 6], group=PLANNER)  # both match: the longer wins
    host.admit(1, [1, 2, 3, 4], group=PLANNER)  # exactly a prefix: nothing left to write
    host.admit(2, [1, 2, 9], group=WORKER)
    first = host(events(3, {}))
    assert first.prefix.tolist() == [1, 1, 0] and first.reset.tolist() == [True] * 3
    assert first.num.tolist() == [2, 0, 1] and first.tokens[0, :2].tolist() == [5, 6]
    assert first.active.tolist() == [True] * 3
    assert host.stats.prefix_hits == 3 and host.stats.prefix_tokens == 4 + 4 + 2
    assert host.stats.prefill_tokens == 3
    # Resuming in place writes only the new tokens, never from a prefix; a context with no
    # registered prefix is written whole.
    decisions.update({0: Continue([7]), 1: RELEASE, 2: RELEASE})
    host.admit(3, [8, 1, 2], group=WORKER)
    second = host(events(3, {0: 1, 1: 1, 2: 1}))
    assert second.prefix.tolist() == [-1, -1, -1] and second.num.tolist() == [1, 3, 0]
    assert second.reset.tolist() == [False, True, False]


def test_extend_positions_count_each_lane_group_at_its_own_width():
    from matpo_jax.agents.rollout_metrics import _prefix_store_positions, extend_positions
    cfg = dataclasses.replace(BASE, decode_slots=4, max_context=256)
    options = EngineOptions(injection_buckets=(16, 64), injection_lanes=2)
    calls = [[300, 10, 70], [5], []]
    # Lane groups (300, 10): 5 chunks of 64, x 2 lanes; (70): 2 chunks x 2; (5): 16 x 2.
    assert extend_positions(calls, cfg, options) == 320 * 2 + 128 * 2 + 16 * 2
    # All slots at once: each call pays the width of its longest write on every slot.
    wide = dataclasses.replace(options, injection_lanes=4)
    assert extend_positions(calls, cfg, wide) == 320 * 4 + 16 * 4
    # The shared-prefix store: one extend per prefix at its own width among the store's widths
    # (the buckets below the store's width, 192 = 3 chunks of 64 for the longest, then 192).
    assert _prefix_store_positions([[1] * 9, [1] * 130, [1] * 60], cfg, options) == 16 + 192 + 64
