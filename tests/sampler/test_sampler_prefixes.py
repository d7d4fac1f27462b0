"""Slots started from a shared prefix's cached keys and values decode exactly what slots prefilled
with the whole context decode (greedy, full-forward reference), with the same log-probs."""
import jax
import numpy as np
import pytest

from matpo_jax.sampler.host_protocol import SlotInjection, SlotProtocolError
from matpo_jax.sampler.loop import PagedCache, run_slots
from matpo_jax.sampler.writes import extend_width, prefix_store_shape

SYSTEM = [50, 51, 52, 53, 54, 55, 56, 57, 58]  # a "system prompt" every sequence starts with
QUESTION = SYSTEM + [60, 61, 62, 63]  # a longer one some sequences share (a GRPO group's prompt)


# The dense cache, and pages of 4 tokens (prefixes of 9 and 13 tokens end mid-page: their full
# pages are shared, the partial one copied) in a pool with room for every slot and prefix.
@pytest.mark.parametrize("paged", [None, PagedCache(page_size=4)], ids=["dense", "paged"])
def test_prefix_started_slots_match_full_recompute(
        split_model, full_logits, greedy_reference, scripted_host, shapes, greedy, paged):
    graphdef, state = split_model
    # Five sequences through three slots (so prefixes also start re-used slots): a question
    # prompt exactly (nothing left to write), question + suffix, system + suffixes of two
    # lengths, and one that shares no prefix.
    prompts = [QUESTION, QUESTION + [70, 71], SYSTEM + [80], SYSTEM + list(range(20, 31)),
               [5, 6, 7]]
    chunk = [7, 8, 9, 10, 11, 12, 13]
    host = scripted_host(prompts, shapes.slots, chunk=chunk, turns=2, prefixes=(SYSTEM, QUESTION))
    run_slots(state, graphdef, host, slots=shapes.slots, max_len=shapes.max_len, sampling=greedy,
              prefixes=host.prefixes, paged=paged)
    assert sorted(host.hits) == sorted([len(QUESTION)] * 2 + [len(SYSTEM)] * 2)
    for index, prompt in enumerate(prompts):
        first = greedy_reference(prompt, shapes.max_turn)
        second = greedy_reference(prompt + first + chunk, shapes.max_turn)
        assert host.tokens[index] == prompt + first + chunk + second
        # Log-probs of the sampled tokens: the model's log-softmax (greedy = temperature 1).
        logits = full_logits(host.tokens[index])
        reference = jax.nn.log_softmax(logits, axis=-1)
        sampled = [t for t, m in enumerate(host.trainable[index]) if m]
        expected = [float(reference[t - 1, host.tokens[index][t]]) for t in sampled]
        got = [host.logprobs[index][t] for t in sampled]
        np.testing.assert_allclose(got, expected, atol=1e-4)


@pytest.fixture
def one_call(split_model, shapes, greedy):
    """Runs a host that answers its first call with `answer(injection)`, then ends the loop."""
    graphdef, state = split_model

    def run(answer, prefixes=(SYSTEM,)):
        def host(events):
            injection = SlotInjection.nothing(shapes.slots, 4)
            if host.calls == 0:
                answer(injection)
            else:
                injection.done = True
            host.calls += 1
            return injection
        host.calls = 0
        return run_slots(state, graphdef, host, slots=shapes.slots, max_len=shapes.max_len,
                         sampling=greedy, prefixes=prefixes)

    return run


def test_prefix_index_out_of_range_is_rejected(one_call):
    def answer(injection):
        injection.prefix[1], injection.reset[1], injection.active[1] = 1, True, True
    with pytest.raises(SlotProtocolError, match=r"prefix\[1\]=1 is outside \[-1, 1\)"):
        one_call(answer)


def test_prefix_without_reset_is_rejected(one_call):
    def answer(injection):
        injection.prefix[2] = 0
    with pytest.raises(SlotProtocolError, match=r"prefix\[2\] is set but reset\[2\] is not"):
        one_call(answer)


def test_prefix_plus_injection_past_the_cache_is_rejected(one_call, shapes):
    def answer(injection):
        injection.prefix[0], injection.reset[0] = 0, True
        injection.tokens = np.zeros((shapes.slots, shapes.max_len), np.int32)
        injection.num[0] = shapes.max_len - len(SYSTEM) + 1
    with pytest.raises(SlotProtocolError, match=r"num\[0\].*holds 9 tokens"):
        one_call(answer)


def test_empty_prefix_is_rejected(one_call):
    with pytest.raises(SlotProtocolError, match=r"prefixes\[1\] has 0 tokens"):
        one_call(lambda injection: None, prefixes=(SYSTEM, []))


def test_prefix_store_shape_buckets_rows_and_width():
    # Rows: a power of two; width: the smallest bucket that fits, else a multiple of the last.
    assert prefix_store_shape([], (16, 64), 256) == (0, 0)
    assert prefix_store_shape([9, 13, 5], (16, 64), 256) == (4, 16)
    assert prefix_store_shape([9, 17], (16, 64), 256) == (2, 64)
    assert prefix_store_shape([130], (16, 64), 256) == (1, 192)
    assert prefix_store_shape([250], (16, 64, 100), 256) == (1, 256)  # capped at max_len


def test_extend_width_is_the_smallest_bucket_or_whole_chunks_of_the_last():
    assert [extend_width(n, (64, 16)) for n in (1, 16, 17, 64, 65, 129)] == [16, 16, 64, 64, 128,
                                                                           192]
