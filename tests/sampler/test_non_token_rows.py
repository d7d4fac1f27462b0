"""Sampling.token_count: the rows of an embedding past its tokenizer's last id (Qwen3: ids
151,669..151,935) are never drawn, greedily or sampled, alone or per profile; the recorded
log-prob stays the full distribution's (what the trainer recomputes)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from matpo_jax.sampler.ops import (Sampling, SamplingConfigError, sample_tokens,
                                   sample_tokens_per_row)

TOKENS, ROWS = 7, 10


def bait_logits(batch: int) -> jax.Array:
    """Rows 7..9 (no token) lead every real id by 4 logits."""
    logits = np.random.default_rng(0).normal(size=(batch, ROWS)).astype(np.float32)
    logits[:, TOKENS:] += 4.0
    return jnp.asarray(logits)


@pytest.mark.parametrize("temperature", [0.0, 0.7, 1.0])
def test_rows_without_a_token_are_never_drawn(temperature):
    logits = bait_logits(256)
    keys = jax.random.split(jax.random.key(0), 256)
    sampling = Sampling(temperature=temperature, token_count=TOKENS)
    tokens, logprobs = sample_tokens(logits, keys, sampling)
    assert int(tokens.max()) < TOKENS
    full = jax.nn.log_softmax(logits / sampling.logprob_temperature, axis=-1)
    np.testing.assert_allclose(logprobs, full[jnp.arange(256), tokens], rtol=1e-5, atol=1e-6)
    if temperature == 0.0:
        np.testing.assert_array_equal(tokens, jnp.argmax(logits[:, :TOKENS], axis=-1))
    unlimited, _ = sample_tokens(logits, keys, Sampling(temperature=temperature))
    assert int(unlimited.max()) >= TOKENS  # the bait is what an unlimited draw takes
    profiles = (sampling, Sampling(temperature=0.0, token_count=TOKENS))
    per_row, per_row_logprobs = sample_tokens_per_row(logits, keys, profiles,
                                                      jnp.zeros(256, jnp.int32))
    np.testing.assert_array_equal(per_row, tokens)
    np.testing.assert_allclose(per_row_logprobs, logprobs, rtol=1e-6)


def test_token_count_settings_are_checked():
    with pytest.raises(SamplingConfigError, match="token_count must be an integer >= 0"):
        Sampling(token_count=-1)
    with pytest.raises(SamplingConfigError, match="profiles differ in token_count"):
        sample_tokens_per_row(bait_logits(2), jax.random.split(jax.random.key(0), 2),
                              (Sampling(token_count=7), Sampling(token_count=8)),
                              jnp.zeros(2, jnp.int32))
