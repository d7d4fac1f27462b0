"""The blockwise log-softmax (no [rows, T, vocab] logits) equals the dense computation: values,
entropy and gradients, at temperature 1 and below, through the model objective the train step
differentiates, and its compiled memory stays far below the size of the logits."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from matpo_jax.model import DecoderConfig, CausalLM
from matpo_jax.trainer import logprobs as logprobs_lib
from matpo_jax.trainer import loss as loss_lib
from matpo_jax.trainer.packing import PackedBatch
from fixtures.losses import default_loss


def _relative_error(got, want):
    return float(jnp.max(jnp.abs(got - want)) / jnp.max(jnp.abs(want)))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_blocked_equals_dense_values_entropy_and_gradients(temperature):
    """Both temperatures: the cotangent of the scaled logits carries the 1 / T factor."""
    rng = np.random.default_rng(0)
    batch, length, width, vocab = 2, 37, 16, 96
    hidden = jnp.asarray(rng.normal(size=(batch, length, width)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(width, vocab)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, vocab, (batch, length)))
    segments = jnp.asarray([[1] * 20 + [2] * 10 + [0] * 7, [3] * 37])
    weights = [jnp.asarray(rng.normal(size=(batch, length)), jnp.float32) for _ in range(2)]

    def dense(hidden, head):
        logits = jnp.einsum("bth,hv->btv", hidden, head)
        logp, entropy, predictable = loss_lib.token_logprobs(logits, tokens, segments, True,
                                                             temperature)
        return jnp.sum(logp * weights[0]) + jnp.sum(entropy * weights[1]), (logp, entropy,
                                                                              predictable)

    def blocked(hidden, head):
        # 8-position blocks (37 is not a multiple) and 6 strided vocabulary blocks of 16.
        logp, entropy, predictable = logprobs_lib.next_token_logprobs(
            hidden, head, tokens, segments, temperature=temperature, with_entropy=True,
            seq_block=8, vocab_block=20)
        return jnp.sum(logp * weights[0]) + jnp.sum(entropy * weights[1]), (logp, entropy,
                                                                              predictable)

    (_, want), want_grads = jax.value_and_grad(dense, (0, 1), has_aux=True)(hidden, head)
    (_, got), got_grads = jax.jit(jax.value_and_grad(blocked, (0, 1), has_aux=True))(hidden, head)
    np.testing.assert_array_equal(got[2], want[2])
    for g, w in zip(got[:2], want[:2]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-5)
    for g, w in zip(got_grads, want_grads):
        assert _relative_error(g, w) < 1e-5
    assert float(jnp.abs(got_grads[1]).max()) > 0


@pytest.mark.parametrize("capacity", [12, 5])
def test_scored_positions_equal_the_whole_rows(capacity):
    """The head on gathered scored positions (capacity 12 holds every row's; 5 does not, and the
    batch takes the whole-row path): the same log-probs and entropies at scored positions, 0 at
    the others, and the same gradients, at T = 0.7, with a segment boundary, padding and a
    scored position that cannot be predicted (a segment's first token)."""
    rng = np.random.default_rng(3)
    batch, length, width, vocab = 2, 30, 16, 96
    hidden = jnp.asarray(rng.normal(size=(batch, length, width)), jnp.float32)
    head = jnp.asarray(rng.normal(size=(width, vocab)), jnp.float32)
    tokens = jnp.asarray(rng.integers(0, vocab, (batch, length)))
    segments = jnp.asarray([[1] * 14 + [2] * 12 + [0] * 4, [5] * 30])
    scored = np.zeros((batch, length), bool)
    scored[0, [3, 4, 5, 14, 15, 20, 27]] = True  # 14: first of segment 2; 27: padding
    scored[1, 2:12] = True
    scored = jnp.asarray(scored)
    weights = [jnp.asarray(rng.normal(size=(batch, length)), jnp.float32) for _ in range(2)]
    kwargs = dict(temperature=0.7, with_entropy=True, seq_block=8, vocab_block=20)

    def objective(values):
        return jnp.sum(values[0] * weights[0]) + jnp.sum(values[1] * weights[1])

    def whole(hidden, head):
        logp, entropy, predictable = logprobs_lib.next_token_logprobs(hidden, head, tokens,
                                                                      segments, **kwargs)
        values = (jnp.where(scored, logp, 0.0), jnp.where(scored, entropy, 0.0), predictable)
        return objective(values), values

    def gathered(hidden, head):
        values = logprobs_lib.scored_next_token_logprobs(hidden, head, tokens, segments, scored,
                                                         capacity, **kwargs)
        return objective(values), values

    (_, want), want_grads = jax.jit(jax.value_and_grad(whole, (0, 1), has_aux=True))(hidden, head)
    (_, got), got_grads = jax.jit(jax.value_and_grad(gathered, (0, 1), has_aux=True))(hidden,
                                                                                     head)
    np.testing.assert_array_equal(got[2], want[2])
    for g, w in zip(got[:2], want[:2]):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), rtol=1e-5, atol=1e-6)
    assert np.all(np.asarray(got[0])[~np.asarray(scored & want[2])] == 0)
    assert np.count_nonzero(np.asarray(got[0])) == int(jnp.sum(scored & want[2])) == 15
    for g, w in zip(got_grads, want_grads):
        assert _relative_error(g, w) < 1e-5


