"""The slot loop over a mesh: the KV cache split over slots (data x fsdp) and kv heads (tensor)
decodes exactly what the unsharded loop decodes, and no device holds the whole cache; a paged
cache split over kv heads, and one with a pool per batch shard, do the same."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from matpo_jax import parallel
from matpo_jax.sampler.host_protocol import SlotProtocolError
from matpo_jax.sampler.loop import PagedCache, mesh_of, run_slots
from matpo_jax.sampler.writes import pick_lanes


@pytest.fixture(scope="module")
def mesh():
    # 3 slots over fsdp=3, the tiny model's 2 kv heads over tensor=2.
    return parallel.make_mesh(data=1, fsdp=3, tensor=2, devices=jax.devices()[:6])


def _two_turns(state, graphdef, scripted_host, shapes, greedy, **kwargs):
    prompts = [[4, 4, 1], [60, 2, 33, 12, 5, 8, 19], list(range(20, 40)), [90, 91], [45]]
    host = scripted_host(prompts, shapes.slots, chunk=[7, 8, 9, 10, 11, 12, 13], turns=2)
    stats = run_slots(state, graphdef, host, slots=shapes.slots, max_len=shapes.max_len,
                      sampling=greedy, **kwargs)
    return host, stats


def test_sharded_slot_loop_decodes_what_the_unsharded_one_does(
        split_model, scripted_host, shapes, greedy, mesh):
    graphdef, state = split_model
    sharded_state = jax.device_put(state, parallel.param_shardings(state, mesh))
    assert mesh_of(state) is None and mesh_of(sharded_state) == mesh
    reference, _ = _two_turns(state, graphdef, scripted_host, shapes, greedy)
    sharded, stats = _two_turns(sharded_state, graphdef, scripted_host, shapes, greedy)
    assert not stats.hit_limit
    assert sharded.tokens == reference.tokens
    assert sharded.stop_reasons == reference.stop_reasons
    # Tokens are exact; log-probs agree to float32 rounding (heads split over tensor reorder
    # the o_proj sums).
    np.testing.assert_allclose(np.concatenate(sharded.logprobs),
                               np.concatenate(reference.logprobs), rtol=0, atol=1e-5)


def _compiled_loop(split_model, shapes, mesh, paged=None):
    """(the tiny model's config, the slot loop compiled over `mesh` as HLO text)."""
    from matpo_jax.sampler import loop
    graphdef, state = split_model
    buckets = loop.normalize_buckets(None, shapes.max_len)
    args = loop._prefix_arrays((), buckets, shapes.max_len)
    profiles, truncation = loop.profile_settings(
        (loop.Sampling(greedy=True, max_turn_tokens=shapes.max_turn),))
    lowered = loop._slot_loop.lower(
        graphdef, jax.device_put(state, parallel.param_shardings(state, mesh)),
        jax.random.key(0), np.int32(0), np.int32(1), np.int32(1), *args, profiles,
        slots=shapes.slots, max_len=shapes.max_len, max_turn=shapes.max_turn, buckets=buckets,
        lanes=1, truncation=truncation, stop_tables=((),), mesh=mesh, paged=paged)
    return loop.nnx.merge(graphdef, state).config, lowered.compile().as_text()


def test_each_device_holds_its_share_of_the_cache(split_model, shapes, mesh):
    """The partitioned program's cache buffers are per-device shards: [1 slot, 1 kv head, ...]
    and never the whole [3, 2, ...] layer (no gather of the cache onto one device)."""
    config, text = _compiled_loop(split_model, shapes, mesh)
    d, n = config.head_dim, shapes.max_len
    assert f"f32[1,1,{d},{n}]" in text and f"f32[1,1,{n},{d}]" in text  # keys, values shards
    heads = config.num_key_value_heads
    assert f"f32[{shapes.slots},{heads},{d},{n}]" not in text
    assert f"f32[{shapes.slots},{heads},{n},{d}]" not in text


@pytest.fixture(scope="module")
def tensor_mesh():
    # The tiny model's 2 kv heads (and 4 query heads) over tensor=2; no batch split.
    return parallel.make_mesh(data=1, fsdp=1, tensor=2, devices=jax.devices()[:2])


def test_a_paged_cache_over_tensor_decodes_what_the_unsharded_loop_does(
        split_model, scripted_host, shapes, greedy, tensor_mesh):
    graphdef, state = split_model
    paged = PagedCache(page_size=8)
    sharded_state = jax.device_put(state, parallel.param_shardings(state, tensor_mesh))
    reference, _ = _two_turns(state, graphdef, scripted_host, shapes, greedy)
    sharded, stats = _two_turns(sharded_state, graphdef, scripted_host, shapes, greedy,
                                paged=paged)
    assert not stats.hit_limit
    assert sharded.tokens == reference.tokens
    np.testing.assert_allclose(np.concatenate(sharded.logprobs),
                               np.concatenate(reference.logprobs), rtol=0, atol=1e-5)


def test_each_device_holds_its_kv_heads_of_the_page_pool(split_model, shapes, tensor_mesh):
    """The pool [kv_heads, pages, page_size, head_dim] is split on kv heads: each device's buffers
    are [1, pages, ...] and the whole [2, pages, ...] pool appears nowhere in the program."""
    paged = PagedCache(page_size=8)
    config, text = _compiled_loop(split_model, shapes, tensor_mesh, paged)
    pages, d = paged.pool(shapes.slots, 0, shapes.max_len), config.head_dim
    assert f"f32[1,{pages},8,{d}]" in text
    assert f"f32[{config.num_key_value_heads},{pages},8,{d}]" not in text


# A prompt prefix every sequence of the paged tests below starts with, and a longer one.
SYSTEM = [50, 51, 52, 53, 54, 55, 56, 57, 58]
QUESTION = SYSTEM + [60, 61, 62, 63]


def _prefixed_two_turns(state, graphdef, scripted_host, shapes, greedy, **kwargs):
    # Five sequences through three slots: prefixes start re-used slots on every shard.
    prompts = [QUESTION + [70, 71], SYSTEM + [80], [5, 6, 7], QUESTION, SYSTEM + [20, 21, 22]]
    host = scripted_host(prompts, shapes.slots, chunk=[7, 8, 9, 10, 11, 12, 13], turns=2,
                         prefixes=(SYSTEM, QUESTION))
    stats = run_slots(state, graphdef, host, slots=shapes.slots, max_len=shapes.max_len,
                      sampling=greedy, prefixes=host.prefixes, **kwargs)
    return host, stats


def test_a_pool_per_batch_shard_decodes_what_the_unsharded_loop_does(
        split_model, scripted_host, shapes, greedy, mesh):
    """Slots over fsdp=3 with a paged cache: each shard allocates from its own pool and keeps
    its own copy of the prompt prefixes (pages of 4 tokens: the 9- and 13-token prefixes end
    mid-page), and the loop decodes the dense unsharded loop's tokens."""
    graphdef, state = split_model
    sharded_state = jax.device_put(state, parallel.param_shardings(state, mesh))
    reference, _ = _prefixed_two_turns(state, graphdef, scripted_host, shapes, greedy)
    sharded, stats = _prefixed_two_turns(sharded_state, graphdef, scripted_host, shapes, greedy,
                                         paged=PagedCache(page_size=4))
    assert not stats.hit_limit
    assert sorted(sharded.hits) == sorted(reference.hits) and len(sharded.hits) == 4
    assert sharded.tokens == reference.tokens
    assert sharded.stop_reasons == reference.stop_reasons
    np.testing.assert_allclose(np.concatenate(sharded.logprobs),
                               np.concatenate(reference.logprobs), rtol=0, atol=1e-5)


def test_injection_lanes_are_picked_per_shard_in_shard_order():
    """12 rows in 3 shards of 4: each extend takes lanes / 3 pending rows from every shard's
    block, in shard order; an empty lane (row 12, dropped on the way back) reads its own
    shard's last row."""
    pending = jnp.asarray([1, 0, 1, 1, 0, 0, 0, 0, 1, 1, 0, 0], bool)
    rows, gather = pick_lanes(pending, 3, shards=3)
    assert rows.tolist() == [0, 12, 8] and gather.tolist() == [0, 7, 8]
    rows, gather = pick_lanes(pending, 6, shards=3)
    assert rows.tolist() == [0, 2, 12, 12, 8, 9] and gather.tolist() == [0, 2, 7, 7, 8, 9]
    rows, gather = pick_lanes(pending, 3)  # one pool: the first pending rows anywhere
    assert rows.tolist() == [0, 2, 3] and gather.tolist() == [0, 2, 3]


def test_a_pool_per_batch_shard_with_two_slots_a_shard_injects_lane_by_lane(
        split_model, scripted_host, shapes, greedy, mesh):
    """6 slots over fsdp=3 with one lane a shard: injections loop over per-shard lanes (a shard
    with nothing pending fills its lane with an empty row) and decode the unsharded tokens."""
    graphdef, state = split_model
    six = dataclasses.replace(shapes, slots=6)
    sharded_state = jax.device_put(state, parallel.param_shardings(state, mesh))
    reference, _ = _prefixed_two_turns(state, graphdef, scripted_host, six, greedy, lanes=1)
    sharded, _ = _prefixed_two_turns(sharded_state, graphdef, scripted_host, six, greedy,
                                     lanes=3, paged=PagedCache(page_size=4))
    assert sharded.tokens == reference.tokens
    np.testing.assert_allclose(np.concatenate(sharded.logprobs),
                               np.concatenate(reference.logprobs), rtol=0, atol=1e-5)


def test_each_device_holds_its_own_pool(split_model, shapes, mesh):
    """Pages split over fsdp=3 and kv heads over tensor=2: every device's pool buffers are
    [1 kv head, pages / 3, ...]; neither the whole pool nor one shard's all heads appear."""
    paged = PagedCache(page_size=8)
    config, text = _compiled_loop(split_model, shapes, mesh, paged)
    pages, d, heads = paged.pool(shapes.slots, 0, shapes.max_len), config.head_dim, 2
    assert pages % 3 == 0
    assert f"f32[1,{pages // 3},8,{d}]" in text
    for whole in (f"f32[{heads},{pages},8,{d}]", f"f32[1,{pages},8,{d}]",
                  f"f32[{heads},{pages // 3},8,{d}]"):
        assert whole not in text


def test_a_shard_that_runs_out_of_pages_stops_the_loop_with_its_pool_named(
        split_model, scripted_host, shapes, greedy, mesh):
    graphdef, state = split_model
    sharded_state = jax.device_put(state, parallel.param_shardings(state, mesh))
    # 3 pages of 8 tokens a shard: a 20-token prompt and its turns outgrow one shard's pool.
    with pytest.raises(SlotProtocolError, match=r"9 pages of 8 tokens \(3 in each of 3 batch "
                                                r"shards' pools\).*rollout\.kv_pages"):
        _two_turns(sharded_state, graphdef, scripted_host, shapes, greedy,
                   paged=PagedCache(page_size=8, num_pages=9))


def test_a_pool_that_does_not_split_over_the_batch_shards_is_refused(
        split_model, scripted_host, shapes, greedy, mesh):
    graphdef, state = split_model
    sharded_state = jax.device_put(state, parallel.param_shardings(state, mesh))
    with pytest.raises(SlotProtocolError, match=r"rollout\.kv_pages=10 .*data x fsdp = 3"):
        _two_turns(sharded_state, graphdef, scripted_host, shapes, greedy,
                   paged=PagedCache(page_size=8, num_pages=10))
