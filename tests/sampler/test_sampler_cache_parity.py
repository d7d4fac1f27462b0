"""The KV-cached slot loop decodes exactly what a full forward recompute decodes (greedy), with
the dense cache and with a paged one (model/paged_cache.py)."""
import pytest

from matpo_jax.sampler.host_protocol import STOP_TURN_CAP, SlotProtocolError
from matpo_jax.sampler.loop import PagedCache, generate, run_slots

# The dense cache, and pages of 8 tokens in a pool with room for every slot at MAX_LEN.
CACHES = pytest.mark.parametrize("paged", [None, PagedCache(page_size=8)],
                                 ids=["dense", "paged"])


@CACHES
def test_greedy_generate_matches_full_recompute_for_ragged_queued_prompts(
        split_model, greedy_reference, shapes, greedy, paged):
    graphdef, state = split_model
    # Ragged lengths share the batch; five prompts over three slots also queue through generate.
    prompts = [[3], [5, 17, 2, 40, 9], list(range(20, 33)), [81, 82], list(range(40, 50))]
    tokens, _ = generate(state, graphdef, prompts, shapes.max_turn, greedy, slots=shapes.slots,
                         max_len=shapes.max_len, paged=paged)
    for prompt, sampled in zip(prompts, tokens):
        assert sampled.tolist() == greedy_reference(prompt, shapes.max_turn)


def _run_two_turns(split_model, scripted_host, shapes, greedy, prompts, chunk, **kwargs):
    graphdef, state = split_model
    host = scripted_host(prompts, shapes.slots, chunk=chunk, turns=2)
    run_slots(state, graphdef, host, slots=shapes.slots, max_len=shapes.max_len, sampling=greedy,
              **kwargs)
    return host


def _expected_two_turns(greedy_reference, prompt, chunk, turn_tokens):
    # The reference rebuilds the context and recomputes the full forward for every token.
    first_turn = greedy_reference(prompt, turn_tokens)
    second_turn = greedy_reference(prompt + first_turn + chunk, turn_tokens)
    return prompt + first_turn + chunk + second_turn


@CACHES
def test_greedy_after_injected_tool_response_matches_full_recompute(
        split_model, greedy_reference, scripted_host, shapes, greedy, paged):
    prompts = [[4, 4, 1], [60, 2, 33, 12, 5, 8, 19], [11], [90, 91], [45, 46, 47, 48]]
    chunk = [7, 8, 9, 10, 11, 12, 13]
    host = _run_two_turns(split_model, scripted_host, shapes, greedy, prompts, chunk, paged=paged)
    for index, prompt in enumerate(prompts):
        assert host.tokens[index] == _expected_two_turns(greedy_reference, prompt, chunk,
                                                         shapes.max_turn)
        assert host.stop_reasons[index] == [STOP_TURN_CAP, STOP_TURN_CAP]


@CACHES
def test_long_injections_written_in_chunks_match_full_recompute(
        split_model, greedy_reference, scripted_host, shapes, greedy, paged):
    # Widths (4, 16): a 3-token prompt takes the 4-wide extend, the 25-token prompt and the
    # 20-token tool response go through the loop of 16-wide chunks (ragged across rows).
    prompts = [list(range(30, 55)), [1, 2, 3], list(range(60, 77))]
    chunk = list(range(5, 25))
    host = _run_two_turns(split_model, scripted_host, shapes, greedy, prompts, chunk,
                          buckets=(4, 16), paged=paged)
    for index, prompt in enumerate(prompts):
        assert host.tokens[index] == _expected_two_turns(greedy_reference, prompt, chunk,
                                                         shapes.max_turn)


def test_a_page_pool_too_small_stops_the_loop_and_names_the_setting(
        split_model, scripted_host, shapes, greedy):
    # 3 slots of up to 64 tokens over 4 pages of 8: three prompts of 13 tokens need 6.
    prompts = [list(range(20, 33))] * 3
    with pytest.raises(SlotProtocolError, match=r"ran out of pages: 4 pages of 8 tokens.*"
                                                r"rollout.kv_pages"):
        _run_two_turns(split_model, scripted_host, shapes, greedy, prompts, [7, 8],
                       paged=PagedCache(page_size=8, num_pages=4))


def test_a_paged_cache_needs_whole_pages(split_model, shapes, greedy):
    graphdef, state = split_model
    with pytest.raises(SlotProtocolError, match=r"max_len \(64\) to be a multiple of its page "
                                                r"size \(48\)"):
        generate(state, graphdef, [[1, 2]], 4, greedy, max_len=shapes.max_len,
                 paged=PagedCache(page_size=48))
