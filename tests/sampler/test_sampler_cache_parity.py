"""The KV-cached slot loop decodes exactly what a full forward recompute decodes (greedy)."""
from matpo_jax.sampler.host_protocol import STOP_TURN_CAP
from matpo_jax.sampler.loop import generate, run_slots


def test_greedy_generate_matches_full_recompute_for_ragged_queued_prompts(
        split_model, greedy_reference, shapes, greedy):
    graphdef, state = split_model
    # Ragged lengths share the batch; five prompts over three slots also queue through generate.
    prompts = [[3], [5, 17, 2, 40, 9], list(range(20, 33)), [81, 82], list(range(40, 50))]
    tokens, _ = generate(state, graphdef, prompts, shapes.max_turn, greedy, slots=shapes.slots,
                         max_len=shapes.max_len)
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


def test_greedy_after_injected_tool_response_matches_full_recompute(
        split_model, greedy_reference, scripted_host, shapes, greedy):
    prompts = [[4, 4, 1], [60, 2, 33, 12, 5, 8, 19], [11], [90, 91], [45, 46, 47, 48]]
    chunk = [7, 8, 9, 10, 11, 12, 13]
    host = _run_two_turns(split_model, scripted_host, shapes, greedy, prompts, chunk)
    for index, prompt in enumerate(prompts):
        assert host.tokens[index] == _expected_two_turns(greedy_reference, prompt, chunk,
                                                         shapes.max_turn)
        assert host.stop_reasons[index] == [STOP_TURN_CAP, STOP_TURN_CAP]


def test_long_injections_written_in_chunks_match_full_recompute(
        split_model, greedy_reference, scripted_host, shapes, greedy):
    # Widths (4, 16): a 3-token prompt takes the 4-wide extend, the 25-token prompt and the
    # 20-token tool response go through the loop of 16-wide chunks (ragged across rows).
    prompts = [list(range(30, 55)), [1, 2, 3], list(range(60, 77))]
    chunk = list(range(5, 25))
    host = _run_two_turns(split_model, scripted_host, shapes, greedy, prompts, chunk,
                          buckets=(4, 16))
    for index, prompt in enumerate(prompts):
        assert host.tokens[index] == _expected_two_turns(greedy_reference, prompt, chunk,
                                                         shapes.max_turn)
