"""Per-role sampling (docs/METHOD.md section 2.10): planner and worker slots of ONE decode batch
sample with their own temperature, top-p and stop ids, record log-probs at their own
temperature, and the trainer recomputes each at its own (ratio 1)."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from matpo_jax.agents import rollout as rollout_lib
from matpo_jax.config import RolloutSection
from matpo_jax.sampler.host_protocol import STOP_EOS, STOP_TURN_CAP
from matpo_jax.sampler.loop import Sampling, _slot_loop, run_slots
from matpo_jax.sampler.ops import sample_tokens, sample_tokens_per_row
from matpo_jax.trainer import logprobs as logprobs_lib
from matpo_jax.trainer import loss as loss_lib
from matpo_jax.trainer import packing
from fixtures.losses import default_loss
from fixtures.profiled_host import ProfiledHost

PLANNER_T = 1.5
PROMPTS = [[4, 4, 1], [60, 2, 33, 12, 5], [11, 3]]
ROLES = [0, 1, 0]  # prompt 1 decodes as a worker (profile 1, greedy), the others as planners


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_per_row_sampling_equals_each_profiles_own():
    logits = jax.random.normal(jax.random.key(0), (6, 50)) * 3
    keys = jax.random.split(jax.random.key(1), 6)
    profiles = (Sampling(temperature=0.7, top_p=0.8), Sampling(temperature=0.0),
                Sampling(temperature=1.3))
    ids = jnp.asarray([0, 1, 2, 0, 1, 2])
    tokens, logprobs = sample_tokens_per_row(logits, keys, profiles, ids)
    for row, p in enumerate(np.asarray(ids)):
        own_tokens, own_logprobs = sample_tokens(logits, keys, profiles[p])
        assert int(tokens[row]) == int(own_tokens[row])
        np.testing.assert_allclose(float(logprobs[row]), float(own_logprobs[row]), rtol=1e-6)
    with pytest.raises(ValueError, match="top_k"):
        sample_tokens_per_row(logits, keys, (Sampling(top_k=5), Sampling()), ids)


@pytest.fixture(scope="module")
def mixed_batch(split_model, scripted_host, shapes, greedy_reference):
    graphdef, state = split_model
    # The worker's stop id: the first token it will pick greedily, so its first turn is 1 token.
    worker_stop = greedy_reference(PROMPTS[1], 1)[0]
    host = scripted_host(PROMPTS, shapes.slots, turns=2, streams=[10, 11, 12])
    run_slots(state, graphdef, ProfiledHost(host, ROLES), slots=shapes.slots,
              max_len=shapes.max_len,
              sampling=Sampling(temperature=PLANNER_T, max_turn_tokens=shapes.max_turn),
              more_profiles=[(Sampling(temperature=0.0, max_turn_tokens=shapes.max_turn),
                              {worker_stop: STOP_EOS})], rng=jax.random.key(4))
    return host, worker_stop


def test_worker_slot_is_greedy_while_planner_slots_sample(mixed_batch, full_logits):
    host, worker_stop = mixed_batch
    sampled_off_argmax = 0
    for seq, (tokens, trainable, logprobs) in enumerate(
            zip(host.tokens, host.trainable, host.logprobs)):
        logits = full_logits(tokens)
        temperature = PLANNER_T if ROLES[seq] == 0 else 1.0  # greedy records T = 1
        reference = log_softmax(logits / temperature)
        for i in np.flatnonzero(trainable):
            assert abs(logprobs[i] - reference[i - 1, tokens[i]]) < 1e-4, (seq, i)
            is_argmax = tokens[i] == int(np.argmax(logits[i - 1]))
            if ROLES[seq] == 1:
                assert is_argmax, (seq, i)
            else:
                sampled_off_argmax += not is_argmax
    assert sampled_off_argmax > 0  # the planners really sampled at their temperature
    # The worker's own stop id ended its first turn after one token; planners stop on theirs only.
    assert host.stop_reasons[1][0] == STOP_EOS and host.trainable[1].count(True) >= 1
    first_turn = host.tokens[1][len(PROMPTS[1]):len(PROMPTS[1]) + 1]
    assert first_turn == [worker_stop]
    assert all(r in (STOP_TURN_CAP, STOP_EOS) for r in host.stop_reasons[0])


def test_trainer_recomputes_each_role_at_its_own_temperature(mixed_batch, tiny_model):
    host, _ = mixed_batch
    seqs = [packing.TrainSequence(tokens=np.asarray(t, np.int32), trainable=np.asarray(m, bool),
                                  old_logprobs=np.asarray(lp, np.float32), advantage=1.0,
                                  role_id=ROLES[i], rollout_id=i, group_id=i)
            for i, (t, m, lp) in enumerate(zip(host.tokens, host.trainable, host.logprobs))]
    batch = packing.pack_sequences(seqs, 64, rows=2, loss_config=default_loss())
    temperature = loss_lib.role_temperatures(jnp.asarray(batch.role_ids), PLANNER_T, 1.0)
    logits = tiny_model(jnp.asarray(batch.tokens), jnp.asarray(batch.positions),
                        jnp.asarray(batch.segment_ids))
    dense, _, _ = loss_lib.token_logprobs(logits, jnp.asarray(batch.tokens),
                                          jnp.asarray(batch.segment_ids), temperature=temperature)
    blocked, _, _ = logprobs_lib.score_tokens(tiny_model, jnp.asarray(batch.tokens),
                                              jnp.asarray(batch.positions),
                                              jnp.asarray(batch.segment_ids),
                                              temperature=temperature)
    mask = batch.loss_mask > 0
    assert mask.sum() > 0 and (batch.role_ids[mask] == 1).any()
    np.testing.assert_allclose(np.asarray(dense)[mask], batch.old_logprobs[mask], atol=1e-4)
    np.testing.assert_allclose(np.asarray(blocked)[mask], batch.old_logprobs[mask], atol=1e-4)
    # One temperature for both roles would not reproduce the worker's (greedy, T = 1) log-probs.
    single, _, _ = loss_lib.token_logprobs(logits, jnp.asarray(batch.tokens),
                                           jnp.asarray(batch.segment_ids), temperature=PLANNER_T)
    worker = mask & (batch.role_ids == 1)
    assert np.abs(np.asarray(single)[worker] - batch.old_logprobs[worker]).max() > 1e-2


def test_engine_profiles(chat_format):
    base = RolloutSection()
    # Workers get profile 1 even with the planner's settings (one loop for eval and rollouts).
    planner, planner_stops, ((worker, worker_stops),) = rollout_lib.sampling_profiles(
        base, chat_format)
    assert worker.replace(max_turn_tokens=planner.max_turn_tokens) == planner
    assert worker_stops == planner_stops
    own = dataclasses.replace(base, worker_temperature=0.0, worker_max_new_tokens_per_turn=64)
    planner, _, more = rollout_lib.sampling_profiles(own, chat_format)
    (worker, _), = more
    assert planner.temperature == 1.0 and worker.is_greedy and worker.max_turn_tokens == 64
    assert own.turn_buffer == 256 and own.worker_turn_tokens == 64
    word = chat_format.decode([chat_format.encode("done")[0]])
    stops = dataclasses.replace(base, worker_stop_words=(word,))
    (_, worker_stops), = rollout_lib.sampling_profiles(stops, chat_format)[2]
    assert chat_format.encode(word)[0] in worker_stops
    with pytest.raises(ValueError, match="rollout.stop_words"):
        rollout_lib.sampling_profiles(dataclasses.replace(base, stop_words=("two words here",)),
                                      chat_format)


def test_greedy_and_sampled_calls_of_one_shape_share_one_compiled_loop(
        split_model, scripted_host, shapes, greedy_reference):
    """Temperatures are operands: evaluation (greedy) after rollouts (sampled) in one process
    compiles nothing more, and its tokens are still the greedy ones. (A loop with host callbacks
    is never in JAX's persistent cache: each compile is paid again by every process.)"""
    graphdef, state = split_model
    prompts = [[9, 3, 14], [2, 70]]
    kwargs = dict(slots=shapes.slots, max_len=shapes.max_len, rng=jax.random.key(7),
                  more_profiles=[(Sampling(temperature=0.9, top_p=0.7,
                                           max_turn_tokens=shapes.max_turn), {5: STOP_EOS})])
    run_slots(state, graphdef, scripted_host(prompts, shapes.slots, turns=1),
              sampling=Sampling(temperature=1.3, top_p=0.9, max_turn_tokens=shapes.max_turn),
              **kwargs)
    compiled = _slot_loop._cache_size()
    greedy_host = scripted_host(prompts, shapes.slots, turns=1)
    greedy_kwargs = dict(kwargs, more_profiles=[(Sampling(temperature=0.0, top_p=0.7,
                                                          max_turn_tokens=shapes.max_turn),
                                                 {5: STOP_EOS})])
    run_slots(state, graphdef, greedy_host,
              sampling=Sampling(temperature=0.0, top_p=0.9, max_turn_tokens=shapes.max_turn),
              **greedy_kwargs)
    assert _slot_loop._cache_size() == compiled
    for prompt, tokens in zip(prompts, greedy_host.tokens):
        turn = tokens[len(prompt):]
        assert turn == greedy_reference(prompt, len(turn)), prompt
