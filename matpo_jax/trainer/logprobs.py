"""Token log-probs straight from the final hidden states, without the [rows, T, vocab] logits.

The lm-head matmul and the log-softmax run per sequence block of `seq_block` positions, and within
it per vocabulary block, with a running (online) logsumexp; the target token's logit is picked
from the block that holds it. A custom VJP recomputes each block's logits in the backward, so
neither pass keeps more than one [rows, seq_block, vocab_block] float32 tile of logits. At Qwen3's
151,936-entry vocabulary and 40,960-token rows that is the difference between ~25 GB of float32
logits per row and a few MB.

Vocabulary blocks are strided, not contiguous: block j holds the columns v with v % n == j (n
blocks). A vocabulary axis sharded over devices in contiguous chunks then stays evenly sharded in
every block, so no block has to be gathered onto one device. Columns enter a log-softmax in any
order, so this changes only float summation order.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

SEQ_BLOCK = 1024  # positions per sequence block
VOCAB_BLOCK = 8192  # largest vocabulary block; the actual one divides the vocabulary


def vocab_block_count(vocab: int, max_block: int = VOCAB_BLOCK) -> int:
    """The fewest strided blocks of at most `max_block` columns that split `vocab` evenly (e.g.
    151,936 = 32 blocks of 4,748)."""
    for count in range(max(1, -(-vocab // max_block)), vocab + 1):
        if vocab % count == 0:
            return count
    return vocab


def _block_logits(hidden, head_block, temperature):
    """hidden [B, S, H] @ head_block [H, Vb] in float32, divided by the sampling temperature."""
    logits = jax.lax.dot_general(hidden, head_block, (((2,), (0,)), ((), ())),
                                 preferred_element_type=jnp.float32)
    return logits / temperature if temperature != 1.0 else logits


def _split(hidden, head, targets, seq_block, blocks):
    """[B, T, H] -> [nS, B, S, H]; [H, V] -> [H, Vb, n] (block j = [:, :, j]); targets ->
    ([nS, B, S] block index, [nS, B, S] column within the block)."""
    batch, length, width = hidden.shape
    to_blocks = lambda x: jnp.moveaxis(  # noqa: E731
        x.reshape(batch, length // seq_block, seq_block, *x.shape[2:]), 1, 0)
    head3 = head.reshape(head.shape[0], head.shape[1] // blocks, blocks)
    return to_blocks(hidden), head3, to_blocks(targets % blocks), to_blocks(targets // blocks)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5, 6, 7))
def _blocked_log_softmax(hidden, head, targets, temperature, with_entropy, entropy_gradient,
                         seq_block, blocks):
    return _blocked_fwd(hidden, head, targets, temperature, with_entropy, entropy_gradient,
                        seq_block, blocks)[0]


def _blocked_fwd(hidden, head, targets, temperature, with_entropy, entropy_gradient, seq_block,
                 blocks):
    batch, length, _ = hidden.shape
    hidden_blocks, head3, target_block, target_column = _split(hidden, head, targets, seq_block,
                                                               blocks)

    def sequence_block(_, xs):
        h, t_block, t_column = xs

        def vocab_block(carry, j):
            running_max, total, weighted, target_logit = carry
            logits = _block_logits(h, jax.lax.dynamic_index_in_dim(head3, j, 2, False),
                                   temperature)
            new_max = jnp.maximum(running_max, jnp.max(logits, axis=-1))
            correction = jnp.exp(running_max - new_max)
            weights = jnp.exp(logits - new_max[..., None])
            total = total * correction + jnp.sum(weights, axis=-1)
            if with_entropy:  # sum of exp(l - max) * l, for E_p[l]
                weighted = weighted * correction + jnp.sum(weights * logits, axis=-1)
            picked = jnp.take_along_axis(logits, t_column[..., None], axis=-1)[..., 0]
            target_logit = jnp.where(t_block == j, picked, target_logit)
            return (new_max, total, weighted, target_logit), None

        zeros = jnp.zeros(h.shape[:2], jnp.float32)
        init = (jnp.full(h.shape[:2], -jnp.inf, jnp.float32), zeros, zeros, zeros)
        (running_max, total, weighted, target_logit), _ = jax.lax.scan(
            vocab_block, init, jnp.arange(blocks))
        log_norm = running_max + jnp.log(total)
        entropy = log_norm - weighted / total if with_entropy else zeros
        return None, (target_logit - log_norm, entropy, log_norm)

    _, (logp, entropy, log_norm) = jax.lax.scan(
        sequence_block, None, (hidden_blocks, target_block, target_column))
    unblock = lambda x: jnp.moveaxis(x, 0, 1).reshape(batch, length)  # noqa: E731
    logp, entropy, log_norm = unblock(logp), unblock(entropy), unblock(log_norm)
    return (logp, entropy), (hidden, head, targets, log_norm, entropy)


def _blocked_bwd(temperature, with_entropy, entropy_gradient, seq_block, blocks, residuals,
                 cotangents):
    hidden, head, targets, log_norm, entropy = residuals
    d_logp, d_entropy = cotangents
    batch, length, width = hidden.shape
    hidden_blocks, head3, target_block, target_column = _split(hidden, head, targets, seq_block,
                                                               blocks)
    to_blocks = lambda x: jnp.moveaxis(x.reshape(batch, -1, seq_block), 1, 0)  # noqa: E731
    block_width = head3.shape[1]

    def sequence_block(d_head, xs):
        h, t_block, t_column, norm, ent, g_logp, g_ent = xs

        def vocab_block(carry, j):
            d_h, d_head = carry
            head_j = jax.lax.dynamic_index_in_dim(head3, j, 2, False)
            logits = _block_logits(h, head_j, temperature)
            probs = jnp.exp(logits - norm[..., None])
            is_target = ((jnp.arange(block_width) == t_column[..., None])
                         & (t_block == j)[..., None])
            # d log p[target] / d logits = onehot - p
            d_logits = g_logp[..., None] * (is_target.astype(jnp.float32) - probs)
            if entropy_gradient:  # d H / d l_k = -p_k (log p_k + H)
                d_logits = d_logits - g_ent[..., None] * probs * (
                    logits - norm[..., None] + ent[..., None])
            d_logits = (d_logits / temperature).astype(h.dtype)
            d_h = d_h + jax.lax.dot_general(d_logits, head_j, (((2,), (1,)), ((), ())),
                                            preferred_element_type=jnp.float32)
            d_head_j = jax.lax.dot_general(h, d_logits, (((0, 1), (0, 1)), ((), ())),
                                           preferred_element_type=jnp.float32)
            d_head = jax.lax.dynamic_update_index_in_dim(
                d_head, jax.lax.dynamic_index_in_dim(d_head, j, 0, False) + d_head_j, j, 0)
            return (d_h, d_head), None

        (d_h, d_head), _ = jax.lax.scan(
            vocab_block, (jnp.zeros(h.shape, jnp.float32), d_head), jnp.arange(blocks))
        return d_head, d_h

    d_head = jnp.zeros((blocks, width, block_width), jnp.float32)  # block-major accumulator
    d_head, d_hidden = jax.lax.scan(
        sequence_block, d_head,
        (hidden_blocks, target_block, target_column, to_blocks(log_norm), to_blocks(entropy),
         to_blocks(d_logp.astype(jnp.float32)), to_blocks(d_entropy.astype(jnp.float32))))
    d_hidden = jnp.moveaxis(d_hidden, 0, 1).reshape(hidden.shape)
    d_head = jnp.transpose(d_head, (1, 2, 0)).reshape(head.shape)  # [H, Vb, n] -> [H, V]
    return d_hidden.astype(hidden.dtype), d_head.astype(head.dtype), None


_blocked_log_softmax.defvjp(_blocked_fwd, _blocked_bwd)


def target_logprobs(hidden: jax.Array, head: jax.Array, targets: jax.Array, *,
                    temperature: float = 1.0, with_entropy: bool = False,
                    entropy_gradient: bool = True, seq_block: int = SEQ_BLOCK,
                    vocab_block: int = VOCAB_BLOCK):
    """log softmax(hidden @ head / temperature)[targets] and the entropy of that distribution
    (zeros unless with_entropy), both [B, T] float32, computed blockwise. With
    entropy_gradient=False the entropy is a metric only (no gradient; its backward terms are
    skipped).

    hidden [B, T, H] and head [H, V] in the compute dtype; the matmul accumulates in float32, as
    `CausalLM.logits_from_hidden` does. A length that `seq_block` does not divide is
    padded (the padded positions are computed and dropped)."""
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0 for log-probs, got {temperature}")
    batch, length, _ = hidden.shape
    seq_block = min(seq_block, length)
    padded = -(-length // seq_block) * seq_block
    if padded != length:
        hidden = jnp.pad(hidden, ((0, 0), (0, padded - length), (0, 0)))
        targets = jnp.pad(targets, ((0, 0), (0, padded - length)))
    blocks = vocab_block_count(head.shape[1], vocab_block)
    entropy_gradient = bool(with_entropy and entropy_gradient)
    logp, entropy = _blocked_log_softmax(hidden, head, targets.astype(jnp.int32),
                                         float(temperature), bool(with_entropy), entropy_gradient,
                                         seq_block, blocks)
    if not entropy_gradient:
        entropy = jax.lax.stop_gradient(entropy)
    return logp[:, :length], entropy[:, :length]


def next_token_logprobs(hidden: jax.Array, head: jax.Array, tokens: jax.Array,
                        segment_ids: jax.Array, *, temperature: float = 1.0,
                        with_entropy: bool = False, entropy_gradient: bool = True,
                        seq_block: int = SEQ_BLOCK, vocab_block: int = VOCAB_BLOCK):
    """`loss.token_logprobs` from hidden states: (log p(tokens[t] | prefix), entropy of the
    predicting distribution, predictable mask), each [B, T], with position t predicted from the
    hidden state at t - 1 and scored only when t - 1 lies in the same non-padding segment (0
    elsewhere)."""
    targets = jnp.pad(tokens[:, 1:], ((0, 0), (0, 1)))  # position t predicts tokens[t + 1]
    logp, entropy = target_logprobs(hidden, head, targets, temperature=temperature,
                                    with_entropy=with_entropy,
                                    entropy_gradient=entropy_gradient, seq_block=seq_block,
                                    vocab_block=vocab_block)
    predictable = predictable_positions(segment_ids)
    shift = lambda x: jnp.pad(x[:, :-1], ((0, 0), (1, 0)))  # noqa: E731  value at t from t - 1
    return (jnp.where(predictable, shift(logp), 0.0), jnp.where(predictable, shift(entropy), 0.0),
            predictable)


def predictable_positions(segment_ids: jax.Array) -> jax.Array:
    """[B, T] bool: position t can be scored, t - 1 lying in the same non-padding segment."""
    same = (segment_ids[:, 1:] == segment_ids[:, :-1]) & (segment_ids[:, 1:] > 0)
    return jnp.pad(same, ((0, 0), (1, 0)))


def scored_next_token_logprobs(hidden: jax.Array, head: jax.Array, tokens: jax.Array,
                               segment_ids: jax.Array, scored: jax.Array, capacity: int, *,
                               temperature: float = 1.0, with_entropy: bool = False,
                               entropy_gradient: bool = True, seq_block: int = SEQ_BLOCK,
                               vocab_block: int = VOCAB_BLOCK):
    """`next_token_logprobs` at the `scored` positions ([B, T] bool) only, 0 elsewhere.

    A loss reads the log-probs of its trained tokens alone (an SFT row trains ~15% of its
    positions, an RL row the sampled turns, not the prompts and tool responses), yet the output
    head and its log-softmax cost as much per position as a decoder layer. Here each row's scored
    positions are gathered first (in order, `capacity` slots a row) and only the hidden states
    that predict them go through the head. A batch with a row of more than `capacity` scored
    positions takes the whole-row path instead (a `lax.cond`), so the values never depend on the
    capacity; either way they equal `next_token_logprobs` up to float summation order."""
    batch, length, _ = hidden.shape
    predictable = predictable_positions(segment_ids)
    wanted = scored & predictable
    counts = jnp.sum(wanted, axis=1)
    capacity = min(capacity, length)
    kwargs = dict(temperature=temperature, with_entropy=with_entropy,
                  entropy_gradient=entropy_gradient, vocab_block=vocab_block)

    def gathered(_):
        # The scored positions first, in order; the rest of the slots hold unscored ones.
        order = jnp.argsort(~wanted, axis=1, stable=True)[:, :capacity]
        used = jnp.arange(capacity)[None] < counts[:, None]
        source = jnp.maximum(order - 1, 0)  # position t is predicted by the state at t - 1
        logp, entropy = target_logprobs(
            jnp.take_along_axis(hidden, source[..., None], axis=1), head,
            jnp.take_along_axis(tokens, order, axis=1), seq_block=min(seq_block, capacity),
            **kwargs)
        rows = jnp.arange(batch)[:, None]
        place = lambda x: jnp.zeros((batch, length), jnp.float32).at[rows, order].set(  # noqa: E731
            jnp.where(used, x, 0.0))
        return place(logp), place(entropy)

    def whole_rows(_):
        logp, entropy, _ = next_token_logprobs(hidden, head, tokens, segment_ids,
                                               seq_block=seq_block, **kwargs)
        return jnp.where(wanted, logp, 0.0), jnp.where(wanted, entropy, 0.0)

    logp, entropy = jax.lax.cond(jnp.all(counts <= capacity), gathered, whole_rows, None)
    return logp, entropy, predictable


def score_tokens(model, tokens: jax.Array, positions: jax.Array, segment_ids: jax.Array, *,
                 temperature: float = 1.0, with_entropy: bool = False,
                 entropy_gradient: bool = True, remat: str = "none", scan_layers: bool = False,
                 seq_block: int = SEQ_BLOCK, vocab_block: int = VOCAB_BLOCK,
                 scored: jax.Array | None = None, scored_capacity: int | None = None,
                 prefix_ids: jax.Array | None = None, roles: jax.Array | None = None):
    """`next_token_logprobs` of packed rows under a `CausalLM`: its decoder (with the
    `remat` policy per layer, optionally scanned), then the blockwise log-softmax of its output
    head. For the train step, and for reference-policy log-probs at the sampling temperature.
    scored: [B, T] bool, the positions the caller reads (the others are returned as 0): the head
    then runs on those only (`scored_next_token_logprobs`, scored_capacity slots a row).
    prefix_ids: rows whose sequences share a prompt segment (packing.PackedBatch.prefix_ids).
    roles: [B, T] role ids, each token's LoRA adapter (model/lora.py; ignored without adapters)."""
    hidden = model.hidden_states(tokens, positions, segment_ids, remat=remat,
                                 scan_layers=scan_layers, prefix_ids=prefix_ids, roles=roles)
    if not isinstance(temperature, (int, float)):
        # One temperature per position ([B, T], e.g. planner and worker rows sampled at their own):
        # logits / T_t = (hidden_t / T_t) @ head, so the blockwise kernel runs at 1.
        hidden = (hidden.astype(jnp.float32) / temperature[..., None]).astype(hidden.dtype)
        temperature = 1.0
    kwargs = dict(temperature=temperature, with_entropy=with_entropy,
                  entropy_gradient=entropy_gradient, seq_block=seq_block, vocab_block=vocab_block)
    head = model.head_kernel(hidden.dtype)
    if scored is None:
        return next_token_logprobs(hidden, head, tokens, segment_ids, **kwargs)
    return scored_next_token_logprobs(hidden, head, tokens, segment_ids, scored,
                                      scored_capacity or tokens.shape[1], **kwargs)
