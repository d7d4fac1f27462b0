"""The loop <-> host protocol: events, slot reuse, stop reasons, the done path, host errors."""
import types

import numpy as np
import pytest

from matpo_jax.sampler.host_protocol import (STOP_CACHE_FULL, STOP_EOS, STOP_IM_END,
                                             STOP_TOOL_CALL, STOP_TURN_CAP, SlotInjection,
                                             SlotProtocolError, chat_stop_ids)
from matpo_jax.sampler.loop import Sampling, generate, run_slots


@pytest.fixture
def run(split_model, shapes, greedy):
    """run_slots on the tiny model with the shared shapes (greedy unless told otherwise)."""
    graphdef, state = split_model

    def run_host(host, sampling=greedy, **kwargs):
        return run_slots(state, graphdef, host, slots=shapes.slots, max_len=shapes.max_len,
                         sampling=sampling, **kwargs)
    return run_host


def test_more_sequences_than_slots_reuse_freed_slots(run, scripted_host, shapes):
    prompts = [[i + 1] * (i % 4 + 1) for i in range(7)]
    host = scripted_host(prompts, shapes.slots, chunk=[7, 8, 9], turns=2)
    stats = run(host)
    assert not stats.hit_limit
    assert stats.host_calls == host.calls
    assert stats.sampled_tokens == len(prompts) * 2 * shapes.max_turn
    # Every sequence finished both turns, each at the turn cap with a full turn buffer; the host
    # checked each event's cache_len against the context it rebuilt.
    assert all(reasons == [STOP_TURN_CAP] * 2 for reasons in host.stop_reasons)
    assert {turn_len for (_, _, _, _, turn_len, _) in host.log} == {shapes.max_turn}
    assert len(host.log) == 2 * len(prompts)
    # 7 sequences over 3 slots: every slot served several sequences, each sequence one slot.
    slot_loads = np.bincount([next(iter(used)) for used in host.slots_used],
                             minlength=shapes.slots)
    assert all(len(used) == 1 for used in host.slots_used) and (slot_loads >= 2).all()


def test_stop_id_ends_the_turn_with_its_reason(run, split_model, scripted_host, shapes, greedy):
    graphdef, state = split_model
    prompt = [5, 17, 2, 40, 9]
    free_run = generate(state, graphdef, [prompt], shapes.max_turn, greedy, slots=shapes.slots,
                        max_len=shapes.max_len)[0][0].tolist()
    stop_token = free_run[2]
    first = free_run.index(stop_token)
    host = scripted_host([prompt], shapes.slots, turns=1)
    run(host, stop_ids={stop_token: STOP_TOOL_CALL, 95: STOP_EOS})
    assert host.tokens[0] == prompt + free_run[:first + 1]  # the stop token is part of the turn
    assert host.stop_reasons[0] == [STOP_TOOL_CALL]


def test_chat_stop_ids_prefers_turn_end_when_eos_is_im_end():
    fmt = types.SimpleNamespace(eos_id=3, im_end_id=3, tool_call_end_id=5)
    assert chat_stop_ids(fmt) == {3: STOP_IM_END, 5: STOP_TOOL_CALL}


def test_full_cache_stops_the_slot(run, scripted_host, shapes):
    nearly_full = list(range(1, shapes.max_len - 2))  # room for 3 sampled tokens
    full = [2] * shapes.max_len  # no room at all: stops before sampling
    host = scripted_host([nearly_full, full], shapes.slots, turns=1)
    run(host)
    assert host.stop_reasons == [[STOP_CACHE_FULL], [STOP_CACHE_FULL]]
    by_seq = {seq: (turn_len, cache_len) for (_, _, seq, _, turn_len, cache_len) in host.log}
    assert by_seq == {0: (3, shapes.max_len), 1: (0, shapes.max_len)}


