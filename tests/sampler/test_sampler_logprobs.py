"""Recorded log-probs are the model's temperature-scaled log-softmax; top-k/top-p/temperature math."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from matpo_jax.sampler.loop import Sampling, run_slots
from matpo_jax.sampler.ops import (SamplingConfigError, first_index_of_max, sample_tokens,
                                    truncate_top_k, truncate_top_p)

TEMPERATURE, TOP_P = 0.7, 0.8
PROMPTS = [[4, 4, 1], [60, 2, 33, 12, 5, 8, 19], [11], [90, 91]]


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


@pytest.fixture(scope="module")
def sample_rollouts(split_model, scripted_host, shapes):
    """seed -> the scripted host after two sampled turns per prompt (a tool chunk in between)."""
    graphdef, state = split_model
    sampling = Sampling(temperature=TEMPERATURE, top_p=TOP_P, max_turn_tokens=shapes.max_turn)

    def sample(seed):
        host = scripted_host(PROMPTS, shapes.slots, turns=2)
        run_slots(state, graphdef, host, slots=shapes.slots, max_len=shapes.max_len,
                  sampling=sampling, rng=jax.random.key(seed))
        return host
    return sample


@pytest.fixture(scope="module")
def rollouts(sample_rollouts):
    return sample_rollouts(0)


def test_logprobs_equal_full_forward_scaled_log_softmax(rollouts, full_logits, shapes):
    checked = 0
    for tokens, trainable, logprobs in zip(rollouts.tokens, rollouts.trainable, rollouts.logprobs):
        reference = log_softmax(full_logits(tokens) / TEMPERATURE)
        for i in np.flatnonzero(trainable):
            # Position i's token was predicted by the logits at i - 1.
            assert abs(logprobs[i] - reference[i - 1, tokens[i]]) < 1e-4, (i, tokens)
            checked += 1
    assert checked == len(PROMPTS) * 2 * shapes.max_turn


def test_sampled_tokens_lie_in_the_top_p_nucleus(rollouts, full_logits):
    outside_greedy = 0
    for tokens, trainable in zip(rollouts.tokens, rollouts.trainable):
        probs = np.exp(log_softmax(full_logits(tokens) / TEMPERATURE))
        for i in np.flatnonzero(trainable):
            row = probs[i - 1]
            mass_before = row[row > row[tokens[i]]].sum()
            assert mass_before < TOP_P + 1e-4
            outside_greedy += tokens[i] != np.argmax(row)
    assert outside_greedy > 0  # it really sampled, not argmax


def test_same_key_same_tokens_other_key_other_tokens(rollouts, sample_rollouts):
    again, other = sample_rollouts(0), sample_rollouts(1)
    assert again.tokens == rollouts.tokens
    assert other.tokens != rollouts.tokens


def test_a_stream_samples_the_same_tokens_in_any_slot_and_any_company(
        split_model, scripted_host, shapes):
    """A draw's key is (rng, stream, cache position): the same sequence samples the same tokens
    whichever slot it lands in and whichever other sequences share the batch (what makes a
    multi-process run sample what a one-process run samples)."""
    graphdef, state = split_model
    sampling = Sampling(temperature=TEMPERATURE, top_p=TOP_P, max_turn_tokens=shapes.max_turn)

    def sample(prompt_ids):
        host = scripted_host([PROMPTS[i] for i in prompt_ids], shapes.slots, turns=2,
                             streams=[100 + i for i in prompt_ids])
        run_slots(state, graphdef, host, slots=shapes.slots, max_len=shapes.max_len,
                  sampling=sampling, rng=jax.random.key(3))
        return {i: (tokens, host.slots_used[k]) for k, (i, tokens)
                in enumerate(zip(prompt_ids, host.tokens))}

    together = sample([0, 1, 2, 3])  # prompt 3 waits for a free slot
    alone = sample([3])  # slot 0, nobody else
    reordered = sample([2, 3, 1])  # slot 1, other neighbours
    assert together[3][1] != alone[3][1] or alone[3][1] != reordered[3][1]
    assert alone[3][0] == together[3][0] == reordered[3][0]
    assert reordered[1][0] == together[1][0] and reordered[2][0] == together[2][0]
    # The streams differ, so do the draws: prompt 0 under prompt 1's stream samples otherwise.
    host = scripted_host([PROMPTS[1]], shapes.slots, turns=2, streams=[100])
    run_slots(state, graphdef, host, slots=shapes.slots, max_len=shapes.max_len,
              sampling=sampling, rng=jax.random.key(3))
    assert host.tokens[0] != together[1][0]


def test_truncations_keep_the_expected_tokens():
    logits = jnp.log(jnp.array([[0.05, 0.5, 0.15, 0.3]]))
    kept = lambda x: np.flatnonzero(np.isfinite(np.asarray(x[0]))).tolist()
    assert kept(truncate_top_p(logits, 0.7)) == [1, 3]  # 0.5 + 0.3 reaches 0.7
    assert kept(truncate_top_p(logits, 0.85)) == [1, 2, 3]
    assert kept(truncate_top_p(logits, 0.3)) == [1]  # the most likely token always survives
    assert kept(truncate_top_k(logits, 2)) == [1, 3]
    assert kept(truncate_top_k(logits, 0)) == [0, 1, 2, 3]


def test_sampling_frequencies_follow_the_truncated_tempered_distribution():
    probs = np.array([0.05, 0.5, 0.15, 0.3])
    draws = 40_000
    logits = jnp.broadcast_to(jnp.log(jnp.asarray(probs, jnp.float32)), (draws, 4))
    keys = jax.random.split(jax.random.key(3), draws)
    sampling = Sampling(temperature=2.0, top_k=3)
    tokens, logprobs = sample_tokens(logits, keys, sampling)
    tempered = probs ** 0.5 / (probs ** 0.5).sum()
    expected = np.where(np.arange(4) == 0, 0.0, tempered)  # top-3 drops token 0
    expected /= expected.sum()
    frequencies = np.bincount(np.asarray(tokens), minlength=4) / draws
    np.testing.assert_allclose(frequencies, expected, atol=0.01)
    # The recorded log-prob is of the tempered distribution before truncation.
    np.testing.assert_allclose(np.asarray(logprobs), np.log(tempered)[np.asarray(tokens)], atol=1e-5)


def test_greedy_records_the_temperature_one_logprob():
    logits = jnp.array([[1.0, 3.0, 2.0]])
    tokens, logprobs = sample_tokens(logits, jax.random.split(jax.random.key(0), 1),
                                     Sampling(temperature=0.0))
    assert int(tokens[0]) == 1
    np.testing.assert_allclose(float(logprobs[0]), float(jax.nn.log_softmax(logits)[0, 1]), atol=1e-6)


def test_first_index_of_max_is_argmax_and_draws_equal_categorical():
    """The two-reduction argmax the sampler uses agrees with jnp.argmax (ties -> lowest index,
    -inf entries), and the Gumbel-max draw built on it picks jax.random.categorical's tokens."""
    ties = jnp.array([[1.0, 3.0, 3.0, 0.0], [5.0, 5.0, 5.0, 5.0], [-jnp.inf, 2.0, -jnp.inf, 2.0]])
    np.testing.assert_array_equal(first_index_of_max(ties), jnp.argmax(ties, -1))
    logits = jax.random.normal(jax.random.key(5), (256, 97))
    np.testing.assert_array_equal(first_index_of_max(logits), jnp.argmax(logits, -1))
    keys = jax.random.split(jax.random.key(6), 256)
    tokens, _ = sample_tokens(logits, keys, Sampling())
    np.testing.assert_array_equal(tokens, jax.vmap(jax.random.categorical)(keys, logits))


@pytest.mark.parametrize("field, value", [("temperature", -1.0), ("top_p", 0.0), ("top_p", 1.5),
                                          ("top_k", -2), ("max_turn_tokens", 0)])
def test_bad_sampling_settings_name_the_field(field, value):
    with pytest.raises(SamplingConfigError, match=field):
        Sampling(**{field: value})