def test_scored_capacity_is_a_quarter_row_of_whole_tiles():
    assert loss_lib.scored_capacity(1024) == 256
    assert loss_lib.scored_capacity(40960) == 10240
    assert loss_lib.scored_capacity(1000) == 256
    assert loss_lib.scored_capacity(40) == 40  # short rows: the whole row


def test_vocab_blocks_divide_the_vocabulary():
    assert logprobs_lib.vocab_block_count(151936) == 32  # 32 blocks of 4,748 columns
    assert logprobs_lib.vocab_block_count(128, 64) == 2
    assert logprobs_lib.vocab_block_count(97, 10) == 97  # a prime: one column per block
    assert logprobs_lib.vocab_block_count(100, 1000) == 1


def _packed_batch(rng, rows, length, vocab):
    segments = np.zeros((rows, length), np.int32)
    segments[:, : length - 5] = 1
    segments[0, 12: length - 5] = 2
    positions = np.where(segments > 0, np.arange(length)[None], 0).astype(np.int32)
    f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
    mask = (segments > 0).astype(np.float32)
    mask[:, 0] = 0
    return PackedBatch(
        tokens=jnp.asarray(rng.integers(1, vocab, (rows, length)), jnp.int32),
        positions=jnp.asarray(positions), segment_ids=jnp.asarray(segments),
        role_ids=jnp.asarray(rng.integers(0, 2, (rows, length)), jnp.int32), loss_mask=f32(mask),
        advantages=f32(rng.choice([-1.0, 1.0], (rows, 1)) * np.ones((1, length))),
        old_logprobs=f32(-rng.uniform(2, 6, (rows, length))),
        loss_weights=f32(mask / mask.sum()), rollout_ids=jnp.zeros((rows, length), jnp.int32),
        ref_logprobs=f32(-rng.uniform(2, 6, (rows, length))))


def test_model_objective_equals_policy_loss_on_dense_logits():
    """What the train step differentiates (blockwise, from hidden states) against the dense
    objective on the model's logits, with KL and entropy terms on and T = 0.7."""
    config = DecoderConfig(vocab_size=160, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=8,
                         tie_word_embeddings=True)
    graphdef, params = nnx.split(CausalLM(config, rngs=nnx.Rngs(1)))
    batch = _packed_batch(np.random.default_rng(2), 2, 40, config.vocab_size)
    loss_config = default_loss(kl_coef=0.05, kl_type="low_var_kl", entropy_coef=0.01)

    def dense(params):
        model = nnx.merge(graphdef, params)
        logits = model(batch.tokens, batch.positions, batch.segment_ids)
        return loss_lib.policy_loss(logits, batch, loss_config, temperature=0.7)

    def blocked(params):
        return loss_lib.model_objective(nnx.merge(graphdef, params), batch, loss_config,
                                        temperature=0.7, seq_block=16, vocab_block=40)

    (want, want_sums), want_grads = jax.jit(jax.value_and_grad(dense, has_aux=True))(params)
    (got, got_sums), got_grads = jax.jit(jax.value_and_grad(blocked, has_aux=True))(params)
    np.testing.assert_allclose(got, want, rtol=1e-5)
    for key in want_sums:
        np.testing.assert_allclose(got_sums[key], want_sums[key], rtol=1e-5, atol=1e-6,
                                   err_msg=key)
    for g, w in zip(jax.tree.leaves(got_grads), jax.tree.leaves(want_grads)):
        assert _relative_error(g, w) < 1e-5


def test_compiled_loss_never_holds_the_logits():
    """Compiled fwd+bwd of the objective at vocab 16,384: its temporaries are a small fraction
    of the [rows, T, vocab] float32 logits the dense path holds (more than once, with
    gradients)."""
    config = DecoderConfig(vocab_size=16384, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2,
                         head_dim=8, tie_word_embeddings=True)
    rows, length = 2, 512
    graphdef, params = nnx.split(nnx.eval_shape(lambda: CausalLM(config,
                                                                         rngs=nnx.Rngs(0))))
    batch = jax.eval_shape(lambda: _packed_batch(np.random.default_rng(0), rows, length, 100))
    logits_bytes = rows * length * config.vocab_size * 4

    def temp_bytes(fn):
        grad = jax.jit(jax.grad(lambda p, b: fn(p, b)[0]))
        return grad.lower(params, batch).compile().memory_analysis().temp_size_in_bytes

    blocked = temp_bytes(lambda p, b: loss_lib.model_objective(
        nnx.merge(graphdef, p), b, default_loss(), seq_block=64, vocab_block=1024))
    dense = temp_bytes(lambda p, b: loss_lib.policy_loss(
        nnx.merge(graphdef, p)(b.tokens, b.positions, b.segment_ids), b, default_loss()))
    print(f"\ntemporaries: blocked {blocked / 2**20:.1f} MiB, dense {dense / 2**20:.1f} MiB, "
          f"logits {logits_bytes / 2**20:.1f} MiB")
    assert dense >= logits_bytes
    assert blocked < logits_bytes / 4