def test_top_k_one_equals_greedy(split_model, shapes, greedy):
    graphdef, state = split_model
    prompts = [[3], [5, 17, 2, 40, 9], list(range(20, 33))]
    top1 = Sampling(top_k=1, max_turn_tokens=shapes.max_turn)
    greedy_out, top1_out = (
        generate(state, graphdef, prompts, shapes.max_turn, sampling, slots=shapes.slots,
                 max_len=shapes.max_len) for sampling in (greedy, top1))
    for g_tokens, g_logprobs, t_tokens, t_logprobs in zip(*greedy_out, *top1_out):
        assert g_tokens.tolist() == t_tokens.tolist()
        np.testing.assert_allclose(g_logprobs, t_logprobs, atol=1e-6)  # both at temperature 1


class _ListHost:
    """Answers from a list of callables, one per host call, recording the events it saw."""

    def __init__(self, *answers):
        self.answers, self.events = list(answers), []

    def __call__(self, events):
        self.events.append(events)
        return self.answers.pop(0)(events)


def _idle(events, width=1):
    return SlotInjection.nothing(len(events.stopped), width)


def _load(prompt):
    def answer(events):
        injection = _idle(events, len(prompt))
        injection.tokens[0], injection.num[0], injection.reset[0] = prompt, len(prompt), True
        injection.active[0] = True
        return injection
    return answer


def test_done_at_the_first_call_decodes_nothing(run, shapes):
    def finish(events):
        injection = _idle(events)
        injection.done = True
        return injection
    host = _ListHost(finish)
    stats = run(host)
    assert (stats.decode_steps, stats.host_calls, stats.sampled_tokens) == (0, 1, 0)
    first = host.events[0]
    assert not first.stopped.any() and (first.cache_len == 0).all()
    assert first.turn_tokens.shape == (shapes.slots, shapes.max_turn)


def test_host_exception_is_reraised(run):
    def fail(events):
        raise RuntimeError("tool server down")
    with pytest.raises(RuntimeError, match="tool server down"):
        run(_ListHost(_load([1, 2, 3]), fail))


def test_injection_past_the_cache_is_rejected(run, shapes):
    def overflow(events):
        injection = _idle(events, shapes.max_len)
        injection.num[0], injection.active[0] = shapes.max_len, True  # slot 0 holds 3 + a turn
        return injection
    with pytest.raises(SlotProtocolError, match=r"num\[0\]"):
        run(_ListHost(_load([1, 2, 3]), overflow))


def test_active_empty_slot_is_rejected(run):
    def activate_empty(events):
        injection = _idle(events)
        injection.active[1] = True
        return injection
    with pytest.raises(SlotProtocolError, match=r"active\[1\]"):
        run(_ListHost(activate_empty))


def test_step_cap_ends_a_loop_the_host_never_finishes(run):
    def keep_going(events):
        injection = _idle(events)
        injection.active[0] = True
        return injection
    stats = run(_ListHost(_load([1, 2, 3]), *[keep_going] * 100), max_steps=5)
    assert stats.hit_limit and stats.decode_steps == 5 and stats.sampled_tokens == 5


def test_turn_cap_shortens_one_turn(run, shapes):
    def load_capped(events):
        injection = _load([1, 2, 3])(events)
        injection.turn_cap[0] = 3
        return injection

    def continue_uncapped(events):
        injection = _idle(events, 2)
        injection.tokens[0], injection.num[0], injection.active[0] = [4, 5], 2, True
        return injection

    def finish(events):
        injection = _idle(events)
        injection.done = True
        return injection

    host = _ListHost(load_capped, continue_uncapped, finish)
    run(host)
    first, second = host.events[1], host.events[2]
    assert first.turn_len[0] == 3 and first.stop_reason[0] == STOP_TURN_CAP
    assert second.turn_len[0] == shapes.max_turn and second.stop_reason[0] == STOP_TURN_CAP


def test_turn_cap_past_the_turn_buffer_is_rejected(run, shapes):
    def overlong(events):
        injection = _load([1, 2, 3])(events)
        injection.turn_cap[0] = shapes.max_turn + 1
        return injection
    with pytest.raises(SlotProtocolError, match=r"turn_cap\[0\]=9 is outside \[0, 8\]"):
        run(_ListHost(overlong))
