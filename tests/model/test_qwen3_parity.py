"""Our Qwen3 against transformers' on tiny random checkpoints: forward, packed rows, KV cache."""
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from matpo_jax.model import (KVCache, DecoderConfig, CausalLM, init_cache, load_pretrained,
                             save_pretrained)

TOL = 1e-4


def tokens(shape, seed=0, vocab=128):
    return np.random.RandomState(seed).randint(0, vocab, shape).astype(np.int32)


def layers(per_layer):
    """The per-layer cache arrays stacked: [layers, *one layer's shape]."""
    return np.stack([np.asarray(x) for x in per_layer])


def max_diff(a, b):
    return float(np.max(np.abs(np.asarray(a, np.float32) - np.asarray(b, np.float32))))


def test_forward_matches_transformers(hf_checkpoint, jit_apply):
    model = load_pretrained(hf_checkpoint.path)
    assert model.config.tie_word_embeddings == hf_checkpoint.torch_model.config.tie_word_embeddings
    assert model.config.num_key_value_heads < model.config.num_attention_heads  # GQA exercised
    batch = tokens((2, 24), seed=1)
    expected = hf_checkpoint.logits(batch)
    logits = jit_apply(model, "__call__", jnp.asarray(batch))
    assert logits.dtype == jnp.float32 and logits.shape == expected.shape
    assert np.abs(expected).max() > 1.0  # weights are large enough for a bug to show
    diff = max_diff(logits, expected)
    tied = model.config.tie_word_embeddings
    print(f"\nforward vs transformers (tied={tied}): max|diff|={diff:.2e}")
    assert diff < TOL


def test_packed_segments_equal_separate_sequences(untied_model, untied_checkpoint, jit_apply):
    first, second = tokens((1, 7), seed=2), tokens((1, 5), seed=3)
    pad = 4
    row = np.concatenate([first, second, np.zeros((1, pad), np.int32)], axis=1)
    positions = np.concatenate([np.arange(7), np.arange(5), np.zeros(pad, int)])[None]
    segments = np.array([[1] * 7 + [2] * 5 + [0] * pad])
    # Two rows, the second packing the sequences in the other order.
    row2 = np.concatenate([second, first, np.zeros((1, pad), np.int32)], axis=1)
    positions2 = np.concatenate([np.arange(5), np.arange(7), np.zeros(pad, int)])[None]
    segments2 = np.array([[3] * 5 + [4] * 7 + [0] * pad])
    packed = jit_apply(untied_model, "__call__", jnp.asarray(np.concatenate([row, row2])),
                       jnp.asarray(np.concatenate([positions, positions2])),
                       jnp.asarray(np.concatenate([segments, segments2])))
    assert np.isfinite(np.asarray(packed)).all()  # padding rows attend to nothing, yet no NaN
    expected_first = untied_checkpoint.logits(first)[0]
    expected_second = untied_checkpoint.logits(second)[0]
    diffs = [max_diff(packed[0, :7], expected_first), max_diff(packed[0, 7:12], expected_second),
             max_diff(packed[1, :5], expected_second), max_diff(packed[1, 5:12], expected_first)]
    print(f"\npacked vs separate: max|diff|={max(diffs):.2e}")
    assert max(diffs) < TOL
    # Without segment ids the second sequence would see the first: the mask really matters.
    unpacked = untied_model(jnp.asarray(row), positions=jnp.asarray(positions))  # eager, on purpose
    assert max_diff(unpacked[0, 7:12], expected_second) > 1e-2


