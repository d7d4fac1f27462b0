"""How many decode slots fit a per-chip budget: the KV-cache arithmetic (dense, and a paged pool)
and the start-up errors."""
import pytest

from matpo_jax.model import DecoderConfig
from matpo_jax.sampler.capacity import (DecodeSlotsError, check_decode_slots, check_paged_pool,
                                        decode_slot_budget, kv_bytes_per_slot, page_bytes,
                                        paged_mesh_refusal)

# Qwen3-4B: 36 layers, 8 kv heads of 128, vocabulary 151,936; the cache in bfloat16.
QWEN3_4B = DecoderConfig(vocab_size=151936, hidden_size=2560, intermediate_size=9728,
                       num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                       head_dim=128, dtype="bfloat16")
GIB = 2**30


def test_kv_bytes_per_slot_is_layers_heads_dim_len_kv_dtype_over_tensor():
    whole = 36 * 8 * 128 * 40960 * 2 * 2
    assert kv_bytes_per_slot(QWEN3_4B, 40960) == whole == 6_039_797_760  # 5.6 GiB per slot
    assert kv_bytes_per_slot(QWEN3_4B, 40960, tensor=8) == whole // 8
    assert kv_bytes_per_slot(QWEN3_4B, 40960, tensor=4, dtype="float32") == whole // 4 * 2
    # 3 does not divide 8 kv heads: every tensor shard holds them all (parallel.fit_spec).
    assert kv_bytes_per_slot(QWEN3_4B, 40960, tensor=3) == whole


def test_slots_that_fit_a_v5e_64_at_the_paper_context():
    # v5e-64 as data 8 x tensor 8, 8 GiB per chip left for the sampler.
    budget = decode_slot_budget(QWEN3_4B, 40960, 8 * GIB, data=8, tensor=8, max_turn=8192)
    per_slot = 36 * 1 * 128 * 40960 * 2 * 2 + 4 * 151936 + 8 * 8192
    assert budget.bytes_per_slot == per_slot
    assert budget.slots_per_chip == 8 * GIB // per_slot == 11
    assert budget.slots_that_fit == 88
    assert check_decode_slots(88, QWEN3_4B, 40960, 8 * GIB, data=8, tensor=8,
                              max_turn=8192) == budget


def test_too_many_slots_is_one_clear_error():
    with pytest.raises(DecodeSlotsError, match=r"^rollout\.decode_slots=512 does not fit: only "
                       r"88 decode slots fit \(11 per chip x 8 data x fsdp shards\); one slot "
                       r"needs 720\.6 MiB per chip \(KV cache 36 layers x 1 kv heads x 128 x "
                       r"max_len 40960 x 2 x 2 bytes = 720\.0 MiB\)"):
        check_decode_slots(512, QWEN3_4B, 40960, 8 * GIB, data=8, tensor=8, max_turn=8192)


def test_slots_that_do_not_split_over_the_batch_shards_are_rejected():
    with pytest.raises(DecodeSlotsError, match=r"decode_slots=100 is not a multiple of mesh "
                                               r"data x fsdp = 8"):
        check_decode_slots(100, QWEN3_4B, 4096, 8 * GIB, data=2, fsdp=4, tensor=1)


def test_a_paged_pool_costs_its_pages_whatever_the_slots():
    # Qwen3-4B over tensor 8: a 64-token page of every layer's K and V is 1.1 MiB a chip.
    page = 36 * 1 * 128 * 64 * 2 * 2
    assert page_bytes(QWEN3_4B, 64, tensor=8) == page
    # 64 slots at the paper's 40,960-token context, a pool for a mean 4,096 tokens a slot.
    pages = 64 * 4096 // 64
    budget = check_paged_pool(64, QWEN3_4B, 40960, 8 * GIB, pages=pages, page_size=64, tensor=8,
                              max_turn=8192)
    assert budget.kv_bytes_per_slot == pages * page // 64  # the pool's mean a slot
    assert budget.other_bytes_per_slot == 4 * 151936 + 8 * 8192 + 4 * (40960 // 64 + 1)
    assert budget.slots_that_fit == 8 * GIB // budget.bytes_per_slot == 112
    # The dense cache at the same context: 11 slots a chip.
    assert decode_slot_budget(QWEN3_4B, 40960, 8 * GIB, tensor=8).slots_per_chip == 11
    with pytest.raises(DecodeSlotsError, match=r"^rollout\.kv_pages=8192 does not fit: a pool of "
                       r"8192 pages needs 9,216\.0 MiB per chip \(a page is 36 layers x 1 kv "
                       r"heads x 128 x 64 tokens x 2 x 2 bytes = 1\.1 MiB\)"):
        check_paged_pool(64, QWEN3_4B, 40960, 8 * GIB, pages=8192, page_size=64, tensor=8)


def test_a_paged_cache_splits_over_batch_shards_only_in_whole_pools():
    assert paged_mesh_refusal(6, 10, 1) is None
    assert paged_mesh_refusal(8, 64, 4) is None and paged_mesh_refusal(8, 0, 4) is None
    assert paged_mesh_refusal(6, 64, 4).startswith(
        "rollout.kv_cache=paged keeps a pool per batch shard and 6 decode slots do not split "
        "over data x fsdp = 4")
    assert paged_mesh_refusal(8, 66, 4).startswith(
        "rollout.kv_pages=66 does not split over data x fsdp = 4 pools")


def test_a_pool_per_batch_shard_puts_a_shards_pages_and_slots_on_each_chip():
    """64 slots over 4 batch shards with 4 x 1,024 pages: a chip holds 1,024 pages and 16
    slots' buffers, the same mean pool share a slot as one pool of 1,024 pages for 16 slots."""
    sharded = check_paged_pool(64, QWEN3_4B, 40960, 8 * GIB, pages=4096, page_size=64, tensor=8,
                               batch_shards=4)
    one_pool = check_paged_pool(16, QWEN3_4B, 40960, 8 * GIB, pages=1024, page_size=64,
                                tensor=8)
    assert sharded.kv_bytes_per_slot == one_pool.kv_bytes_per_slot
    assert sharded.slots_that_fit == 4 * one_pool.slots_that_fit
    with pytest.raises(DecodeSlotsError, match=r"a pool of 8192 pages \(one of 4 batch shards' "
                                               r"pools, 32768 pages in all\) needs 9,216\.0 MiB"):
        check_paged_pool(64, QWEN3_4B, 40960, 8 * GIB, pages=32768, page_size=64, tensor=8,
                         batch_shards=4)