def test_cached_generation_matches_full_forward(untied_model, untied_checkpoint, jit_apply):
    """Rows of different prompt lengths; decode steps (one row paused once); a multi-token extend
    mid-sequence, as for an injected tool response; then more decode steps."""
    sequences = tokens((3, 20), seed=4)
    expected = untied_checkpoint.logits(sequences)
    model = untied_model
    cache = init_cache(untied_model.config, batch=3, max_len=24)
    written = np.array([3, 8, 5])  # tokens consumed per row so far
    diffs = []

    def check(logits, counts):
        for b, n in enumerate(counts):
            start = written[b]
            if n:
                diffs.append(max_diff(logits[b, :n], expected[b, start:start + n]))
        written[:] += counts

    def chunk(width, counts):
        return np.stack([np.pad(sequences[b, written[b]:written[b] + n], (0, width - n))
                         for b, n in enumerate(counts)])

    prompt_lengths = written.copy()
    written[:] = 0
    logits, cache = jit_apply(model, "prefill", jnp.asarray(chunk(8, prompt_lengths)),
                            jnp.asarray(prompt_lengths), cache)
    check(logits, prompt_lengths)
    for active in ([1, 1, 1], [1, 0, 1], [1, 1, 1]):
        active = np.array(active)
        next_tokens = sequences[np.arange(3), written]
        before = cache
        logits, cache = jit_apply(model, "decode", jnp.asarray(next_tokens), cache,
                                  jnp.asarray(active, bool))
        check(logits[:, None], active)
        if not active[1]:  # a paused row is untouched
            np.testing.assert_array_equal(layers(cache.k)[:, 1], layers(before.k)[:, 1])
            assert int(cache.lengths[1]) == int(before.lengths[1])
    tool_response = np.array([5, 3, 0])  # row 2 gets nothing and must stay as it is
    before = cache
    logits, cache = jit_apply(model, "extend", jnp.asarray(chunk(5, tool_response)),
                              jnp.asarray(tool_response), cache)
    check(logits, tool_response)
    np.testing.assert_array_equal(layers(cache.k)[:, 2], layers(before.k)[:, 2])
    for _ in range(2):
        logits, cache = jit_apply(model, "decode", jnp.asarray(sequences[np.arange(3), written]),
                                  cache, jnp.ones(3, bool))
        check(logits[:, None], np.ones(3, int))
    np.testing.assert_array_equal(cache.lengths, written)
    print(f"\nprefill/decode/extend vs transformers full forward: max|diff|={max(diffs):.2e}")
    assert max(diffs) < TOL


def test_writes_past_max_len_are_dropped_not_wrapped(untied_model, untied_checkpoint, jit_apply):
    sequences = tokens((2, 10), seed=5)
    expected = untied_checkpoint.logits(sequences)
    cache = init_cache(untied_model.config, batch=2, max_len=6)
    _, cache = jit_apply(untied_model, "prefill", jnp.asarray(sequences[:, :4]), jnp.array([4, 2]),
                         cache)
    before = cache
    logits, cache = jit_apply(untied_model, "extend", jnp.asarray(sequences[:, 4:8]),
                              jnp.array([4, 0]), cache)
    assert cache.lengths.tolist() == [8, 2]  # overflow is visible to the caller
    # keys are slot-minor [.., D, S], values [.., S, D]
    np.testing.assert_array_equal(layers(cache.k)[:, 0, :, :, :4], layers(before.k)[:, 0, :, :, :4])  # nothing wrapped
    np.testing.assert_array_equal(layers(cache.v)[:, 0, :, :4], layers(before.v)[:, 0, :, :4])
    np.testing.assert_array_equal(layers(cache.k)[:, 1], layers(before.k)[:, 1])  # num_valid 0: untouched
    assert not np.array_equal(layers(cache.k)[:, 0, :, :, 4:6], layers(before.k)[:, 0, :, :, 4:6])  # in-range slots written
    assert not np.array_equal(layers(cache.v)[:, 0, :, 4:6], layers(before.v)[:, 0, :, 4:6])
    # Tokens that still fit in the cache have exact logits.
    assert max_diff(logits[0, :2], expected[0, 4:6]) < TOL


def test_save_pretrained_round_trips_through_transformers(untied_model, untied_checkpoint,
                                                          tmp_path):
    import transformers

    save_pretrained(untied_model, str(tmp_path))
    with open(os.path.join(tmp_path, "config.json")) as f:
        config = json.load(f)
    assert config["model_type"] == "qwen3" and config["architectures"] == ["Qwen3ForCausalLM"]
    reloaded = transformers.Qwen3ForCausalLM.from_pretrained(str(tmp_path)).eval()
    batch = tokens((2, 12), seed=6)
    import torch
    with torch.no_grad():
        logits = reloaded(torch.tensor(batch)).logits.numpy()
    diff = max_diff(logits, untied_checkpoint.logits(batch))
    print(f"\nsave_pretrained -> transformers round trip: max|diff|={diff:.2e}")
    assert diff < 1e-6
    assert DecoderConfig.from_hf_dict(config) == untied_model.config


def test_bfloat16_compute_runs_and_stays_close(untied_checkpoint, untied_model, jit_apply):
    model16 = load_pretrained(untied_checkpoint.path, dtype="bfloat16")
    assert model16.layers[0].mlp.up_proj.kernel[...].dtype == jnp.float32  # params stay float32
    batch = jnp.asarray(tokens((2, 12), seed=7))
    logits32 = jit_apply(untied_model, "__call__", batch)
    logits16 = jit_apply(model16, "__call__", batch)
    assert logits16.dtype == jnp.float32 and np.isfinite(np.asarray(logits16)).all()
    scale = float(jnp.abs(logits32).max())
    diff = max_diff(logits16, logits32)
    print(f"\nbfloat16 vs float32 compute: max|diff|={diff:.3f} (max|logit|={scale:.2f})")
    assert diff < 0.1 * scale
    cache = init_cache(model16.config, batch=2, max_len=16)
    assert all(k.dtype == jnp.bfloat16 for k in cache.k + cache.v)
    logits, cache = jit_apply(model16, "prefill", batch, jnp.array([12, 7]), cache)
    assert max_diff(logits[1, :7], logits32[1, :7]) < 0.1 * scale


def test_fresh_model_shapes_and_cache_contract():
    config = DecoderConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=1, head_dim=8,
                         tie_word_embeddings=True)
    model = CausalLM(config, rngs=nnx.Rngs(0))
    assert not hasattr(model, "lm_head")
    cache = init_cache(config, batch=2, max_len=5)
    # Per layer, heads-major: keys [batch, kv_heads, head_dim, max_len], values [.., max_len, head_dim].
    assert isinstance(cache, KVCache) and [k.shape for k in cache.k] == [(2, 1, 8, 5)]
    assert [v.shape for v in cache.v] == [(2, 1, 5, 8)]
    assert cache.lengths.dtype == jnp.int32 and cache.max_len == 5
    logits, cache = model.decode(jnp.array([1, 2]), cache, jnp.array([True, False]))
    assert logits.shape == (2, 64) and cache.lengths.tolist() == [1, 0]


def test_padding_is_isolated_and_gradients_are_finite(untied_model, jit_apply):
    """Changing padding tokens changes no real logit; a loss over real tokens has finite gradients
    even though padding rows attend to nothing."""
    real = tokens((2, 9), seed=8)
    segments = jnp.asarray(np.array([[1] * 9 + [0] * 3, [1] * 5 + [0] * 7]))
    batch_a = np.concatenate([real, np.zeros((2, 3), np.int32)], axis=1)
    batch_b = batch_a.copy()
    batch_b[0, 9:] = 7
    batch_b[1, 5:] = 11
    logits_a = jit_apply(untied_model, "__call__", jnp.asarray(batch_a), None, segments)
    logits_b = jit_apply(untied_model, "__call__", jnp.asarray(batch_b), None, segments)
    np.testing.assert_array_equal(logits_a[0, :9], logits_b[0, :9])
    np.testing.assert_array_equal(logits_a[1, :5], logits_b[1, :5])
    # The chunk-friendly split of __call__ gives the same logits.
    hidden = jit_apply(untied_model, "hidden_states", jnp.asarray(batch_a), None, segments)
    np.testing.assert_allclose(untied_model.logits_from_hidden(hidden[:, :4]), logits_a[:, :4],
                               atol=1e-5)

    graphdef, state = nnx.split(untied_model)

    def loss(state):
        logits = nnx.merge(graphdef, state)(jnp.asarray(batch_a), None, segments)
        logp = jax.nn.log_softmax(logits).max(-1)
        return -(logp * (segments != 0)).sum()

    grads = jax.jit(jax.grad(loss))(state)
    leaves = jax.tree_util.tree_leaves(grads)
    assert all(np.isfinite(np.asarray(g)).all() for g in leaves)
    assert all(float(jnp.abs(g).max()) > 0 for g in leaves)  # every parameter gets a gradient
